"""Tests for `autoprec.search.storage`: storages a `storage=` names, and locks shared by a study."""

from __future__ import annotations

import optuna
import pytest
from optuna.storages import JournalStorage

from autoprec.errors import AutoprecError
from autoprec.search.storage import claim_study_lock, release_study_lock, resolve_storage


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
