"""Tests for `autoprec.search.study`: storages, the trial objective, one assignment trained once, the plan on disk, resume."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import keras
import optuna
import pytest
from optuna.storages import JournalStorage
from search.search_models import (
    compiled_mlp,
    far_regression,
    far_targets,
    fast,
    labelled,
    mlp_data,
    prepared_search,
    wide_classifier,
)

import autoprec
from autoprec.errors import AutoprecError
from autoprec.plan import PrecisionPlan
from autoprec.search import Budget, TrialRecord, resolve_storage, search
from autoprec.search.result import write_record
from autoprec.search.study import (
    FidelityPruner,
    claim_study_lock,
    is_feasible,
    log_trial,
    plan_file_trial,
    plan_writer,
    release_study_lock,
    trained_outcome,
    trial_objective,
    trial_plan_metadata,
    wait_for_same_assignment,
)

WORKER = Path(__file__).resolve().parents[2] / "bench" / "search_worker.py"


def _search(budget, n_trials, storage, study_name, **options):
    """Searches the compiled MLP on its data (the one call of `search` in this file)."""
    train, val = mlp_data()
    keras.utils.set_random_seed(0)
    return search(
        compiled_mlp(), train, val, budget=budget, n_trials=n_trials, storage=storage,
        study_name=study_name, **fast(**options),
    )  # fmt: skip


def test_resume_accumulates_without_duplicate_warm_starts(tmp_path):
    storage = str(tmp_path / "study.log")
    for _ in range(2):
        _search(Budget("val_accuracy", max_drop=0.2), 3, storage, "s")
    study = optuna.load_study(study_name="s", storage=resolve_storage(storage))
    assert len(study.trials) == 6
    labels = [r.warm_start for r in map(TrialRecord.from_trial, study.trials) if r.warm_start]
    assert len(labels) == len(set(labels))


def test_keyboard_interrupt_keeps_finished_trials_and_plan(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    plan_path = tmp_path / "best.json"

    def interrupt(study, trial):
        if trial.number >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _search(
            Budget("val_accuracy", max_drop=0.2), 10, storage, "interrupted",
            plan_path=plan_path, callbacks=[interrupt],
        )  # fmt: skip
    study = optuna.load_study(study_name="interrupted", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 2
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert autoprec.PrecisionPlan.load(plan_path).metadata["budget"]["metric"] == "val_accuracy"
    feasible = [t for t in finished if t.constraints and max(t.constraints.values()) <= 0]
    best = min(feasible, key=lambda t: (t.value, t.number))
    assert plan_file_trial(plan_path, "interrupted") == best.number
    assert plan_file_trial(plan_path, "another study") is None
    assert plan_file_trial(tmp_path / "missing.json", "interrupted") is None


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "journal"])
def test_two_processes_share_one_study(tmp_path, kind):
    storage = f"sqlite:///{tmp_path / 'shared.db'}" if kind == "sqlite" else str(tmp_path / "s.log")
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                storage,
                "3",
                "--study-name",
                "shared",
                "--seed",
                str(seed),
                "--dtypes",
                "float32,bfloat16",
                "--train-steps",
                "2",
            ],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for seed in (1, 2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr.decode()[-2000:]
    study = optuna.load_study(study_name="shared", storage=resolve_storage(storage))
    numbers = [t.number for t in study.trials if t.state.is_finished()]
    # 6 trials, and the finalists the measured ranking added (a protection dropped).
    assert len(numbers) >= 6 and len(set(numbers)) == len(numbers)
    labels = [r.warm_start for r in map(TrialRecord.from_trial, study.trials) if r.warm_start]
    assert "float32" in labels and len(labels) == len(set(labels))
    assert study.user_attrs["warm_starts_enqueued"] is True
    assert optuna.get_all_study_names(resolve_storage(storage)) == ["shared"]  # lock released


def test_an_assignment_already_trained_is_reused_across_runs_of_one_study(tmp_path):
    storage = str(tmp_path / "reuse.log")
    budget = Budget("val_accuracy", max_drop=0.05)
    for n_trials in (3, 6):  # two groups: four assignments in all, so TPE repeats
        _search(budget, n_trials, storage, "reuse", group_by=1)
    study = optuna.load_study(study_name="reuse", storage=resolve_storage(storage))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    records = {t.number: TrialRecord.from_trial(t) for t in study.trials}
    trained: dict[str, int] = {}
    for trial in complete:
        record = records[trial.number]
        key, source = record.assignment_key, record.reused_from
        if source is None:
            assert key not in trained, f"trial {trial.number} trained {key} again"
            trained[key] = trial.number
        elif source != "reference":
            assert records[source].assignment_key == key
            assert records[source].metric == record.metric
    reused = [records[t.number] for t in complete if records[t.number].reused]
    assert reused and any(isinstance(r.reused_from, int) and r.reused_from < 3 for r in reused)


def test_resolve_storage_opens_journal_files_and_passes_the_rest(tmp_path):
    assert resolve_storage(None) is None
    assert isinstance(resolve_storage(str(tmp_path / "a.log")), JournalStorage)
    assert isinstance(resolve_storage(tmp_path / "b.log"), JournalStorage)
    assert isinstance(resolve_storage(f"journal://{tmp_path / 'c.journal'}"), JournalStorage)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    database = resolve_storage(url)
    assert isinstance(database, optuna.storages.RDBStorage) and database.url == url
    assert (database.heartbeat_interval, database.grace_period) == (60, 120)
    assert resolve_storage(url, heartbeat_interval=2).grace_period == 4
    assert resolve_storage(url, heartbeat_interval=None).heartbeat_interval is None
    storage = optuna.storages.InMemoryStorage()
    assert resolve_storage(storage) is storage


def test_a_missing_database_driver_names_the_package_and_hides_the_password():
    with pytest.raises(AutoprecError, match=r"user:\*\*\*@.*(Install|journal file)") as error:
        resolve_storage("mysql+pymysql://user:secret@localhost/db")
    assert "secret" not in str(error.value)


def test_one_process_of_a_study_holds_its_lock_until_it_releases_it(tmp_path):
    path = tmp_path / "locks.log"
    optuna.create_study(storage=resolve_storage(path), study_name="s")
    first, second = (
        optuna.load_study(study_name="s", storage=resolve_storage(path)) for _ in range(2)
    )
    lock = claim_study_lock(first, "warm-starts")
    assert lock == "s:autoprec-warm-starts"
    assert claim_study_lock(second, "warm-starts") is None
    assert claim_study_lock(second, "other") == "s:autoprec-other"  # locks are per purpose
    release_study_lock(first, lock)
    release_study_lock(first, lock)  # releasing twice is harmless
    assert claim_study_lock(second, "warm-starts") == lock


def test_a_trial_records_its_stages_and_the_same_assignment_is_trained_once():
    with prepared_search() as prepared:
        context = prepared.context
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        bfloat16 = context.uniform_assignment("bfloat16")
        for assignment in (bfloat16, bfloat16, context.uniform_assignment("float32")):
            study.enqueue_trial(
                context.params_for(assignment),
                user_attrs=TrialRecord(warm_start="w", assignment=assignment).to_user_attrs(),
                skip_if_exists=False,
            )
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=3)
        trained, again, float32 = (TrialRecord.from_trial(t) for t in study.trials)
        assert trained.assignment == bfloat16 and trained.train_steps == context.train_steps
        assert trained.fidelity == ("profile", "proxy", "train")
        assert trained.evaluating == 0 and trained.proxy_score is not None
        assert trained.dtype_counts["bfloat16"] == len(bfloat16)
        assert trained.predicted_seconds > 0 and trained.activation_bytes_per_sample > 0
        assert set(trained.metrics) >= {"accuracy", "loss"} and trained.metric is not None
        assert (trained.budget_violation <= 0) == is_feasible(study.trials[0])
        assert again.reused and again.reused_from == 0 and again.metric == trained.metric
        assert again.evaluating is None  # it evaluated nothing itself
        assert float32.reused_from == "reference" and float32.metric == context.reference
        assert study.trials[0].value == study.trials[1].value  # one assignment, one cost


def test_a_plan_predicted_no_faster_than_the_best_within_budget_is_pruned_before_training():
    with prepared_search() as prepared:
        context = prepared.context
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        float32 = context.uniform_assignment("float32")
        study.enqueue_trial(
            context.params_for(float32),
            user_attrs=TrialRecord(warm_start="float32", assignment=float32).to_user_attrs(),
        )
        bfloat16 = context.uniform_assignment("bfloat16")  # slower on this launch-bound MLP
        assert context.costs.step(bfloat16)[0] > context.costs.step(float32)[0]
        study.enqueue_trial(
            context.params_for(bfloat16),
            user_attrs=TrialRecord(assignment=bfloat16).to_user_attrs(),  # not a warm start
        )
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=2)
        first, second = study.trials
        assert first.state == optuna.trial.TrialState.COMPLETE and is_feasible(first)
        assert second.state == optuna.trial.TrialState.PRUNED
        record = TrialRecord.from_trial(second)
        assert record.pruned_by.startswith("cost:") and record.metrics is None
        assert record.evaluating == 1 and record.fidelity == ("profile",)


def _enqueue(study, context, label, assignment):
    study.enqueue_trial(
        context.params_for(assignment),
        user_attrs=TrialRecord(warm_start=label, assignment=assignment).to_user_attrs(),
        skip_if_exists=False,
    )


def test_a_16_bit_head_that_holds_a_short_trial_is_refused_for_its_rounding_floor():
    keras.utils.set_random_seed(0)
    budget = Budget("val_mae", max_relative_drop=0.5)  # loose enough for 2 train steps anywhere
    with prepared_search(far_regression(), far_targets(), budget, proxy_batches=1) as prepared:
        context = prepared.context
        uniform = context.uniform_assignment("bfloat16")
        trained = context.evaluator.train_and_evaluate(context.plan_for(uniform))
        assert budget.violation(context.reference, trained["mae"]) <= 0  # what a trial sees
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        _enqueue(study, context, "uniform bfloat16", uniform)
        _enqueue(study, context, "safe head", {**uniform, "head": "float32"})
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=2)
        refused, safe = study.trials
        assert refused.state == optuna.trial.TrialState.COMPLETE and not is_feasible(refused)
        assert refused.constraints["output_floor"] > 0 and "budget" not in refused.constraints
        record = TrialRecord.from_trial(refused)
        assert record.fidelity == ("profile", "floor") and record.metrics is None
        assert record.budget_violation == refused.constraints["output_floor"]
        floor = refused.user_attrs["output_floor"]
        assert floor["refused"] and floor["dtypes"] == {"head": "bfloat16"}
        assert floor["sources"] == {"head": "targets"} and floor["value"] > 0.5  # ~1 MAE
        assert "'head'" in floor["reason"] and "no training removes" in floor["reason"]
        assert is_feasible(safe) and "output_floor" not in safe.user_attrs
        assert TrialRecord.from_trial(safe).fidelity[-1] == "train"
        context.study = study
        metadata = context.floor_metadata()
        assert metadata["refused_trials"] == {"0": floor["reason"]}
        assert metadata["outputs"]["head"]["bfloat16"]["refused"]
        assert metadata["rule"] == {"fraction": 0.5, "headroom": 10.0}


def test_a_classifier_s_16_bit_head_keeps_a_negligible_floor_and_is_trained():
    budget = Budget("val_loss", max_relative_drop=0.02)
    with prepared_search(budget=budget) as prepared:
        context = prepared.context
        uniform = context.uniform_assignment("bfloat16")
        floor = context.output_floor(uniform)
        assert floor.sources == {"dense_2": "float32 outputs"} and not floor.refused
        assert floor.value < 0.01 * floor.limit  # float32 noise in the loss, no floor
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        _enqueue(study, context, "uniform bfloat16", uniform)
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=1)
        (trial,) = study.trials
        assert trial.constraints["output_floor"] < 0 and "budget" in trial.constraints
        assert TrialRecord.from_trial(trial).fidelity[-1] == "train"
        assert not trial.user_attrs["output_floor"]["refused"]
        assert context.output_floor(context.uniform_assignment("float32")) is None


def test_search_on_a_far_regression_never_returns_a_16_bit_head_and_says_why_once(capsys):
    keras.utils.set_random_seed(0)
    train, val = far_targets()
    result = search(
        far_regression(),
        train,
        val,
        budget=Budget("val_mae", max_relative_drop=0.35),
        n_trials=4,
        **fast(verbose=1, cost_batch_size=4096, confirm_steps=0),
    )
    assert result.plan.layers["head"] == "float32"
    assert result.plan.layers["wide1"] == "bfloat16"  # the rest still gains
    refused = [t for t in result.study.trials if t.user_attrs.get("output_floor")]
    assert refused and all(t.user_attrs["output_floor"]["refused"] for t in refused)
    assert all(not is_feasible(t) for t in refused)
    assert capsys.readouterr().out.count("no training removes") == 1
    # The plan says why its head stayed float32, and which trials the floor refused.
    recorded = result.plan.metadata["search"]["output_floor"]
    assert recorded["refused_trials"]
    assert result.plan.metadata["evidence"]["head"]["output_floor"]["bfloat16"]["refused"]


def test_search_on_a_classifier_may_still_return_a_16_bit_head():
    keras.utils.set_random_seed(0)
    model = wide_classifier()
    train, val = labelled(model, 512)
    result = search(
        model,
        train,
        val,
        budget=Budget("val_accuracy", max_drop=0.1),
        n_trials=3,
        **fast(steps_per_trial=4, cost_batch_size=4096, confirm_steps=0),
    )
    floors = [
        t.user_attrs["output_floor"]
        for t in result.study.trials
        if t.user_attrs.get("output_floor")
    ]
    assert floors and all(not floor["refused"] and floor["value"] == 0.0 for floor in floors)
    assert result.plan.layers["head"] == "bfloat16"


def _tell(study, key, steps, record):
    trial = study.ask()
    write_record(trial, TrialRecord(assignment_key=key, train_steps=steps))
    write_record(trial, record)
    study.tell(trial, 1.0)


def test_the_outcome_of_a_completed_trial_of_the_same_assignment_and_fidelity_is_found():
    study = optuna.create_study()
    _tell(study, "k", 4, TrialRecord(metrics={"accuracy": 0.5}))
    _tell(study, "k", 4, TrialRecord(metrics={"accuracy": 0.5}, reused=True, reused_from=0))
    _tell(study, "k", 8, TrialRecord(metrics={"accuracy": 0.7}))
    assert trained_outcome(study, "k", 4).reused_from == 0
    assert trained_outcome(study, "k", 8).metrics == {"accuracy": 0.7}
    assert trained_outcome(study, "k", 2) is None and trained_outcome(study, "j", 4) is None


def test_a_trial_waits_for_the_one_evaluating_its_assignment_and_reuses_its_outcome():
    study = optuna.create_study()
    first, second = study.ask(), study.ask()
    for trial in (first, second):
        write_record(trial, TrialRecord(assignment_key="k", train_steps=2))
    write_record(first, TrialRecord(evaluating=first.number))

    def finish_first() -> None:
        time.sleep(0.6)
        write_record(first, TrialRecord(metrics={"accuracy": 0.75}))
        study.tell(first, 1.0)

    finisher = threading.Thread(target=finish_first)
    started = time.monotonic()
    finisher.start()
    outcome = wait_for_same_assignment(study, second.number, "k", 2, timeout=30)
    finisher.join()
    assert time.monotonic() - started >= 0.5
    assert outcome.reused_from == first.number and outcome.metrics == {"accuracy": 0.75}


def test_no_trial_waits_for_a_higher_one_that_is_not_evaluating_and_waits_end():
    study = optuna.create_study()
    lower, higher = study.ask(), study.ask()
    for trial in (lower, higher):
        write_record(trial, TrialRecord(assignment_key="j", train_steps=2))
    assert wait_for_same_assignment(study, lower.number, "j", 2, timeout=5) is None
    started = time.monotonic()  # the higher trial waits for the lower one, up to its timeout
    assert wait_for_same_assignment(study, higher.number, "j", 2, timeout=0.6) is None
    assert time.monotonic() - started >= 0.6


def _add(study, context, dtype, value, violation):
    record = TrialRecord(
        assignment=context.uniform_assignment(dtype), predicted_seconds=value, metric=0.5
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
        )
    )
    return study.trials[-1]


def test_the_file_holds_the_best_trial_within_budget_and_says_which(tmp_path, caplog):
    path = tmp_path / "best.json"
    with prepared_search() as prepared:
        context = prepared.context
        context.verbose = 1
        study = optuna.create_study(study_name="writer")
        context.metadata = {"search": {"study_name": "writer"}}
        context.settings = dataclasses.replace(context.settings, plan_path=path)
        callback = plan_writer(context)
        float32 = _add(study, context, "float32", 2.0, -1.0)
        with caplog.at_level(logging.INFO, logger="autoprec"):
            callback(study, float32)
        assert plan_file_trial(path, "writer") == 0
        assert "trial 0:" in caplog.text and "written to" in caplog.text
        missed = _add(study, context, "bfloat16", 1.0, 0.5)  # faster, over budget: not written
        callback(study, missed)
        assert plan_file_trial(path, "writer") == 0
        better = _add(study, context, "bfloat16", 1.5, -0.5)
        callback(study, better)
        assert plan_file_trial(path, "writer") == 2
        plan = PrecisionPlan.load(path)
        assert set(plan.layers.values()) >= {"bfloat16"}
        assert plan.metadata["predicted_speedup"] == context.float32_seconds / 1.5
        assert plan.metadata["measured_metric"] == 0.5
        assert plan_file_trial(path, "another") is None
        assert plan_file_trial(tmp_path / "missing.json", "writer") is None


def test_metadata_and_log_lines_come_from_the_record(caplog):
    with prepared_search() as prepared:
        context = prepared.context
        study = optuna.create_study()
        trial = _add(study, context, "bfloat16", 0.25, -1.0)
        context.metadata = {"search": {"seed": 0}}
        metadata = trial_plan_metadata(context, trial)
        assert metadata["search"] == {"seed": 0, "best_trial": 0}
        assert trial_plan_metadata(context, None)["predicted_speedup"] == 1.0
        assert metadata["reference_metric"] == context.reference
        with caplog.at_level(logging.INFO, logger="autoprec"):
            log_trial(context, trial)  # verbose 0: silent
            assert "trial 0" not in caplog.text
            context.verbose = 2
            log_trial(context, trial)
        assert "trial 0:" in caplog.text and "250.000 ms" in caplog.text and "| ok" in caplog.text


def _finished_trials(storage_path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(
        study_name="fault_injection", storage=JournalStorage(JournalFileBackend(str(storage_path)))
    )
    return study.trials


def test_search_killed_mid_study_resumes_without_losing_or_duplicating_trials(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import optuna

    worker = Path(__file__).resolve().parents[2] / "bench" / "search_worker.py"
    storage = tmp_path / "study.log"
    finished_states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    process = subprocess.Popen([sys.executable, str(worker), str(storage), "500"])
    deadline = time.time() + 240
    before = []
    while time.time() < deadline:
        time.sleep(0.5)
        if storage.exists():
            try:
                before = [t for t in _finished_trials(storage) if t.state in finished_states]
            except Exception:  # the study may not exist yet
                continue
            if len(before) >= 3:
                break
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = [t for t in _finished_trials(storage) if t.state in finished_states]
    assert len(before) >= 3

    resumed = subprocess.run(
        [sys.executable, str(worker), str(storage), "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _finished_trials(storage)
    by_number = {trial.number: trial for trial in after}
    assert len(by_number) == len(after)  # trial numbers are unique
    for trial in before:  # no finished trial lost or changed
        kept = by_number[trial.number]
        assert (kept.state, kept.value, kept.params) == (trial.state, trial.value, trial.params)
    warm_starts = [t for t in after if t.system_attrs.get("fixed_params") is not None]
    assert len(warm_starts) == len({str(sorted(t.params.items())) for t in warm_starts})
    assert len([t for t in after if t.state in finished_states]) >= len(before) + 3
