"""The stores' databases: a new SQLite file, or a new database in one throwaway PostgreSQL cluster of the run."""

from __future__ import annotations

import itertools

import pytest
import sqlalchemy as sa

from phi_api.bench.postgres import Postgres
from phi_api.storage.database import driver_url, sqlite_url

_NAMES = itertools.count()


@pytest.fixture(scope="session")
def postgres():
    with Postgres() as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """An empty database of each engine."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store.sqlite3")
    cluster = request.getfixturevalue("postgres")
    name = f"store_{next(_NAMES)}"
    engine = sa.create_engine(driver_url(cluster.url), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return cluster.url.rsplit("/", 1)[0] + "/" + name
