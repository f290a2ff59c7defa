"""API keys with names and limits, and what each key used, counted alike by every worker.

Keys come from ``API_KEYS`` (comma-separated: named ``key-1``, ``key-2``, ..., no limits) and from
``API_KEYS_FILE``, a JSON file of named keys with optional limits::

    {"keys": [{"name": "team-a", "key": "sk-...", "requests_per_minute": 60, "tokens_per_minute": 40000,
               "tokens_per_day": 1000000, "admin": false}]}

An entry may hold its key's SHA-256 (``"key_sha256": "<64 hex digits>"``, what ``phi-api keys add`` writes) instead
of the key: the server then never holds the key itself. Every key is kept as its digest, and a supplied key's
digest is compared with each in constant time.

A key's name, never the key, appears in logs, ``/metrics`` and the usage route. Limits count in fixed windows
(the current minute, the current UTC day), in the server's database (an SQLite file in the data folder, or
PostgreSQL shared by replicas), so that every worker of every replica sees the same counts: a request is refused
(429, with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers) when its key has used up a limit. Its tokens are
budgeted before it runs: its worst case (:meth:`Usage.reserve`) is held against the key's tokens per minute and per
day while it runs (a request that cannot fit is refused before any work), then released (:meth:`Usage.settle`)
once what it did is recorded (:meth:`Usage.record`, as each of its choices ends, however it ends). A reservation
lasts at most as long as a request may run, so that one of a worker that died does not hold a key's budget. Every
answer to a key with limits carries the same headers, reservations counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phi_api.errors import KeysFileError
from phi_api.storage.database import Database, create_tables, off_the_hub

LIMITS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day")
DAY = 86_400
_TABLES = sa.MetaData()
_WINDOWS = sa.Table("windows", _TABLES, sa.Column("name", sa.String(255), primary_key=True),
                    sa.Column("kind", sa.String(16), primary_key=True), sa.Column("start", sa.Float, primary_key=True),
                    sa.Column("requests", sa.BigInteger), sa.Column("tokens", sa.BigInteger))
_TOTALS = sa.Table("totals", _TABLES, sa.Column("name", sa.String(255), primary_key=True),
                   *(sa.Column(column, sa.BigInteger)
                     for column in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")))
_HELD = sa.Table("reservations", _TABLES, sa.Column("id", sa.String(32), primary_key=True),
                 sa.Column("name", sa.String(255), index=True), sa.Column("tokens", sa.BigInteger),
                 sa.Column("until", sa.Float))  # a running request's worst case, held until it is settled


def digest(secret: str) -> bytes:
    """A key's SHA-256, as keys are kept and compared."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


@dataclass(frozen=True)
class Key:
    """A named key (kept as its SHA-256) and its limits (None: no limit)."""

    name: str
    sha256: bytes = field(repr=False)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    admin: bool = False  # manages models, sees every key's usage, files, batches and responses
    max_concurrent_requests: int | None = None  # its requests running at once in the whole server (None: no cap)
    raise_priority: bool = False  # may ask for a priority below the default 0 (sooner than others)

    @property
    def limited(self) -> bool:
        return any(getattr(self, limit) is not None for limit in LIMITS)


def read_keys(path: str, plain: tuple[str, ...]) -> tuple[Key, ...]:
    """The keys of ``API_KEYS`` (``plain``) and of the file at ``path`` ("": none)."""
    keys = [Key(f"key-{index}", digest(secret)) for index, secret in enumerate(plain, start=1)]
    if path:
        try:
            entries = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))["keys"]
            if not isinstance(entries, list):
                raise TypeError("keys is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeysFileError(f"API_KEYS_FILE {path}: not a JSON object with a list of keys ({exc})") from None
        keys += [_entry(entry, index, path) for index, entry in enumerate(entries, start=1)]
    names = [key.name for key in keys]
    if len(set(names)) != len(names) or len({key.sha256 for key in keys}) != len(keys):
        raise KeysFileError(f"API_KEYS_FILE {path}: every key and every name must be different")
    return tuple(keys)


def _entry(entry: Any, index: int, path: str) -> Key:
    where = f"API_KEYS_FILE {path}, key {index}"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise KeysFileError(f"{where}: needs a name")
    unknown = set(entry) - {"name", "key", "key_sha256", "admin", "max_concurrent_requests", "raise_priority", *LIMITS}
    if unknown:
        raise KeysFileError(f"{where} ({entry['name']}): unknown fields {', '.join(sorted(unknown))}")
    for limit in (*LIMITS, "max_concurrent_requests"):
        value = entry.get(limit)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise KeysFileError(f"{where} ({entry['name']}): {limit} must be a positive integer")
    for flag in ("admin", "raise_priority"):
        if not isinstance(entry.get(flag, False), bool):
            raise KeysFileError(f"{where} ({entry['name']}): {flag} must be true or false")
    return Key(entry["name"], _entry_digest(entry, where), entry.get("requests_per_minute"),
               entry.get("tokens_per_minute"), entry.get("tokens_per_day"), bool(entry.get("admin")),
               entry.get("max_concurrent_requests"), bool(entry.get("raise_priority")))


def _entry_digest(entry: dict[str, Any], where: str) -> bytes:
    """The entry's key as its digest: from ``key`` (at least 8 characters) or ``key_sha256`` (64 hex digits)."""
    if ("key" in entry) == ("key_sha256" in entry):
        raise KeysFileError(f"{where} ({entry['name']}): needs a key or its key_sha256, one of them")
    if "key" in entry:
        if not isinstance(entry["key"], str) or len(entry["key"]) < 8:
            raise KeysFileError(f"{where} ({entry['name']}): needs a key of at least 8 characters")
        return digest(entry["key"])
    hashed = entry["key_sha256"]
    if not isinstance(hashed, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hashed):
        raise KeysFileError(f"{where} ({entry['name']}): key_sha256 must be 64 hexadecimal digits")
    return bytes.fromhex(hashed)


@dataclass(frozen=True)
class Decision:
    """Whether a request may run now, the headers to send either way, and why not (``too_large``: its worst case
    exceeds a token limit whole)."""

    allowed: bool
    headers: dict[str, str]
    reason: str = ""
    held: str = ""  # the reservation made for it (:meth:`Usage.reserve`), to settle when it ends


@dataclass(frozen=True)
class Counts:
    """What a key used in the current windows, its running requests' reservations included in the tokens."""

    requests: int
    minute_tokens: int
    day_tokens: int


class Usage:
    """Each key's counts, in a database every worker (and every replica) shares."""

    def __init__(self, url: str) -> None:
        # The second step: the reservations' table, in a database an earlier release made.
        self.database = Database(url, "usage", (create_tables(_TABLES), create_tables(_TABLES)))

    @off_the_hub
    def admit(self, key: Key, now: float | None = None) -> Decision:
        """Count a request of ``key`` if its limits allow it now."""
        now = time.time() if now is None else now
        with self.database.begin() as db:
            counts = self._locked(db, key, now)
            reason = _over(key, counts)
            if not reason:
                self._add(db, key.name, "minute", _minute(now), requests=1, tokens=0)
                db.execute(_TOTALS.update().where(_TOTALS.c.name == key.name)
                           .values(requests=_TOTALS.c.requests + 1))
                counts = dataclasses.replace(counts, requests=counts.requests + 1)
        return Decision(not reason, _headers(key, counts, now, reason), reason)

    @off_the_hub
    def reserve(self, key: Key, tokens: int, lasts: float, now: float | None = None) -> Decision:
        """Hold ``tokens`` (a request's worst case) against ``key``'s token limits for at most ``lasts`` seconds, if
        they fit beside what it used and what its running requests hold; the reservation's id is the decision's
        ``held`` (nothing is held for a key without token limits)."""
        now = time.time() if now is None else now
        if key.tokens_per_minute is None and key.tokens_per_day is None:
            return Decision(True, {})
        with self.database.begin() as db:
            counts = self._locked(db, key, now)
            reason = _over(key, counts, tokens)
            held = ""
            if not reason:
                held = uuid.uuid4().hex
                db.execute(_HELD.insert().values(id=held, name=key.name, tokens=tokens, until=now + lasts))
                counts = dataclasses.replace(counts, minute_tokens=counts.minute_tokens + tokens,
                                             day_tokens=counts.day_tokens + tokens)
        return Decision(not reason, _headers(key, counts, now, reason), reason, held)

    @off_the_hub
    def settle(self, held: str) -> None:
        """Release the reservation ``held`` (its request has ended and what it did is recorded)."""
        if held:
            with self.database.begin() as db:
                db.execute(_HELD.delete().where(_HELD.c.id == held))

    def _locked(self, db: sa.Connection, key: Key, now: float) -> Counts:
        """``key``'s counts, its row locked: its admissions take turns in every replica (SQLite's write lock does as
        much)."""
        db.execute(self.database.upsert(_TOTALS).values(name=key.name, requests=0, prompt_tokens=0,
                                                        cached_tokens=0, completion_tokens=0)
                   .on_conflict_do_nothing(index_elements=["name"]))
        db.execute(sa.select(_TOTALS.c.name).where(_TOTALS.c.name == key.name).with_for_update())
        return _counts(db, key.name, now)

    @off_the_hub
    def record(self, key: Key, prompt: int, cached: int, completion: int, now: float | None = None) -> None:
        """Count a finished generation's tokens."""
        now = time.time() if now is None else now
        with self.database.begin() as db:
            for kind, start in (("minute", _minute(now)), ("day", _day(now))):
                self._add(db, key.name, kind, start, requests=0, tokens=prompt + completion)
            added = {"prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion}
            statement = self.database.upsert(_TOTALS).values(name=key.name, requests=0, **added)
            db.execute(statement.on_conflict_do_update(index_elements=["name"], set_={
                column: _TOTALS.c[column] + statement.excluded[column] for column in added}))
            db.execute(_WINDOWS.delete().where(_WINDOWS.c.start < now - 2 * DAY))
            db.execute(_HELD.delete().where(_HELD.c.until < now))

    def _add(self, db: sa.Connection, name: str, kind: str, start: float, *, requests: int, tokens: int) -> None:
        statement = self.database.upsert(_WINDOWS).values(name=name, kind=kind, start=start, requests=requests,
                                                          tokens=tokens)
        db.execute(statement.on_conflict_do_update(index_elements=["name", "kind", "start"], set_={
            "requests": _WINDOWS.c.requests + statement.excluded.requests,
            "tokens": _WINDOWS.c.tokens + statement.excluded.tokens}))

    @off_the_hub
    def windows(self, name: str, now: float) -> dict[str, int]:
        """What ``name`` used this minute and this UTC day, and what its running requests hold."""
        with self.database.read() as db:
            requests, minute_tokens = _window(db, name, _minute(now))
            _, day_tokens = _window(db, name, _day(now), "day")
            held = _held(db, name, now)
        return {"requests_this_minute": requests, "tokens_this_minute": minute_tokens, "tokens_today": day_tokens,
                "tokens_reserved": held}

    @off_the_hub
    def totals(self) -> dict[str, dict[str, int]]:
        with self.database.read() as db:
            rows = db.execute(sa.select(_TOTALS)).all()
        return {name: {"requests": requests, "prompt_tokens": prompt, "cached_tokens": cached,
                       "completion_tokens": completion} for name, requests, prompt, cached, completion in rows}


def _minute(now: float) -> float:
    return math.floor(now / 60) * 60


def _day(now: float) -> float:
    return math.floor(now / DAY) * DAY


def _window(db: sa.Connection, name: str, start: float, kind: str = "minute") -> tuple[int, int]:
    row = db.execute(sa.select(_WINDOWS.c.requests, _WINDOWS.c.tokens).where(
        _WINDOWS.c.name == name, _WINDOWS.c.kind == kind, _WINDOWS.c.start == start)).first()
    return (row[0], row[1]) if row else (0, 0)


def _held(db: sa.Connection, name: str, now: float) -> int:
    """Tokens ``name``'s running requests hold (reservations of requests still within their time)."""
    return int(db.scalar(sa.select(sa.func.coalesce(sa.func.sum(_HELD.c.tokens), 0))
                         .where(_HELD.c.name == name, _HELD.c.until >= now)) or 0)


def _counts(db: sa.Connection, name: str, now: float) -> Counts:
    """What ``name`` used in the current windows; a running request's reservation counts in both."""
    requests, minute_tokens = _window(db, name, _minute(now))
    _, day_tokens = _window(db, name, _day(now), "day")
    held = _held(db, name, now)
    return Counts(requests, minute_tokens + held, day_tokens + held)


def _over(key: Key, counts: Counts, tokens: int = 0) -> str:
    """Which of ``key``'s limits is used up, or would be by ``tokens`` more ("" when none); ``too_large`` when
    ``tokens`` alone exceed a token limit."""
    if tokens:
        if any(most is not None and tokens > most for most in (key.tokens_per_minute, key.tokens_per_day)):
            return "too_large"
        for limit, used in (("tokens_per_minute", counts.minute_tokens), ("tokens_per_day", counts.day_tokens)):
            most = getattr(key, limit)
            if most is not None and used + tokens > most:
                return limit
        return ""
    for limit, used in (("requests_per_minute", counts.requests), ("tokens_per_minute", counts.minute_tokens),
                        ("tokens_per_day", counts.day_tokens)):
        most = getattr(key, limit)
        if most is not None and used >= most:
            return limit
    return ""


def _headers(key: Key, counts: Counts, now: float, reason: str) -> dict[str, str]:
    """OpenAI's rate-limit headers for ``key`` (none for a key without limits), and ``Retry-After`` when refused."""
    requests, minute_tokens, day_tokens = counts.requests, counts.minute_tokens, counts.day_tokens
    headers: dict[str, str] = {}
    to_minute = math.ceil(60 - now % 60)
    to_day = math.ceil(DAY - now % DAY)
    if key.requests_per_minute is not None:
        headers.update({"x-ratelimit-limit-requests": str(key.requests_per_minute),
                        "x-ratelimit-remaining-requests": str(max(0, key.requests_per_minute - requests)),
                        "x-ratelimit-reset-requests": f"{to_minute}s"})
    token_limit = key.tokens_per_minute if key.tokens_per_minute is not None else key.tokens_per_day
    if token_limit is not None:
        used, reset = (minute_tokens, to_minute) if key.tokens_per_minute is not None else (day_tokens, to_day)
        headers.update({"x-ratelimit-limit-tokens": str(token_limit),
                        "x-ratelimit-remaining-tokens": str(max(0, token_limit - used)),
                        "x-ratelimit-reset-tokens": f"{reset}s"})
    if reason:
        headers["Retry-After"] = str(to_day if reason in ("tokens_per_day", "too_large") else to_minute)
    return headers


@dataclass
class Keys:
    """The server's keys and their usage (a resource of the app)."""

    keys: tuple[Key, ...]
    usage: Usage

    def named(self, name: str) -> Key | None:
        """The key called ``name``, if the server still accepts one so named."""
        return next((key for key in self.keys if key.name == name), None)

    def identify(self, supplied: str) -> Key | None:
        """The key ``supplied`` is, comparing its digest with every key's in constant time."""
        found, given = None, digest(supplied)
        for key in self.keys:
            if hmac.compare_digest(given, key.sha256):
                found = key
        return found
