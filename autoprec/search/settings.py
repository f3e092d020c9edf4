"""`SearchSettings`, the rarely changed knobs of `autoprec.search`, and `SearchRequest`, one call's resolved arguments."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import optuna

from .._core.dtypes import FLOAT16_TRIALS, PLAN_DTYPES
from .._core.models import ConfigValue
from ..cost import CostTable
from ..errors import AutoprecError
from ..hardware import HardwareProfile
from ..profiler import Profile
from .budget import Budget

#: An Optuna callback: called with the study and each finished trial.
StudyCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


@dataclasses.dataclass(frozen=True)
class SearchSettings(ConfigValue):
    """The rarely changed settings of `autoprec.search`, kept apart from its main arguments.

    Build one, print it, reuse it across searches; `dataclasses.replace(settings,
    steps_per_trial=40)` derives a variant, and `get_config()` / `from_config()` round-trip
    it through a plain dict.

    Args:
        batch_size: batch size for array data (datasets keep their own batches), as in
            `model.fit`.
        steps_per_trial: training steps of every trial (from the same weights, on the
            same first batches of `x`, in order).
        max_steps_per_trial: the longest training the search may lengthen to (steps
            doubled) when the float32 reference does not beat the trivial baseline by
            more than the budget allows; default 8 x `steps_per_trial`.
        validation_steps: validation batches evaluated (default all), as in `model.fit`.
        seed: seeds the sampler and every evaluation (deterministic per machine).
        dtypes: dtypes the search may use. Default: float32 plus the 16-bit dtypes that
            run fast on `hardware` (for `"local"`: measured faster than float32 for this
            model). An explicit list is respected even where a dtype is slow.
        keep_float32: globs on layer paths or class names kept in float32, in addition
            to the default protections (softmax, normalisation, output layers).
        group_by: `"layer"`, `"block"`, `"auto"` or an int (most groups); see
            `autoprec.search.group_layers`. Grouping never hides the heuristic's own
            per-layer plan, which is always evaluated.
        profile: an `autoprec.Profile` to reuse (e.g. written by `autoprec profile`);
            default: profiled here when float16 is among the dtypes.
        profile_steps: batches the profiler sees when it runs here.
        costs: an `autoprec.CostTable` to reuse instead of measuring or predicting.
        cost_batch_size: batch size the step time is measured or predicted for (the
            batch you will train with); default `batch_size`.
        proxy_batches: calibration batches of the numerical proxy.
        proxy_tolerance: the proxy's relative loss error above which a plan is pruned
            before training (ignored when `search` is given its own `pruner`).
        reference_repeats: extra float32 runs with other batch orders and seeds, to
            report the reference's spread; a budget tighter than it is warned about.
        baseline: what a model that learned nothing scores on the budget metric:
            `"auto"` (chance for accuracy-like metrics, 0.5 for AUC, the untrained
            model's metric otherwise), a number, or `None` to skip the check.
        confirm_steps: training steps of the confirmation of the chosen plan (against
            float32 trained as long, from the same weights), run when the decision was
            close or the fidelity low; default 4 x the search's steps, 0 never.
        measure_speedup: time the final plan and float32 on this device (default: when
            `hardware="local"`).
        float16_trials: how trials train float16 layers: `"native"` (float16 kernels),
            `"emulated"` (float32 math rounded to float16 at every layer boundary, see
            `autoprec.runtime.emulation`) or `"auto"` (default: emulated where this device
            has no fast float16 kernels, such as TensorFlow on a CPU, where they run 100
            to 300 times slower than float32). Step times are never emulated.
        plan_path: the best plan so far is written there (atomically) after every trial
            that improves it, and the final plan at the end.
        callbacks: extra Optuna callbacks `(study, frozen_trial)`.
        catch: exceptions that fail a trial instead of stopping the search.

    Example:

    ```python
    settings = autoprec.SearchSettings(batch_size=64, steps_per_trial=40, plan_path="plan.json")
    result = autoprec.search(model, (x, y), (x_val, y_val),
                             budget=autoprec.Budget("val_accuracy", max_drop=0.01),
                             settings=settings)
    ```
    """

    batch_size: int = 32
    steps_per_trial: int = 20
    max_steps_per_trial: int | None = None
    validation_steps: int | None = None
    seed: int | None = 0
    dtypes: tuple[str, ...] | None = None
    keep_float32: tuple[str, ...] = ()
    group_by: str | int = "auto"
    profile: Profile | None = None
    profile_steps: int = 4
    costs: CostTable | None = None
    cost_batch_size: int | None = None
    proxy_batches: int = 2
    proxy_tolerance: float = 0.5
    reference_repeats: int = 0
    baseline: float | str | None = "auto"
    confirm_steps: int | None = None
    measure_speedup: bool | None = None
    float16_trials: str = "auto"
    plan_path: str | os.PathLike | None = None
    callbacks: tuple[StudyCallback, ...] = ()
    catch: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        for name in ("dtypes", "keep_float32", "callbacks", "catch"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        for name in ("batch_size", "steps_per_trial", "profile_steps", "proxy_batches"):
            _require_positive_int(name, getattr(self, name))
        for name in ("max_steps_per_trial", "validation_steps", "cost_batch_size"):
            if getattr(self, name) is not None:
                _require_positive_int(name, getattr(self, name))
        for name in ("reference_repeats", "confirm_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise AutoprecError(
                    f"SearchSettings.{name} must be an integer >= 0, got {value!r}."
                )
        if self.dtypes is not None:
            unknown = [dtype for dtype in self.dtypes if dtype not in PLAN_DTYPES]
            if unknown or not self.dtypes:
                raise AutoprecError(
                    f"SearchSettings.dtypes={list(self.dtypes)!r}: each must be one of "
                    f"{', '.join(PLAN_DTYPES)}, and at least one is needed."
                )
        if isinstance(self.group_by, str) and self.group_by not in ("layer", "block", "auto"):
            raise AutoprecError(
                f"SearchSettings.group_by={self.group_by!r}: use 'layer', 'block', 'auto' or "
                "an integer (the most groups)."
            )
        if self.float16_trials not in FLOAT16_TRIALS:
            raise AutoprecError(
                f"SearchSettings.float16_trials={self.float16_trials!r}: use "
                + ", ".join(repr(choice) for choice in FLOAT16_TRIALS)
                + "."
            )
        if isinstance(self.baseline, str) and self.baseline != "auto":
            raise AutoprecError(
                f"SearchSettings.baseline={self.baseline!r}: use 'auto', a number, or None "
                "to skip the check."
            )
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise AutoprecError(
                "SearchSettings.profile must be an autoprec.Profile (autoprec.Profile.load(path) "
                f"reads one written by `autoprec profile`), got {type(self.profile).__name__}."
            )
        if self.costs is not None and not isinstance(self.costs, CostTable):
            raise AutoprecError(
                "SearchSettings.costs must be an autoprec.CostTable (CostTable.load(path)), got "
                f"{type(self.costs).__name__}."
            )

    @property
    def longest_steps_per_trial(self) -> int:
        """The most training steps a trial may be lengthened to."""
        return self.max_steps_per_trial or 8 * self.steps_per_trial


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AutoprecError(f"SearchSettings.{name} must be a positive integer, got {value!r}.")


class StageClock:
    """Seconds spent in each stage of one search, added up as the search goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Adds the seconds spent inside the block to `seconds[name]`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + spent


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """What one `search()` call asked for beyond the model and data: its arguments, resolved."""

    budget: Budget
    hardware: HardwareProfile | str
    n_trials: int | None
    timeout: float | None
    storage: str | os.PathLike | optuna.storages.BaseStorage | None
    study_name: str | None
    study: optuna.Study | None
    sampler: optuna.samplers.BaseSampler | None
    pruner: optuna.pruners.BasePruner | None
    settings: SearchSettings
    verbose: int
    started: float
    train_data: Any
    max_train_steps: int
    clock: StageClock = dataclasses.field(default_factory=StageClock)
