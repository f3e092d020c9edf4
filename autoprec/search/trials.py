"""The search's trial stage: open (or resume) the study, enqueue its warm starts, run its trials."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import keras
import optuna

from .confirmation import say
from .context import SearchContext
from .explore import explorer
from .objective import trial_objective
from .plan_writer import plan_writer
from .preparation import ReferenceCheck, SearchSpace, search_metadata
from .record import REFERENCE_METRIC_ATTR
from .request import SearchRequest
from .storage import resolve_storage
from .study import open_study
from .warm_start import enqueue_warm_starts, warm_starts


@dataclasses.dataclass(frozen=True)
class TrialsRun:
    """The study after this call's trials: the trial stage's value."""

    study: optuna.Study
    metadata: Mapping[str, Any]


def run_trials(
    model: keras.Model,
    context: SearchContext,
    request: SearchRequest,
    space: SearchSpace,
    reference: ReferenceCheck,
) -> TrialsRun:
    """Opens the study, enqueues the warm starts once, and runs this call's trials."""
    settings = request.settings
    starts = warm_starts(
        context,
        model,
        space.profile,
        space.table,
        space.hardware or request.hardware,
        space.dtypes,
        settings.keep_float32,
    )
    study, created = _study(request)
    added = enqueue_warm_starts(study, starts)
    study.set_user_attr(REFERENCE_METRIC_ATTR, context.reference)
    say(
        request.verbose,
        "autoprec.search: study %r (%s, %d trial(s) already); %d warm start(s) enqueued",
        study.study_name,
        "new" if created else "resumed",
        len(study.trials) - added,
        added,
    )
    evaluator = context.evaluator
    metadata = search_metadata(
        request, space, reference, study, len(evaluator.train_batches), evaluator.batch_size
    )
    n_trials = request.n_trials
    if all(len(group.choices) <= 1 for group in context.groups):
        say(
            request.verbose,
            "autoprec.search: nothing to choose (one dtype per layer); one trial only.",
        )
        n_trials = min(n_trials or 1, 1)
    writer = plan_writer(context, settings.plan_path, metadata)
    with request.clock.stage("trials"):
        study.optimize(
            lambda trial: trial_objective(context, trial),
            n_trials=n_trials,
            timeout=request.timeout,
            catch=tuple(settings.catch),
            callbacks=[writer, explorer(context), *settings.callbacks],
            show_progress_bar=request.verbose >= 1,
        )
    return TrialsRun(study, metadata)


def _study(request: SearchRequest) -> tuple[optuna.Study, bool]:
    """Returns `(study, created)`: the study given, or the one `storage`/`study_name` name."""
    if request.study is not None:
        return request.study, not request.study.trials
    return open_study(
        resolve_storage(request.storage),
        request.study_name,
        request.settings.seed,
        request.settings.proxy_tolerance,
        sampler=request.sampler,
        pruner=request.pruner,
    )
