"""What the search tells while its trials run: one log line per trial, the best plan so far on disk."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import optuna

from .context import SearchContext
from .record import TrialRecord
from .result import short_counts_text
from .study import best_feasible, is_feasible

logger = logging.getLogger("autoprec")


def log_trial(context: SearchContext, trial: optuna.trial.FrozenTrial) -> None:
    """Logs one line about a finished trial (verbose searches only)."""
    if not context.verbose:
        return
    record = TrialRecord.from_trial(trial)
    metric, seconds = record.metric, record.predicted_seconds
    verdict = {
        optuna.trial.TrialState.COMPLETE: "ok" if is_feasible(trial) else "over budget",
        optuna.trial.TrialState.PRUNED: f"pruned ({record.pruned_by or ''})",
        optuna.trial.TrialState.FAIL: "failed",
    }.get(trial.state, str(trial.state))
    logger.info(
        "trial %d: %s | fidelity %s | %s %s | predicted %s%s | %s",
        trial.number,
        short_counts_text(record.dtype_counts or {}),
        (record.fidelity or ("-",))[-1],
        context.budget.metric,
        f"{metric:.6g}" if isinstance(metric, (int, float)) else "n/a",
        f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "n/a",
        f" (x{context.float32_seconds / seconds:.2f})" if seconds else "",
        verdict,
    )


def plan_writer(
    context: SearchContext, plan_path: str | os.PathLike | None, metadata: dict
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Returns the Optuna callback that logs each trial and saves the best plan so far."""
    written: dict[str, int | None] = {"number": None}

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        log_trial(context, trial)
        if plan_path is None:
            return
        while True:
            best = best_feasible(study)
            if best is None or best.number == written["number"]:
                return
            if plan_file_trial(plan_path, study.study_name) != best.number:
                plan = context.trial_plan(
                    best, metadata=trial_plan_metadata(context, best, metadata)
                )
                plan.save(plan_path)
                logger.info(
                    "autoprec.search: best plan so far (trial %d) written to %s",
                    best.number,
                    plan_path,
                )
            written["number"] = best.number

    return callback


def plan_file_trial(plan_path: str | os.PathLike, study_name: str) -> int | None:
    """Returns the trial of study `study_name` whose plan the file holds, or `None`."""
    try:
        data = json.loads(Path(plan_path).read_text(encoding="utf-8"))
        search = data["metadata"]["search"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(search, dict) or search.get("study_name") != study_name:
        return None
    number = search.get("best_trial")
    return number if isinstance(number, int) else None


def trial_plan_metadata(
    context: SearchContext, trial: optuna.trial.FrozenTrial, base: dict
) -> dict:
    """Returns the plan metadata of a trial's plan: `base` with its metric and speedup."""
    record = TrialRecord.from_trial(trial)
    seconds = record.predicted_seconds
    return {
        **base,
        "reference_metric": context.reference,
        "measured_metric": record.metric,
        "predicted_speedup": (context.float32_seconds / seconds) if seconds else None,
        "search": {**base.get("search", {}), "best_trial": trial.number},
    }
