"""autoprec: per-layer automatic mixed precision for Keras 3.

Gives every layer of a Keras model the cheapest floating-point precision (float16, bfloat16 or
float32) that still trains to the accuracy you ask for. Each public name is imported from its
submodule on first use, so Keras and TensorFlow load only when a name that needs them is touched.
"""

import importlib as _importlib
import sys as _sys
import types as _types
import warnings as _warnings
from typing import Any as _Any

from ._version import __version__

#: Each public name and the submodule it is imported from on first use; a name that is
#: itself a submodule (`hardware`, `layers`) maps to `""`.
_SUBMODULE_OF: dict[str, str] = {
    "AutoPlan": "callback",
    "AutoPrecision": "callback",
    "AutoprecError": "errors",
    "Budget": "search",
    "Guard": "runtime",
    "LossScale": "runtime",
    "PlanError": "errors",
    "PrecisionPlan": "plan",
    "Profile": "profiler",
    "SearchResult": "search",
    "SearchSettings": "search",
    "apply_plan": "runtime",
    "calibrate": "cost",
    "estimate": "cost",
    "hardware": "",
    "heuristic_plan": "search",
    "layers": "",
    "load_model": "runtime",
    "predict_costs": "cost",
    "profile": "profiler",
    "save_model": "runtime",
    "search": "search",
}

__all__ = ["__version__", *_SUBMODULE_OF]

#: Names that left the top level in 0.5, and the sub-package that holds them now: each still
#: resolves as `autoprec.<name>`, with a `DeprecationWarning`, through 0.5.
_MOVED_TO: dict[str, str] = {
    "BackendError": "errors",
    "CostTable": "cost",
    "Estimate": "cost",
    "FlooredLossScaleOptimizer": "runtime",
    "HardwareError": "errors",
    "LayerProfile": "profiler",
    "NonFiniteTrainingError": "runtime",
    "PlanDiff": "plan",
    "PlanHandle": "runtime",
    "PlanRule": "plan",
    "ProfileCallback": "profiler",
    "ProfileError": "errors",
    "TensorStats": "profiler",
}


def __getattr__(name: str) -> _Any:
    """Imports a public name from its submodule on first use (PEP 562)."""
    if name in _MOVED_TO:
        new_spelling = f"{__name__}.{_MOVED_TO[name]}.{name}"
        _warnings.warn(
            f"autoprec.{name} moved to {new_spelling} in autoprec 0.5; the old spelling goes "
            f"in 0.6: write {new_spelling}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module(f"{__name__}.{_MOVED_TO[name]}"), name)
    if name not in _SUBMODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    submodule = _SUBMODULE_OF[name]
    if not submodule:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(_importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Lists the public names (imported or not) with the module's own attributes."""
    own = {name for name in globals() if not name.startswith("_") or name.startswith("__")}
    return sorted(own | set(__all__))


class _Package(_types.ModuleType):
    """The package module: `autoprec.search` stays the function when its subpackage loads."""

    def __setattr__(self, name: str, value: _Any) -> None:
        if isinstance(value, _types.ModuleType) and _SUBMODULE_OF.get(name) == name:
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


if "keras" in _sys.modules:
    # Keras is loaded already: register the classes a saved model's file may name (the
    # loss-scale optimizer of a float16 plan) and look a layer's entry of a policy map up
    # at its first call, so `keras.models.load_model` rebuilds what trained.
    _importlib.import_module(f"{__name__}.runtime.loss_scale")
    _importlib.import_module(f"{__name__}.runtime.policy_map")
