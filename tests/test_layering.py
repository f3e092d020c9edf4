"""The package layout holds: lower stages never import higher ones, nothing imports in a circle.

Walks the AST of every module of `autoprec/` (imports inside functions count too) and
of `bench/` and `examples/`. A new top-level module or package must be given its
place in `LAYERS` below (and in docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autoprec"

#: Each top-level part of autoprec and its layer; a part imports only lower layers or itself.
LAYERS: dict[str, int] = {
    "errors": 0,
    "_version": 0,
    "_core": 1,
    "_backends": 2,
    "layers": 3,
    "numerics": 3,
    "hardware": 4,
    "profiler": 5,
    "cost": 6,
    "plan": 7,
    "runtime": 8,
    "search": 9,
    "_auto": 10,
    "callback": 11,
    "cli": 12,
    "demo": 12,
    "__main__": 13,
    "__init__": 14,
}

#: Optional heavy dependencies that may be imported lazily, inside functions.
OPTIONAL = ("jax", "matplotlib", "torch")

#: The command line imports its stages inside each command, so that `autoprec --help`
#: starts without loading Keras; its imports still count for layers and cycles.
LAZY_ENTRY_POINTS = ("cli", "__main__")

#: Backend modules, which import their framework at their top.
BACKEND_MODULES = ("autoprec._backends.tensorflow", "autoprec._backends.jax")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not _is_package(path):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, str, int]]:
    """Returns `(imported module, imported name or "", line)` for every import of autoprec."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "autoprec":
                    found.append((alias.name, "", node.lineno))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            if target.split(".")[0] != "autoprec":
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in known:
                    found.append((submodule, "", node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, list[tuple[str, str, int]]]:
    modules = _modules()
    known = set(modules)
    return {module: _imports(module, path, known) for module, path in modules.items()}


def test_every_part_of_the_package_has_a_layer():
    missing = sorted({_part(module) for module in _modules()} - set(LAYERS))
    assert not missing, f"give these parts a layer in LAYERS (and docs/architecture.md): {missing}"


def test_no_module_imports_a_higher_layer():
    upward = []
    for module, imports in _graph().items():
        for target, _, line in imports:
            source_part, target_part = _part(module), _part(target)
            if target_part == "__init__" and source_part != "__init__":
                upward.append(f"{module}:{line} imports the package root")
            elif source_part != target_part and LAYERS[target_part] > LAYERS[source_part]:
                upward.append(f"{module}:{line} imports {target} (layer {LAYERS[target_part]})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = {
        module: sorted({target for target, _, _ in imports if target != module})
        for module, imports in _graph().items()
    }
    state: dict[str, str] = {}
    cycles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for target in graph.get(module, []):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_crosses_a_package_boundary():
    crossing = []
    for module, imports in _graph().items():
        for target, name, line in imports:
            if _part(module) == _part(target):
                continue
            private_module = any(
                segment.startswith("_") and segment != "__init__"
                for segment in target.split(".")[1:]
                if segment not in ("_core", "_backends", "_version", "_auto")
            )
            if name.startswith("_") and name != "__version__" or private_module:
                crossing.append(f"{module}:{line} imports {target} {name}".rstrip())
    assert not crossing, "private names used across packages:\n" + "\n".join(crossing)


@pytest.mark.parametrize("folder", ["bench", "examples"])
def test_benchmarks_and_examples_use_public_names_only(folder):
    private = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autoprec"):
                segments = (node.module or "").split(".")
                names = [alias.name for alias in node.names]
                if any(s.startswith("_") for s in segments) or any(
                    n.startswith("_") for n in names
                ):
                    private.append(f"{path.name}:{node.lineno} from {node.module} import {names}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                value = node.value
                while isinstance(value, ast.Attribute):
                    value = value.value
                if isinstance(value, ast.Name) and value.id == "autoprec":
                    private.append(f"{path.name}:{node.lineno} autoprec...{node.attr}")
    assert not private, f"{folder}/ uses private names:\n" + "\n".join(private)


def test_lazy_imports_are_only_optional_dependencies():
    lazy = []
    for module, path in _modules().items():
        if _part(module) in LAZY_ENTRY_POINTS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.ImportFrom):
                    continue
                target = _resolve(module, path, node)
                names = [f"{target}.{alias.name}" for alias in node.names]
                # A backend module imports its framework (TensorFlow or JAX) at its top:
                # it is loaded only when that backend runs.
                if target.startswith("autoprec") and not all(
                    name.startswith(BACKEND_MODULES) or target.startswith(BACKEND_MODULES)
                    for name in names
                ):
                    lazy.append(f"{module}:{node.lineno} from {target} import ...")
    assert not lazy, (
        "imports of autoprec inside functions (move them to the module top; only "
        f"{', '.join(OPTIONAL)} and the backend modules may be imported lazily):\n"
        + "\n".join(lazy)
    )
