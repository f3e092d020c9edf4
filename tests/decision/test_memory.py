"""The memory of decisions: a rerun of the same fit recalls the plan, checks it once, and decides
afresh when its step time drifts, the key changes, or the entry cannot be read."""

from __future__ import annotations

import json
import logging

import keras
import numpy as np
import pytest

from autoprec import AutoPlan, AutoPrecision
from autoprec.decision import memory

from ..conftest import local_with_fast_16bit, local_with_fast_bfloat16
from .auto_models import mlp, mlp_data


class Builds(keras.callbacks.Callback):
    """Counts the train functions built during fit (each is one trace when it runs)."""

    def __init__(self):
        super().__init__()
        self.functions: set[int] = set()

    def on_train_batch_end(self, batch, logs=None):
        self.functions.add(id(self.model.train_function))


def fit(batch_size=32, hardware=None, remember=True, steps=40):
    """One fit of `mlp` under the one-liner (a race it can afford): the callback and the builds.

    120 steps leave the plan kept more than `RECALL_CHECK_STEPS` steps after the longest race
    (9 interleaved rounds).
    """
    x, y = mlp_data(steps * batch_size)
    callback = AutoPrecision(
        hardware=hardware or local_with_fast_bfloat16(),
        auto=AutoPlan(timing_rounds=1, decision_seconds=120.0, remember=remember),
        verbose=0,
    )
    builds = Builds()
    mlp().fit(x, y, batch_size=batch_size, epochs=3, verbose=0, callbacks=[callback, builds])
    return callback, builds


def entries() -> list:
    return sorted(memory.memory_dir().glob("*.json"))


@pytest.fixture(scope="module")
def remembered(tmp_path_factory) -> dict:
    """The first fit, run once for the module: what it decided, its builds and the entry it stored."""
    folder = tmp_path_factory.mktemp("remembered")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory, "memory_dir", lambda: folder)
        keras.backend.clear_session()
        callback, builds = fit()
        (entry,) = entries()
    return {
        "measured": callback.plan.metadata["measured"],
        "dtypes": dict(callback.handle.dtypes),
        "builds": len(builds.functions),
        "name": entry.name,
        "text": entry.read_text(),
    }


@pytest.fixture
def stored(remembered) -> dict:
    """This test's memory holds the first fit's entry, as a rerun finds it; returns the entry."""
    (memory.memory_dir() / remembered["name"]).write_text(remembered["text"])
    return json.loads(remembered["text"])


def test_a_rerun_recalls_the_plan_with_no_profile_and_no_race_and_checks_it_once(
    remembered, stored, caplog
):
    assert "recalled" not in remembered["measured"]
    assert remembered["measured"]["candidates_timed"] >= 2
    assert len(entries()) == 1
    assert stored["key"]["format"] == memory.KEY_FORMAT and stored["step_ms"] > 0
    # A 2 ms step on a shared host varies by more than 10 %: this rerun is told the noise is
    # wide (the next test drifts on purpose).
    stored["noise_ms"] = 100 * stored["step_ms"]
    entries()[0].write_text(json.dumps(stored))
    with caplog.at_level(logging.INFO, logger="autoprec"):
        second, second_builds = fit()
    recalled = second.plan.metadata["measured"]["recalled"]
    assert recalled["step_ms"] == stored["step_ms"] and recalled["checked_ms"] > 0
    assert second.handle.dtypes == remembered["dtypes"]
    assert second.profile is None and len(second_builds.functions) == 1
    assert remembered["builds"] > len(second_builds.functions)
    assert caplog.text.count("recalled the plan decided before") == 1
    assert "deciding afresh" not in caplog.text and str(memory.memory_dir()) in caplog.text


def test_a_step_time_that_drifted_decides_afresh(stored, caplog):
    stored.update(step_ms=stored["step_ms"] / 5, noise_ms=0.0)
    entries()[0].write_text(json.dumps(stored))
    with caplog.at_level(logging.INFO, logger="autoprec"):
        callback, builds = fit()
    assert "beyond" in callback.plan.metadata["measured"]["recalled"]["afresh"]
    assert "deciding afresh: its step took" in caplog.text
    assert callback.plan.metadata["measured"]["candidates_timed"] >= 2  # raced again
    assert json.loads(entries()[0].read_text())["step_ms"] != stored["step_ms"]  # rewritten


@pytest.mark.parametrize("change", ["batch", "dtypes"])
def test_a_changed_key_decides_afresh(stored, change):
    if change == "batch":
        callback, _ = fit(batch_size=16)
        assert "is not" in callback.plan.metadata["measured"]["recalled"]["afresh"]
        assert len(entries()) == 1  # the last writer wins
        assert json.loads(entries()[0].read_text())["batch"][0][0][0] == 16
    else:
        callback, _ = fit(hardware=local_with_fast_16bit())
        assert "recalled" not in callback.plan.metadata["measured"]
        assert len(entries()) == 2
    assert callback.plan.metadata["measured"]["candidates_timed"] >= 2


def test_an_unreadable_entry_warns_once_and_is_decided_afresh(stored, caplog):
    path = entries()[0]
    path.write_text('{"key": {"format": 1}, "plan": ')
    with caplog.at_level(logging.WARNING, logger="autoprec"):
        callback, _ = fit()
        assert memory.recall(stored["key"])  # written again after the fit
        path.write_text('{"key": {"format": 1}, "plan": ')
        assert memory.recall(stored["key"]) is None  # unreadable again, and not warned again
    assert caplog.text.count("unreadable stored decision") == 1
    assert "recalled" not in callback.plan.metadata["measured"]


def test_remember_false_neither_reads_nor_writes(remembered, stored):
    callback, _ = fit(remember=False)
    assert "recalled" not in callback.plan.metadata["measured"]  # not read
    assert [path.read_text() for path in entries()] == [remembered["text"]]  # nor written
    assert np.isfinite(callback.plan.metadata["measured"]["decision_seconds"])
