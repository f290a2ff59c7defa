"""An SQLite database of the stores: one connection per process, used off the gevent hub, one call at a time.

SQLite waits for its write lock (up to the busy timeout) and for the disk inside the call. Made on the hub, such a
call would stall every stream of the worker; so each store method runs on a pooled OS thread
(:func:`off_hub`), while its greenlet waits and the hub goes on. A process's calls take turns on its one
connection (a lock); a call made from inside another (a store method using another) runs where it is.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

from gevent import monkey

from phi_api.engine.threads.native import new_rlock, off_hub

P = ParamSpec("P")
T = TypeVar("T")
_thread_id = monkey.get_original("_thread", "get_ident")  # the OS thread's, even where gevent patched threading


class Database:
    """The SQLite file at ``path``, its tables made by ``schema`` (statements run once per process), and the columns
    ``added`` since (a database of an earlier release is upgraded in place)."""

    def __init__(self, path: Path, schema: str, timeout: float = 30.0,
                 added: tuple[tuple[str, str, str], ...] = ()) -> None:
        self.path = Path(path)
        self._schema = schema
        self._added = added  # (table, column, declaration): columns a database of an earlier release lacks
        self._timeout = timeout
        self._pid: int | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = new_rlock()  # one for the object's life: replaced, a waiter could pass a holder of the old one
        self._holder: int | None = None  # the OS thread running a call now

    def call(self, work: Callable[[], T]) -> T:
        """``work()`` on a pooled thread, holding this database (directly when already inside a call)."""
        if self._holder == _thread_id():
            return work()
        return off_hub(self._held, work)

    def _held(self, work: Callable[[], T]) -> T:
        with self._lock:
            self._holder = _thread_id()
            try:
                return work()
            finally:
                self._holder = None

    def connection(self) -> sqlite3.Connection:
        """This process's connection (SQLite's must not cross a fork), in autocommit mode."""
        if self._pid != os.getpid() or self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._pid = os.getpid()
            self._db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None,
                                       check_same_thread=False)  # used by the pool's threads, one at a time
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(self._schema)
            for table, column, declaration in self._added:
                if column not in [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
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


class HasDatabase(Protocol):
    @property
    def database(self) -> Database: ...


def off_the_hub(method: Callable[P, T]) -> Callable[P, T]:
    """A store's method, run through its :attr:`database`'s :meth:`Database.call`."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        store: HasDatabase = args[0]  # type: ignore[assignment]
        return store.database.call(functools.partial(method, *args, **kwargs))

    return run
