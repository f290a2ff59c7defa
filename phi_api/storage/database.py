"""The stores' database: an SQLite file in the data folder (one machine), or PostgreSQL (``DATABASE_URL``) shared by
every worker of every replica; reached through SQLAlchemy Core, off the gevent hub, its schema made and migrated by
the server itself.

A call waits for locks and the network inside the driver. Made on the hub, it would stall every stream of the
worker; so each store method runs on a pooled OS thread (:func:`off_hub`) while its greenlet waits. On SQLite a
process's calls take turns (a lock: one writer at a time anyway), each write transaction taking the write lock
first (``BEGIN IMMEDIATE``); on PostgreSQL they run side by side, on a small pool of connections checked before use,
so a database that was restarted is reconnected to by itself.

Each store names its schema's steps (:class:`Migration`): the first makes its tables and adds what an earlier
release's tables lack; the later ones change them. Which steps a database has had is kept in ``schema_versions``;
the missing ones run once, at a process's first use, under a lock (two replicas starting together migrate once).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import sqlalchemy as sa
from gevent import monkey
from sqlalchemy.dialects import postgresql, sqlite

from phi_api.engine.threads.native import new_rlock, off_hub

P = ParamSpec("P")
T = TypeVar("T")
Migration = Callable[[sa.Connection], None]
DatabaseError = sa.exc.SQLAlchemyError  # what any call of a store may raise from the database
_thread_id = monkey.get_original("_thread", "get_ident")  # the OS thread's, even where gevent patched threading

_VERSIONS = sa.Table("schema_versions", sa.MetaData(), sa.Column("store", sa.String(64), primary_key=True),
                     sa.Column("version", sa.Integer, nullable=False))


def sqlite_url(path: Path) -> str:
    """The URL of the SQLite file at ``path``."""
    return f"sqlite:///{Path(path).expanduser().resolve()}"


def driver_url(url: str) -> str:
    """``url`` with the driver SQLAlchemy is to use: psycopg 3 for PostgreSQL."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


class Database:
    """The database at ``url`` as the store ``name`` uses it: its schema brought to the last of ``steps``."""

    def __init__(self, url: str, name: str, steps: tuple[Migration, ...], *, timeout: float = 30.0) -> None:
        self.url = driver_url(url)
        self.name = name
        self._steps = steps
        self._timeout = timeout
        self._pid: int | None = None
        self._engine: sa.Engine | None = None
        self._lock = new_rlock()  # SQLite: one call at a time in a process
        self._holders: set[int] = set()  # the OS threads running a call now (PostgreSQL: several at once)
        self.failures: dict[str, int] = {}  # calls that failed in this process, by kind (see _failure_kind)

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def call(self, work: Callable[[], T]) -> T:
        """``work()`` on a pooled thread (directly when already inside a call of this database)."""
        if _thread_id() in self._holders:
            return work()
        try:
            return off_hub(self._held, work)
        except DatabaseError as error:  # counted for /metrics (telemetry.watch), then the caller's to handle
            kind = _failure_kind(error)
            self.failures[kind] = self.failures.get(kind, 0) + 1
            raise

    def ping(self) -> bool:
        """Whether the database answers a trivial query now (its schema migrated first, as at any first use); a
        failure here is not counted in :attr:`failures`."""

        def answer() -> None:
            with self.read() as connection:
                connection.execute(sa.text("SELECT 1"))

        try:
            off_hub(self._held, answer)
        except DatabaseError:
            return False
        return True

    def _held(self, work: Callable[[], T]) -> T:
        if not self.is_sqlite:
            return self._as_holder(work)
        with self._lock:
            return self._as_holder(work)

    def _as_holder(self, work: Callable[[], T]) -> T:
        me = _thread_id()
        self._holders.add(me)
        try:
            return work()
        finally:
            self._holders.discard(me)

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A write transaction, committed at the end (rolled back on an exception)."""
        with self.engine().begin() as connection:
            yield connection

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        """A connection for reading (SQLite: a plain ``BEGIN``, which takes no write lock)."""
        with self.engine().connect().execution_options(read_only=True) as connection:
            yield connection

    def take_turns(self, db: sa.Connection, store: str, owner: str) -> None:
        """Make the checks of ``owner``'s bounds in ``store`` take turns across workers and replicas until the
        transaction ``db`` ends (SQLite: its write lock, taken at ``BEGIN IMMEDIATE``, already does)."""
        if not self.is_sqlite:
            db.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": f"{store}:{owner}"})

    def upsert(self, table: sa.Table) -> Any:
        """``INSERT`` into ``table`` with this dialect's ``ON CONFLICT`` clauses."""
        return (sqlite.insert(table) if self.is_sqlite else postgresql.insert(table))

    def engine(self) -> sa.Engine:
        """This process's engine (connections must not cross a fork), its schema migrated at first use."""
        if self._pid != os.getpid() or self._engine is None:
            if self._engine is not None:
                self._engine.dispose(close=False)  # the parent's connections stay the parent's
            engine = self._new_engine()
            self._migrate(engine)  # (a database that is down: tried again at the next call)
            self._pid, self._engine = os.getpid(), engine
        return self._engine

    def close(self) -> None:
        """Close this process's connections (the app's teardown); a later call opens them again."""
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
        self._engine = None

    def _new_engine(self) -> sa.Engine:
        if not self.is_sqlite:
            return sa.create_engine(self.url, pool_pre_ping=True, pool_size=4, max_overflow=4, hide_parameters=True,
                                    pool_timeout=self._timeout, connect_args={"connect_timeout": 5})
        path = Path(self.url.removeprefix("sqlite:///"))
        private_folder(path.parent)  # keys' usage, stored conversations: the server's user's alone
        _create_private(path)  # SQLite gives its -wal and -shm files the same mode
        engine = sa.create_engine(self.url, hide_parameters=True,
                                  connect_args={"timeout": self._timeout, "check_same_thread": False})
        sa.event.listen(engine, "connect", _sqlite_connected)
        sa.event.listen(engine, "begin", _sqlite_begin)
        return engine

    def _migrate(self, engine: sa.Engine) -> None:
        with engine.begin() as connection:
            if not self.is_sqlite:  # one replica at a time; the others wait, then find it done
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                                   {"key": zlib.crc32(b"phi-api schema")})
            _VERSIONS.create(connection, checkfirst=True)
            done = connection.scalar(sa.select(_VERSIONS.c.version).where(_VERSIONS.c.store == self.name)) or 0
            for step in self._steps[done:]:
                step(connection)
            if done < len(self._steps):
                statement = self.upsert(_VERSIONS).values(store=self.name, version=len(self._steps))
                connection.execute(statement.on_conflict_do_update(index_elements=["store"],
                                                                   set_={"version": len(self._steps)}))


def _failure_kind(error: BaseException) -> str:
    """``unavailable`` for a database that is down, restarting or busy past its timeout (what clients get 503 for:
    web.foreign), ``other`` for the rest."""
    unavailable = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError)
    return "unavailable" if isinstance(error, unavailable) else "other"


def _create_private(path: Path) -> None:
    """Create the database file readable by its owner alone, if it is missing. An existing one is never opened here:
    closing any descriptor of a file drops every POSIX lock the process holds on it, its SQLite connections' too
    (another store's, on the same file), and a connection that believes itself the last one then checkpoints and
    deletes the WAL under the other processes."""
    if path.exists():
        return
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:  # another process made it meanwhile
        pass


def private_folder(folder: Path) -> None:
    """Make ``folder``, and each of its missing parents, readable by its owner alone (an existing one is left as it
    is: ``phi-api check`` warns of one others can read)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        each.mkdir(mode=0o700, exist_ok=True)


def _sqlite_connected(dbapi_connection: Any, record: Any) -> None:
    dbapi_connection.isolation_level = None  # transactions are begun by _sqlite_begin, not by the driver
    if dbapi_connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:  # switching takes the file's lock at once, with no busy wait: workers starting together collide
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:  # another connection is switching it now: WAL is the file's, once set
            pass


def _sqlite_begin(connection: sa.Connection) -> None:
    read_only = connection.get_execution_options().get("read_only", False)
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def owner_column() -> sa.Column:
    """The key (by name) a row belongs to; rows of a release before keys had owners belong to no key ("")."""
    return sa.Column("owner", sa.String(255), nullable=False, server_default="")


def mine(table: sa.Table, scope: str | None) -> Any:
    """The rows of ``table`` that ``scope`` sees: one owner's, or everyone's (None)."""
    return sa.true() if scope is None else table.c.owner == scope


def create_tables(metadata: sa.MetaData) -> Migration:
    """The first step of every store: its tables made, and the columns an earlier release's tables lack added."""

    def step(connection: sa.Connection) -> None:
        metadata.create_all(connection, checkfirst=True)
        inspector = sa.inspect(connection)
        for table in metadata.sorted_tables:
            present = {column["name"] for column in inspector.get_columns(table.name)}
            for column in table.columns:
                if column.name not in present:
                    kind = column.type.compile(dialect=connection.dialect)
                    given = getattr(column.server_default, "arg", None)
                    default = f" NOT NULL DEFAULT '{given}'" if isinstance(given, str) else ""
                    connection.execute(sa.text(f'ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}{default}'))

    return step


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
