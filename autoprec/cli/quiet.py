"""A quiet command line: no TensorFlow start-up lines, autoprec's own messages on stderr."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

#: Python loggers of the framework, silenced below ERROR before it is imported.
FRAMEWORK_LOGGERS = ("tensorflow", "absl", "jax", "jax._src.xla_bridge")

#: Lines the framework's native code writes while it loads (absl/glog format and banners).
NATIVE_NOISE = re.compile(
    r"^(?:[IWE]\d{4} \S+ +\d+ \S+:\d+\] "  # I0000 00:00:1796126097.36 9681 port.cc:153] ...
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions:"
    r"|WARNING: Logging before InitGoogleLogging\(\))"
)


def configure_framework_logging() -> None:
    """Asks TensorFlow (and absl) to log errors only; call before the framework is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in FRAMEWORK_LOGGERS:
        framework_logger = logging.getLogger(name)
        if framework_logger.level < logging.ERROR:
            framework_logger.setLevel(logging.ERROR)


#: Top-level modules whose first import runs with the native start-up lines filtered.
FRAMEWORK_MODULES = ("keras", "tensorflow")


@contextlib.contextmanager
def quiet_framework_imports() -> Iterator[None]:
    """Drops the framework's native start-up lines from stderr while a command runs."""
    configure_framework_logging()
    finder = _QuietFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds Keras and TensorFlow with the other finders and wraps their loaders."""

    def find_spec(self, name, path=None, target=None):
        if name not in FRAMEWORK_MODULES:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


class _QuietLoader(importlib.abc.Loader):
    """Runs the real loader's `exec_module` with native stderr filtered."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader  # the module keeps its real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with _native_stderr_filtered():
            self._loader.exec_module(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


@contextlib.contextmanager
def _native_stderr_filtered() -> Iterator[None]:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 to redirect
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            written = capture.read().decode("utf-8", errors="replace")
            kept = [line for line in written.splitlines() if not NATIVE_NOISE.match(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()


@contextlib.contextmanager
def autoprec_messages(verbose: int = 1) -> Iterator[None]:
    """Shows the `autoprec` logger's messages on stderr for the duration of a command."""
    package_logger = logging.getLogger("autoprec")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    previous_level = package_logger.level
    package_logger.addHandler(handler)
    package_logger.setLevel(level)
    try:
        yield
    finally:
        package_logger.removeHandler(handler)
        package_logger.setLevel(previous_level)
