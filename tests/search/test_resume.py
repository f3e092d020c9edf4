"""A search killed mid-study resumes from its storage (bench/search_worker.py, Optuna journal)."""

from __future__ import annotations


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
