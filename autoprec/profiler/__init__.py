"""Per-layer value ranges of a model in training: probes, `profile()`, `ProfileCallback`, `Profile`."""

from .float8_ranges import Float8Ranges, Float8TensorRange
from .runner import ProbeSession, ProfileCallback, ProfileData, profile
from .stats import LayerProfile, Profile
from .tensor_stats import TensorStats

__all__ = [
    "Float8Ranges",
    "Float8TensorRange",
    "LayerProfile",
    "ProbeSession",
    "Profile",
    "ProfileCallback",
    "ProfileData",
    "TensorStats",
    "profile",
]
