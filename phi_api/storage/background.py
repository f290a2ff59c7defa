"""Background responses of OpenAI's Responses API (``background: true``): queued in the server's database, run by
any worker of any replica, polled, cancelled, and, when streamed, their events kept for a client that resumes.

In the database beside the stored responses (an SQLite file in the data folder, or PostgreSQL shared by replicas):
each background response's request body, its key (by name) and priority, its state (OpenAI's statuses: ``queued``,
``in_progress``, then ``completed``, ``incomplete``, ``failed`` or ``cancelled``) and its latest response object;
and the events of a streamed one, by ``sequence_number``. A queued response is claimed in a transaction (on
PostgreSQL with ``FOR UPDATE SKIP LOCKED``), so it runs once however many workers and replicas there are; the claim is
a lease, renewed while it runs. A claimed response is shown ``queued`` until the gate has taken it (:meth:`start`),
so one the gate refused, or whose worker stopped before the gate took it, is still queued for its client. A response
whose worker died (its lease ran out, or its neighbour on the same machine saw the process gone) is put back in the
queue when it had not started, and marked failed, never left in progress, when it had: its client may have read part
of its stream, so it is not run again. Queued ones wait across restarts.

Bounded: at most ``max_active`` queued or running responses a key (more: refused before anything is kept), and at
most ``max_ended`` ended ones a key (when another of the key's ends, its oldest-ended go, with their events; never
another key's). An ended response keeps its object but not its request body (up to a request's size): it is never
run again. The newest ``max_events`` events of a running response are kept (a resume from before them is refused),
events kept ``events_seconds`` after the response ended, and every row gone ``max_age`` after its response was made.

No Flask here: the routes (:mod:`phi_api.api.responses`) and the runner (:mod:`phi_api.background.runner`) use it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlalchemy as sa

from phi_api import jsontext
from phi_api.storage.database import Database, create_tables, mine, off_the_hub, owner_column

ACTIVE = ("queued", "in_progress")
_QUEUED_AGAIN = {"state": "queued", "claimant": None, "lease_until": None}  # a claimed row given back
TERMINAL = ("completed", "incomplete", "failed", "cancelled")
_NO_BODY = "{}"  # an ended response's body: it is never run again (the column is NOT NULL in every release's table)

_TABLES = sa.MetaData()
_RUNS = sa.Table("background_responses", _TABLES, sa.Column("id", sa.String(255), primary_key=True),
                 sa.Column("created", sa.Float, nullable=False), sa.Column("state", sa.String(16), nullable=False),
                 sa.Column("priority", sa.BigInteger, nullable=False), sa.Column("stream", sa.Integer, nullable=False),
                 sa.Column("body", sa.Text, nullable=False), sa.Column("response", sa.Text, nullable=False),
                 sa.Column("claimant", sa.String(255)), sa.Column("lease_until", sa.Float),
                 sa.Column("ended", sa.Float), sa.Column("not_before", sa.Float), owner_column(),
                 sa.Index("background_waiting", "state", "priority"))
_BY_OWNER_ENDED = sa.Index("background_ended", _RUNS.c.owner, _RUNS.c.ended)  # a key's ended ones, for their bound
_EVENTS = sa.Table("background_events", _TABLES, sa.Column("response_id", sa.String(255), primary_key=True),
                   sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
                   sa.Column("event", sa.Text, nullable=False))


class BackgroundFull(Exception):
    """The key runs or waits on as many background responses as it may (the message says how many)."""


class EventsGone(Exception):
    """The events asked for are no longer kept (the message says from where they are)."""


class Recovered(NamedTuple):
    """What :meth:`BackgroundStore.recover` did with the responses of workers that are gone."""

    requeued: int  #: never started: back in the queue
    failed: int  #: had started: marked failed


@dataclass(frozen=True)
class Job:
    """A claimed background response: what its worker needs to run it, and the claim that holds it."""

    id: str
    owner: str
    body: dict[str, Any]
    priority: int
    stream: bool
    created: float
    claimant: str


@dataclass(frozen=True)
class Background:
    """A background response as a client sees it: its state, its latest response object, whether it streams."""

    state: str
    response: dict[str, Any]
    stream: bool


class BackgroundStore:
    """Background responses by id, with their owners, in the database at ``url``.

    Methods a client's request uses take a ``scope``: the owner whose responses are visible, or None for every
    owner's. The caller makes the objects and events (:mod:`phi_api.protocols.responses`)."""

    def __init__(self, url: str, *, max_active: int, max_ended: int, max_events: int, events_seconds: float,
                 max_age: float, lease: float = 30.0) -> None:
        self.max_active = max_active
        self.max_ended = max_ended
        self.max_events = max_events
        self.events_seconds = events_seconds
        self.max_age = max_age
        self.lease = lease
        self.database = Database(url, "background", (create_tables(_TABLES), _ended_without_bodies), timeout=10)

    # A client's side ------------------------------------------------------------------------------------

    @off_the_hub
    def create(self, response: dict[str, Any], body: dict[str, Any], owner: str, priority: int,
               events: list[dict[str, Any]]) -> None:
        """Queue ``response`` (its ``id``, ``created_at``) of ``owner`` with the request ``body`` it answers, and,
        when it streams, its first ``events``; :class:`BackgroundFull` past the key's bound."""
        with self.database.begin() as db:
            active = db.scalar(sa.select(sa.func.count()).select_from(_RUNS).where(
                _RUNS.c.owner == owner, _RUNS.c.state.in_(ACTIVE))) or 0
            if active >= self.max_active:
                raise BackgroundFull(f"{active} background responses of this key are queued or running, the most "
                                     "this server keeps for one key; retry once one has ended.")
            db.execute(_RUNS.insert().values(
                id=response["id"], created=float(response["created_at"]), state=response["status"], priority=priority,
                stream=int(bool(body.get("stream"))), body=json.dumps(body), response=json.dumps(response),
                owner=owner))
            _add_events(db, response["id"], events)

    @off_the_hub
    def get(self, response_id: str, scope: str | None = None) -> Background | None:
        """A background response, or None (also another owner's, and one past its age)."""
        with self.database.read() as db:
            row = db.execute(sa.select(_RUNS.c.state, _RUNS.c.response, _RUNS.c.stream).where(
                _RUNS.c.id == response_id, _RUNS.c.created >= time.time() - self.max_age,
                mine(_RUNS, scope))).first()
        return None if row is None else Background(row[0], json.loads(row[1]), bool(row[2]))

    @off_the_hub
    def events(self, response_id: str, after: int, scope: str | None = None) -> list[dict[str, Any]]:
        """The events of a streamed response after ``after`` (a ``sequence_number``), in order; :class:`EventsGone`
        when some of them are no longer kept."""
        with self.database.read() as db:
            if db.scalar(sa.select(_RUNS.c.id).where(_RUNS.c.id == response_id, mine(_RUNS, scope))) is None:
                return []
            rows = db.execute(sa.select(_EVENTS.c.seq, _EVENTS.c.event).where(
                _EVENTS.c.response_id == response_id, _EVENTS.c.seq > after).order_by(_EVENTS.c.seq)).all()
        if rows and rows[0][0] != after + 1:
            raise EventsGone(f"The events after {after} are no longer kept; the oldest kept is {rows[0][0]}.")
        return [json.loads(event) for _, event in rows]

    @off_the_hub
    def cancel(self, response_id: str, cancelled: Callable[[dict[str, Any]], dict[str, Any]],
               scope: str | None = None) -> Background | None:
        """Cancel a queued or running response: its object becomes ``cancelled(object)``, and its worker stops it at
        its next look (:meth:`renew`). The response as it is now (unchanged when it had ended); None when there is
        none."""
        with self.database.begin() as db:
            row = db.execute(sa.select(_RUNS.c.state, _RUNS.c.response, _RUNS.c.stream).where(
                _RUNS.c.id == response_id, mine(_RUNS, scope)).with_for_update()).first()
            if row is None:
                return None
            state, response, stream = row[0], json.loads(row[1]), bool(row[2])
            if state not in ACTIVE:
                return Background(state, response, stream)
            response = cancelled(response)
            db.execute(_RUNS.update().where(_RUNS.c.id == response_id).values(
                state="cancelled", response=json.dumps(response), ended=time.time(), body=_NO_BODY))
            _bound_ended(db, response_id, self.max_ended)
        return Background("cancelled", response, stream)

    @off_the_hub
    def delete(self, response_id: str, scope: str | None = None) -> bool:
        """Forget a background response and its events (a running one stops at its worker's next look); whether it
        was there."""
        with self.database.begin() as db:
            gone = db.execute(_RUNS.delete().where(_RUNS.c.id == response_id, mine(_RUNS, scope))).rowcount > 0
            if gone:
                db.execute(_EVENTS.delete().where(_EVENTS.c.response_id == response_id))
        return gone

    # The runner's side ----------------------------------------------------------------------------------

    @off_the_hub
    def claim(self, claimant: str) -> Job | None:
        """Take the queued response to run next, for ``claimant`` (a worker): the soonest priority's oldest. Its
        object stays ``queued`` until :meth:`start`."""
        now = time.time()
        with self.database.begin() as db:
            row = db.execute(
                sa.select(_RUNS.c.id, _RUNS.c.owner, _RUNS.c.body, _RUNS.c.priority, _RUNS.c.stream, _RUNS.c.created,
                          _RUNS.c.response)
                .where(_RUNS.c.state == "queued", sa.or_(_RUNS.c.not_before.is_(None), _RUNS.c.not_before <= now))
                .order_by(_RUNS.c.priority, _RUNS.c.created).limit(1)
                .with_for_update(skip_locked=True)).first()
            if row is None:
                return None
            db.execute(_RUNS.update().where(_RUNS.c.id == row[0]).values(
                state="in_progress", claimant=claimant, lease_until=now + self.lease))
        return Job(row[0], row[1], json.loads(row[2]), int(row[3]), bool(row[4]), float(row[5]), claimant)

    @off_the_hub
    def start(self, job: Job) -> bool:
        """Show a claimed response as ``in_progress``: the gate has taken it, it runs. False when the claim was lost
        (it was cancelled or deleted meanwhile)."""
        with self.database.begin() as db:
            response = _object(db, job.id)
            return response is not None and db.execute(_held(job).values(
                response=json.dumps({**response, "status": "in_progress"}), lease_until=time.time() + self.lease)
            ).rowcount > 0

    @off_the_hub
    def renew(self, job: Job) -> bool:
        """Extend the claim on a running response; False when it must stop (cancelled, deleted, or its lease ran
        out and it was marked failed)."""
        with self.database.begin() as db:
            return db.execute(_held(job).values(lease_until=time.time() + self.lease)).rowcount > 0

    @off_the_hub
    def add_events(self, job: Job, events: list[dict[str, Any]]) -> bool:
        """Keep a running response's next ``events`` (the oldest past the bound go); False when it must stop."""
        with self.database.begin() as db:
            if not db.execute(_held(job).values(lease_until=time.time() + self.lease)).rowcount:
                return False
            _add_events(db, job.id, events)
            newest = events[-1]["sequence_number"] if events else 0
            db.execute(_EVENTS.delete().where(_EVENTS.c.response_id == job.id,
                                              _EVENTS.c.seq <= newest - self.max_events))
        return True

    @off_the_hub
    def finish(self, job: Job, response: dict[str, Any], events: list[dict[str, Any]] | None = None) -> bool:
        """Record a response's end (its object's ``status``) with its last events; False when the claim was lost
        (it was cancelled or deleted meanwhile: that stands)."""
        with self.database.begin() as db:
            ended = _end(db, _held(job), job.id, response, events or [])
            if ended:
                _bound_ended(db, job.id, self.max_ended)
        return ended

    @off_the_hub
    def release(self, job: Job, not_before: float) -> None:
        """Put a claimed response back in the queue, not to be claimed before ``not_before``: it could not start now
        (the server is full, or its key's limits are used up for the moment)."""
        with self.database.begin() as db:  # its object still reads ``queued``: only :meth:`start` changes that
            db.execute(_held(job).values(not_before=not_before, **_QUEUED_AGAIN))

    @off_the_hub
    def fail(self, job: Job, failed: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
        """Record that a claimed response failed before it ran (its object: ``failed(object)``); False when the
        claim was lost meanwhile."""
        with self.database.begin() as db:
            response = _object(db, job.id)
            ended = response is not None and _failed(db, _held(job), job.id, failed(response), job.stream)
            if ended:
                _bound_ended(db, job.id, self.max_ended)
        return ended

    @off_the_hub
    def recover(self, alive: Callable[[str], bool],
                failed: Callable[[dict[str, Any]], dict[str, Any]]) -> Recovered:
        """Each claimed response whose worker is gone (no longer ``alive(claimant)``, or its lease ran out): back in
        the queue when it had not started, else marked failed (its object: ``failed(object)``; a streamed one's last
        event ``response.failed``). How many went each way."""
        now = time.time()
        with self.database.begin() as db:
            rows = db.execute(sa.select(_RUNS.c.id, _RUNS.c.claimant, _RUNS.c.lease_until, _RUNS.c.response,
                                        _RUNS.c.stream).where(_RUNS.c.state == "in_progress")
                              .with_for_update(skip_locked=True)).all()
            dead = [row for row in rows if (row[2] or 0.0) < now or not alive(row[1] or "")]
            lost = [id_ for id_, _, _, response, stream in dead
                    if _orphaned(db, id_, json.loads(response), bool(stream), failed)]
            for id_ in lost:
                _bound_ended(db, id_, self.max_ended)
        return Recovered(requeued=len(dead) - len(lost), failed=len(lost))

    @off_the_hub
    def expire(self) -> None:
        """Drop events kept past ``events_seconds`` after their response ended, and responses past ``max_age``."""
        now = time.time()
        with self.database.begin() as db:
            old = sa.select(_RUNS.c.id).where(_RUNS.c.created < now - self.max_age)
            db.execute(_EVENTS.delete().where(_EVENTS.c.response_id.in_(old)))
            db.execute(_RUNS.delete().where(_RUNS.c.created < now - self.max_age))
            ended = sa.select(_RUNS.c.id).where(_RUNS.c.ended < now - self.events_seconds)
            db.execute(_EVENTS.delete().where(_EVENTS.c.response_id.in_(ended)))

    @off_the_hub
    def waiting(self) -> dict[str, int]:
        """How many background responses are queued and in progress now (for /metrics)."""
        with self.database.read() as db:
            rows = db.execute(sa.select(_RUNS.c.state, sa.func.count()).where(_RUNS.c.state.in_(ACTIVE))
                              .group_by(_RUNS.c.state)).all()
        return {state: int(count) for state, count in rows}


def _object(db: sa.Connection, response_id: str) -> dict[str, Any] | None:
    """A background response's object as kept, or None when it is gone."""
    text = db.scalar(sa.select(_RUNS.c.response).where(_RUNS.c.id == response_id))
    return None if text is None else json.loads(text)


def _end(db: sa.Connection, row: Any, response_id: str, response: dict[str, Any],
         events: list[dict[str, Any]]) -> bool:
    """Record a response's end (``response``, its last ``events``) through ``row``, an update of its row; whether
    the update found it (a claim's, :func:`_held`, finds it only while the claim holds)."""
    ended = db.execute(row.values(state=response["status"], response=jsontext.dumps_in_slices(response),
                                  ended=time.time(), claimant=None, lease_until=None, body=_NO_BODY)).rowcount > 0
    if ended:
        _add_events(db, response_id, events)
    return ended


def _failed(db: sa.Connection, row: Any, response_id: str, ended: dict[str, Any], stream: bool) -> bool:
    """:func:`_end` for a response that failed: a streamed one's last event is ``response.failed``."""
    return _end(db, row, response_id, ended, [_failed_event(db, response_id, ended)] if stream else [])


def _orphaned(db: sa.Connection, response_id: str, response: dict[str, Any], stream: bool,
              failed: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """A response whose worker is gone: back in the queue when the gate never took it (False), else failed (True)."""
    row = _RUNS.update().where(_RUNS.c.id == response_id)
    if response["status"] == "queued":
        db.execute(row.values(**_QUEUED_AGAIN))
        return False
    return _failed(db, row, response_id, failed(response), stream)


def _bound_ended(db: sa.Connection, response_id: str, most: int) -> None:
    """After ``response_id`` ended: its owner's ended responses past ``most`` go, the oldest-ended first, with their
    events (queued and running ones, and other owners', stay). On PostgreSQL, ends of one key at the same moment do
    not see each other: each may leave one over the bound (at most ``max_active`` in all), until the key's next end."""
    owner = db.scalar(sa.select(_RUNS.c.owner).where(_RUNS.c.id == response_id))
    ended = sa.and_(_RUNS.c.owner == owner, _RUNS.c.state.in_(TERMINAL))
    kept = sa.select(_RUNS.c.id).where(ended).order_by(_RUNS.c.ended.desc(), _RUNS.c.id.desc()).limit(most)
    gone = [id_ for (id_,) in db.execute(sa.select(_RUNS.c.id).where(ended, _RUNS.c.id.not_in(kept)))]
    if gone:
        db.execute(_EVENTS.delete().where(_EVENTS.c.response_id.in_(gone)))
        db.execute(_RUNS.delete().where(_RUNS.c.id.in_(gone)))


def _ended_without_bodies(connection: sa.Connection) -> None:
    """The second step of the schema: the index of each key's ended responses (for their bound), and no request body
    left in an ended one (an earlier release kept them until the response's age)."""
    _BY_OWNER_ENDED.create(connection, checkfirst=True)
    connection.execute(_RUNS.update().where(_RUNS.c.state.in_(TERMINAL)).values(body=_NO_BODY))


def _held(job: Job) -> Any:
    """An update of ``job``'s row while ``job``'s claim holds it."""
    return _RUNS.update().where(_RUNS.c.id == job.id, _RUNS.c.state == "in_progress",
                                _RUNS.c.claimant == job.claimant)


def _failed_event(db: sa.Connection, response_id: str, response: dict[str, Any]) -> dict[str, Any]:
    """The event that ends a streamed response that failed, after the events it has."""
    last = db.scalar(sa.select(sa.func.max(_EVENTS.c.seq)).where(_EVENTS.c.response_id == response_id))
    return {"type": "response.failed", "sequence_number": (last or 0) + 1, "response": response}


def _add_events(db: sa.Connection, response_id: str, events: list[dict[str, Any]]) -> None:
    if events:
        db.execute(_EVENTS.insert(), [{"response_id": response_id, "seq": event["sequence_number"],
                                       "event": jsontext.dumps_in_slices(event)} for event in events])
