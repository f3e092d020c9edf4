"""The machine a benchmark runs on: CPU model name and flags, cores, load, versions.

Standard library only (a module's version is imported only when asked for).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import platform
import subprocess
from collections.abc import Iterator

#: CPU flags of fast 16-bit arithmetic; every `amx*` flag counts as well.
SIXTEEN_BIT_FLAGS = ("avx512_bf16", "avx512_fp16")


@functools.cache
def cpu() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags, as `lscpu` prints them (else `/proc/cpuinfo`).

    Where neither answers, the platform's processor (or machine) name and no flags.
    """
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            text = ""
    name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return name or platform.processor() or platform.machine(), flags


def cpu_model() -> str:
    """The CPU's model name (`lscpu`'s `Model name`)."""
    return cpu()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's flags (`avx2`, `avx512_bf16`, `amx_bf16`, ...)."""
    return cpu()[1]


def sixteen_bit_flags() -> list[str]:
    """The CPU's flags of fast bfloat16 or float16 arithmetic, sorted."""
    return sorted(
        flag for flag in cpu_flags() if flag in SIXTEEN_BIT_FLAGS or flag.startswith("amx")
    )


def cores() -> int | None:
    """The machine's CPU count."""
    return os.cpu_count()


def usable_cores() -> int | None:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load() -> float:
    """The one-minute load average (`nan` where the platform keeps none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def versions(*modules: str) -> dict[str, str]:
    """`{module: its __version__}`, each imported here (TensorFlow only where asked for)."""
    return {name: importlib.import_module(name).__version__ for name in modules}


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """Sets the environment variable `name` to `value`; what it was comes back after."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
