"""A throwaway PostgreSQL server for tests: initdb into a folder, start it, stop it at the end.

The server binaries come from the `pgserver` wheel (no root, no system package);
the server listens on a Unix socket in its data folder only (no TCP port to
collide on). Each test takes a fresh database of its own with `create_database`.
Run as root, `pgserver` runs the server as a system user `pgserver` it creates
(PostgreSQL refuses to run as root).

```python
from pg_server import postgres_server  # the session fixture, named `postgres`

def test_something(postgres):
    url = postgres.create_database("study")  # "postgresql://postgres:@/study?host=..."
```
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import sqlalchemy

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
    import pgserver

#: Seconds the server may take to stop before the fixture gives up on it.
STOP_TIMEOUT_SECONDS = 15.0


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    """A running server: its data folder, its postmaster's pid and its admin URL.

    Attributes:
        folder: the data folder (`PGDATA`).
        pid: the postmaster's process id.
        admin_url: URL of the `postgres` database, as the superuser `postgres`.
    """

    folder: Path
    pid: int
    admin_url: str

    def url(self, database: str) -> str:
        """Returns the SQLAlchemy URL of `database` on this server."""
        return (
            sqlalchemy.engine.make_url(self.admin_url)
            .set(database=database)
            .render_as_string(hide_password=False)
        )

    def create_database(self, database: str) -> str:
        """Creates an empty database and returns its URL."""
        engine = sqlalchemy.create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text(f'CREATE DATABASE "{database}"'))
        finally:
            engine.dispose()
        return self.url(database)


@contextlib.contextmanager
def running_postgres(folder: Path) -> Iterator[PostgresServer]:
    """Initialises a server in `folder` (a new, empty folder), starts it, yields it, stops it.

    Stopping is PostgreSQL's immediate shutdown (SIGQUIT to the postmaster): the data
    is thrown away with the folder.
    """
    server = pgserver.get_server(folder, cleanup_mode=None)
    running = PostgresServer(folder=Path(folder), pid=server.get_pid(), admin_url=server.get_uri())
    try:
        yield running
    finally:
        _stop(running.pid)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGQUIT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return  # exited; its parent (not this process) has not reaped it yet
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session", name="postgres")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A PostgreSQL server for the test session (one per pytest-xdist worker)."""
    with running_postgres(tmp_path_factory.mktemp("postgres") / "data") as server:
        yield server
