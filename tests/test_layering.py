"""The package layout holds: lower stages never import higher ones, nothing imports in a circle.

Walks the AST of every module of `autoprec/` (imports inside functions count too) and
of `bench/` and `examples/`. A new top-level module or package must be given its
place in `LAYERS` below (and in docs/architecture.md).
"""

from __future__ import annotations

import ast
import re
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
    "decision": 10,
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


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(path, package.parent): path for path in sorted(package.rglob("*.py"))}


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


#: Top-level private parts that the whole package imports: internal by design, not private names.
INTERNAL_PARTS = ("_core", "_backends", "_version")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module_outside_its_package(module: str, target: str) -> bool:
    """Whether `target` has a private segment (`a._b.c`) that `module` is not inside of."""
    segments = target.split(".")
    for index, segment in enumerate(segments[1:], start=1):
        if _is_private(segment) and not (index == 1 and segment in INTERNAL_PARTS):
            owner = ".".join(segments[:index])  # the package that holds the private module
            if module != owner and not module.startswith(owner + "."):
                return True
    return False


def _module_aliases(module: str, path: Path, known: set[str]) -> dict[str, str]:
    """Returns `{local name: autoprec module}` for every name a module binds to a module."""
    aliases = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "autoprec":
                    continue
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = "autoprec"
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
    return aliases


def _dotted(node: ast.expr) -> list[str] | None:
    """Returns `["a", "b", "c"]` for the expression `a.b.c`, or None for anything else."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]


def _private_attribute_uses(module: str, path: Path, known: set[str]) -> list[str]:
    """Returns `module:line uses target._name` for each private attribute of another module."""
    aliases = _module_aliases(module, path, known)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        dotted = _dotted(node.value)
        if not dotted or dotted[0] not in aliases:
            continue
        target = ".".join([aliases[dotted[0]], *dotted[1:]])
        if target in known and target != module:
            found.append(f"{module}:{node.lineno} uses {target}.{node.attr}")
    return found


def private_name_uses(package: Path = PACKAGE) -> list[str]:
    """Every use in `autoprec/` of a private name or module of another module, siblings included.

    Flags `from .x import _name`, `from autoprec.a.b import _name`, `x._name` where `x`
    is another autoprec module, and imports of a private module (`a._b`) from outside
    the package `a` that holds it. The internal parts (`_core`, `_backends`, ...) and
    dunder names (`__version__`) are not private names.
    """
    modules = _modules(package)
    known = set(modules)
    uses = []
    for module, path in modules.items():
        for target, name, line in _imports(module, path, known):
            if target == module:
                continue
            if name and _is_private(name):
                uses.append(f"{module}:{line} imports {target}.{name}")
            elif _private_module_outside_its_package(module, target):
                uses.append(f"{module}:{line} imports {target} {name}".rstrip())
        uses.extend(_private_attribute_uses(module, path, known))
    return uses


def test_no_private_name_crosses_a_module_boundary():
    uses = private_name_uses()
    assert not uses, (
        "private names used outside their module (make them public in the module that "
        "defines them, or move them to the module that uses them):\n" + "\n".join(uses)
    )


def test_the_private_name_check_flags_every_form_and_only_those(tmp_path):
    package = tmp_path / "autoprec"
    files = {
        "__init__.py": "from ._version import __version__\nfrom .errors import _hidden\n",
        "_version.py": "__version__ = '0'\n",
        "errors.py": "_hidden = 1\n",
        "_core/__init__.py": "",
        "_core/io.py": "from ..errors import _hidden\n",
        "stage/__init__.py": "from .a import PUBLIC\n",
        "stage/a.py": "PUBLIC = 1\n_OWN = 2\nprint(_OWN)\n",
        "stage/_helpers.py": "VALUE = 1\n",
        "stage/b.py": (
            "from . import _helpers, a\n"
            "from .a import _OWN\n"
            "from autoprec.stage.a import _OWN as again\n"
            "import autoprec.stage.a\n"
            "import autoprec.stage.a as alias\n"
            "print(a._OWN, alias._OWN, autoprec.stage.a._OWN, a.PUBLIC, a.__name__)\n"
        ),
        "other/__init__.py": "",
        "other/c.py": "from ..stage import _helpers\nfrom ..stage._helpers import VALUE\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)

    assert sorted(private_name_uses(package)) == sorted(
        [
            "autoprec:2 imports autoprec.errors._hidden",
            "autoprec._core.io:1 imports autoprec.errors._hidden",
            "autoprec.stage.b:2 imports autoprec.stage.a._OWN",
            "autoprec.stage.b:3 imports autoprec.stage.a._OWN",
            "autoprec.stage.b:6 uses autoprec.stage.a._OWN",
            "autoprec.stage.b:6 uses autoprec.stage.a._OWN",
            "autoprec.stage.b:6 uses autoprec.stage.a._OWN",
            "autoprec.other.c:1 imports autoprec.stage._helpers",
            "autoprec.other.c:2 imports autoprec.stage._helpers VALUE",
        ]
    )


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


# --- The shape: package, module and function sizes ------------------------------------------

#: `autoprec/` as a whole (every `.py` file, docstrings included) stays under this many lines;
#: each merge lowers it, down to 20,000.
MAX_PACKAGE_LINES = 20_000

#: No module of `autoprec/` is longer than this many lines.
MAX_MODULE_LINES = 800

#: No function of `autoprec/` has more than this many lines of code (its docstring,
#: blank lines and comment lines not counted; nested functions count in their parent).
MAX_FUNCTION_CODE_LINES = 60

#: Modules allowed to be longer than `MAX_MODULE_LINES`, each with why. Only shrinks: an
#: entry that is back under the limit fails `test_the_shape_allow_lists_only_shrink`.
OVERSIZED_MODULES: dict[str, str] = {}

#: Functions (`module:qualified name`) allowed past `MAX_FUNCTION_CODE_LINES`, each with why.
OVERSIZED_FUNCTIONS: dict[str, str] = {}

#: Private names used across modules (`module:line ...` as `private_name_uses` writes them,
#: without the line), each with why.
PRIVATE_NAME_USES: dict[str, str] = {}


def _docstring_lines(node: ast.AST) -> set[int]:
    body = getattr(node, "body", [])
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return set(range(body[0].lineno, body[0].end_lineno + 1))
    return set()


def function_code_lines(path: Path) -> dict[str, int]:
    """Returns `{qualified name: lines of code}` for every function of a module.

    Lines of code are the function's lines, decorators included, less its docstring,
    blank lines and comment-only lines.
    """
    text = path.read_text()
    lines = text.splitlines()
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                skipped = _docstring_lines(child)
                sizes[name] = sum(
                    1
                    for number in range(start, child.end_lineno + 1)
                    if number not in skipped
                    and lines[number - 1].strip()
                    and not lines[number - 1].strip().startswith("#")
                )
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(text, str(path)), "")
    return sizes


def _oversized_modules() -> dict[str, int]:
    return {
        module: len(path.read_text().splitlines())
        for module, path in _modules().items()
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES
    }


def _oversized_functions() -> dict[str, int]:
    found = {}
    for module, path in _modules().items():
        for name, size in function_code_lines(path).items():
            if size > MAX_FUNCTION_CODE_LINES:
                found[f"{module}:{name}"] = size
    return found


def _private_uses_without_lines() -> set[str]:
    return {re.sub(r":\d+ ", " ", use) for use in private_name_uses()}


def test_no_module_is_longer_than_the_limit():
    found = {m: n for m, n in _oversized_modules().items() if m not in OVERSIZED_MODULES}
    assert not found, (
        f"modules over {MAX_MODULE_LINES} lines (move what belongs elsewhere to its own concept's module): "
        + ", ".join(f"{module} ({lines})" for module, lines in sorted(found.items()))
    )


def test_no_function_is_longer_than_the_limit():
    found = {f: n for f, n in _oversized_functions().items() if f not in OVERSIZED_FUNCTIONS}
    assert not found, (
        f"functions over {MAX_FUNCTION_CODE_LINES} lines of code (docstrings not counted; "
        "move steps into helpers of their own): "
        + ", ".join(f"{name} ({lines})" for name, lines in sorted(found.items()))
    )


def test_the_package_stays_under_its_line_budget():
    total = sum(len(path.read_text().splitlines()) for path in _modules().values())
    assert total <= MAX_PACKAGE_LINES, (
        f"autoprec/ is {total} lines, over {MAX_PACKAGE_LINES}: merge what is built twice "
        "before adding more"
    )


def test_the_shape_allow_lists_only_shrink():
    stale = [
        *(f"OVERSIZED_MODULES[{m!r}]" for m in OVERSIZED_MODULES if m not in _oversized_modules()),
        *(
            f"OVERSIZED_FUNCTIONS[{f!r}]"
            for f in OVERSIZED_FUNCTIONS
            if f not in _oversized_functions()
        ),
        *(
            f"PRIVATE_NAME_USES[{u!r}]"
            for u in PRIVATE_NAME_USES
            if u not in _private_uses_without_lines()
        ),
    ]
    assert not stale, "allow-list entries no longer needed (remove them): " + ", ".join(stale)
    for allow_list in (OVERSIZED_MODULES, OVERSIZED_FUNCTIONS, PRIVATE_NAME_USES):
        assert all(reason.strip() for reason in allow_list.values()), "each entry says why"


def test_the_function_size_counts_code_only(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "def outer(a):\n"
        '    """Docstring.\n\n    More.\n    """\n'
        "    # a comment\n"
        "\n"
        "    def inner():\n"
        "        return a\n"
        "    return inner\n"
        "\n"
        "class Holder:\n"
        "    @staticmethod\n"
        "    def method():\n"
        "        pass\n"
    )
    assert function_code_lines(source) == {
        "outer": 4,
        "outer.inner": 2,
        "Holder.method": 3,
    }


def test_every_slow_and_long_entry_names_a_test_that_exists():
    """A renamed test file or function would fall back into the default run unnoticed."""
    import conftest

    missing = []
    for entry in (*conftest.SLOW_MODULES, *conftest.LONG_MODULES, *conftest.LONG_TESTS):
        module, _, name = entry.partition("::")
        path = ROOT / module
        if not path.is_file() or name and f"def {name}(" not in path.read_text():
            missing.append(entry)
    assert not missing, f"tests/conftest.py names tests that do not exist: {missing}"
