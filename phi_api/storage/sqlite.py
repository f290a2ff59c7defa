"""An SQLite database of the stores: one connection per process, and write transactions that lock first."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any


class Database:
    """The SQLite file at ``path``, its tables made by ``schema`` (statements run once per process)."""

    def __init__(self, path: Path, schema: str, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self._schema = schema
        self._timeout = timeout
        self._pid: int | None = None
        self._db: sqlite3.Connection | None = None

    def connection(self) -> sqlite3.Connection:
        """This process's connection (SQLite's must not cross a fork), in autocommit mode."""
        if self._pid != os.getpid() or self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._pid = os.getpid()
            self._db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(self._schema)
        return self._db

    def transaction(self) -> Transaction:
        """A write transaction: ``with database.transaction() as db: ...``."""
        return Transaction(self.connection())


class Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or ``ROLLBACK``): the write lock is taken before anything is read."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: Any, *rest: Any) -> None:
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")
