"""Hardware profiles: what a device computes fast, how fast, and how much memory it has."""

from .profile import HardwareProfile, load_profile, profile_from_dict
from .resolve import (
    cpu_flags,
    detect,
    detect_cpu,
    get,
    is_local,
    names,
    profile_for_gpu,
    resolve_hardware,
)

__all__ = [
    "HardwareProfile",
    "cpu_flags",
    "detect",
    "detect_cpu",
    "get",
    "is_local",
    "load_profile",
    "names",
    "profile_for_gpu",
    "profile_from_dict",
    "resolve_hardware",
]

# Not part of the surface: autoprec.cost still imports these from the package.
from .profile import FAST, SLOW, UNSUPPORTED  # noqa: E402, F401
