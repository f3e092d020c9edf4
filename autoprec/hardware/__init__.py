"""Hardware profiles: what a device computes fast, how fast, and how much memory it has.

A `HardwareProfile` is a plain, frozen value. Built-in profiles cover consumer
NVIDIA RTX cards (figures from NVIDIA's whitepapers, see `shared/design.md`) and
three nominal CPU classes; `detect()` reads the local device; `load_profile()`
reads a user JSON file. A CPU's flags say what the silicon can do, not what the
framework's kernels make of it: under TensorFlow a CPU never gets float16 as
fast, and bfloat16 "fast" is a capability that measured per-layer costs confirm
or refute layer by layer. Every profile says where its figures come from in
`source`: `"built-in table"`, `"read from device"`, `"user file: ..."` or
`"estimated: ..."`, so a guess is never presented as a fact.
"""

from .detect import cpu_flags, detect, detect_cpu, profile_for_gpu
from .profile import HardwareProfile, load_profile, profile_from_dict
from .resolve import get, is_local, names, resolve_hardware

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
