"""OpenAI's Batch API's files and batches, in the server's database: they survive restarts, worker recycling and,
on PostgreSQL, the replica that made them.

Files (their contents too: a replica needs no shared volume) and batches live in the database, each with its owner;
each batch with a row per line of its input file. A line is claimed in a transaction (on PostgreSQL with
``FOR UPDATE SKIP LOCKED``; SQLite's write lock does as much), so each runs once however many workers and replicas
there are. A claim is a lease: its worker renews it while the line runs; a line whose lease ran out (its replica
died, or stalls) is claimed again, and only the claim that holds the line may record its answer. A worker's dead
neighbours on the same machine are noticed sooner (:meth:`BatchStore.recover`).

A batch's life (OpenAI's statuses): ``validating`` (created; its file's lines are checked and queued at once),
``in_progress`` (a worker took its first line), ``finalizing`` (every line has its answer: the output and error
files are being written), ``completed``; or ``failed`` (its file has bad lines: none runs), ``expired`` (its
``completion_window`` passed: the lines that had not run are reported so), ``cancelling`` then ``cancelled``.

No Flask here: the routes (:mod:`phi_api.api.batches`) and the runner (:mod:`phi_api.batches.runner`) use it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phi_api.errors import BatchError
from phi_api.storage import batch_output
from phi_api.storage.batch_output import OVER_QUOTA
from phi_api.storage.batch_tables import BATCHES, LINES, TURNS
from phi_api.storage.database import Database, Migration, create_tables, mine, off_the_hub
from phi_api.storage.files import (
    CONTENTS,
    FILE_LINES,
    FILES,
    TABLES,
    FileStore,
    Quota,
    page,
    requests_of,
)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
WINDOWS = {"24h": 86_400}  # completion_window: OpenAI accepts only 24h
TERMINAL = ("completed", "failed", "expired", "cancelled")

@dataclass(frozen=True)
class Line:
    """A claimed line of a batch: what to send, where, and the claim that may record its answer."""

    batch_id: str
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]
    owner: str = ""  # the key (by name) that created the batch: the line runs as a request of it
    claimant: str = ""  # the worker that holds it


class BatchStore(FileStore):
    """Files and batches in the database at ``url``, each owned by the key (by name) that made it; claims of lines
    last ``lease`` seconds unless renewed. ``folder``: where an earlier release kept the files' contents (taken
    into the database when it is upgraded); ``quota``: what each key may store; ``longest_line``: a line's most bytes.

    Reading methods take a ``scope``: the owner whose objects are visible, or None for every owner's (an admin key,
    or a server without keys, whose objects all belong to "").
    """

    def __init__(self, url: str, folder: Path | None = None, lease: float = 60.0, quota: Quota = Quota(),
                 longest_line: int | None = None) -> None:
        self.lease, self.longest_line = lease, longest_line  # longest_line: MAX_REQUEST_SIZE_MB (a line is a request)
        # The third step: files in chunks, their lines kept once, the keys' turns (an earlier release's database);
        # the fourth: uploads in flight holding their room in their keys' quotas; the fifth: the answers batches hold.
        super().__init__(Database(url, "batches", (create_tables(TABLES), _contents_from(folder),
                                                   *[create_tables(TABLES)] * 3)), quota)

    answers_held = staticmethod(batch_output.answers_held)

    @off_the_hub
    def delete_file(self, file_id: str, scope: str | None = None) -> bool:
        """Forget a file; its kept lines go too, unless a batch still runs them (they go when it ends)."""
        gone = super().delete_file(file_id, scope)
        if gone:
            with self.database.begin() as db:
                _forget_unused_lines(db, file_id)
        return gone

    # Batches ----------------------------------------------------------------------------------------

    @off_the_hub
    def create_batch(self, input_file_id: str, endpoint: str, window: str, metadata: dict | None,
                     owner: str = "", scope: str | None = None) -> dict[str, Any]:
        """A new batch of ``owner`` of the input file's lines (a file ``scope`` sees), queued (or ``failed``, with
        the bad lines, when any is bad). The file's lines are kept once, at its first batch; this batch's lines
        refer to them."""
        found = self.file(input_file_id, scope)
        if found is None:
            raise BatchError(f"No file with id '{input_file_id}'.", "input_file_id")
        if found["purpose"] != "batch":
            raise BatchError(f"File '{input_file_id}' has purpose '{found['purpose']}', not 'batch'.", "input_file_id")
        with self.database.begin() as db:
            total, errors = requests_of(db, input_file_id, endpoint, self.longest_line)
            batch = _new_batch(input_file_id, endpoint, window, metadata, total, errors)
            db.execute(BATCHES.insert().values(id=batch["id"], object=json.dumps(batch), created_at=time.time(),
                                                owner=owner))
            if not errors:
                numbers = sa.select(sa.literal(batch["id"]), FILE_LINES.c.line, FILE_LINES.c.custom_id,
                                    sa.literal("pending"), FILE_LINES.c.file_id).where(
                    FILE_LINES.c.file_id == input_file_id)
                db.execute(LINES.insert().from_select(["batch_id", "line", "custom_id", "state", "file_id"], numbers))
        return batch

    @off_the_hub
    def batch(self, batch_id: str, scope: str | None = None) -> dict[str, Any] | None:
        with self.database.read() as db:
            found = db.scalar(sa.select(BATCHES.c.object).where(BATCHES.c.id == batch_id, mine(BATCHES, scope)))
        return json.loads(found) if found else None

    @off_the_hub
    def batches(self, limit: int, after: str | None, scope: str | None = None) -> tuple[list[dict], bool]:
        with self.database.read() as db:
            rows = db.scalars(sa.select(BATCHES.c.object).where(mine(BATCHES, scope))
                              .order_by(BATCHES.c.created_at.desc())).all()
        return page([json.loads(row) for row in rows], limit, after)

    @off_the_hub
    def cancel(self, batch_id: str, scope: str | None = None) -> dict[str, Any]:
        """Stop a batch: its lines not yet taken will not run; it is ``cancelled`` once those running end."""
        if self.batch(batch_id, scope) is None:
            raise BatchError(f"No batch with id '{batch_id}'.", None)
        with self.database.begin() as db:  # lines, then the batch: the order every transaction locks them in
            db.execute(LINES.update().where(LINES.c.batch_id == batch_id, LINES.c.state == "pending")
                       .values(state="cancelled"))
            batch = _batch_in(db, batch_id)
            if batch["status"] in TERMINAL or batch["status"] == "finalizing":  # (the lines' update rolls back)
                raise BatchError(f"Batch '{batch_id}' is {batch['status']}: it cannot be cancelled.", None)
            batch.update(status="cancelling", cancelling_at=int(time.time()))
            _save(db, batch)
        self.settle(batch_id)
        return self.batch(batch_id) or batch

    # The runner's side ------------------------------------------------------------------------------

    @off_the_hub
    def claim(self, claimant: str) -> Line | None:
        """Take the next line to run, for ``claimant`` (a worker): a waiting line, or one whose lease ran out; of the
        key whose turn it is (the key that has waited longest since its last line, round robin), its oldest
        batch's first; never of a key resting (:meth:`rest`). None when none waits."""
        now = time.time()
        waiting = sa.or_(LINES.c.state == "pending", sa.and_(LINES.c.state == "running", LINES.c.lease_until < now))
        awake = sa.or_(TURNS.c.rest_until.is_(None), TURNS.c.rest_until <= now)
        body = sa.func.coalesce(LINES.c.body, FILE_LINES.c.body)
        with self.database.begin() as db:
            row = db.execute(
                sa.select(LINES.c.batch_id, LINES.c.line, LINES.c.custom_id, body, BATCHES.c.owner)
                .join(BATCHES, BATCHES.c.id == LINES.c.batch_id)
                .outerjoin(TURNS, TURNS.c.owner == BATCHES.c.owner)
                .outerjoin(FILE_LINES, sa.and_(FILE_LINES.c.file_id == LINES.c.file_id,
                                               FILE_LINES.c.line == LINES.c.line))
                .where(waiting, awake)
                .order_by(sa.func.coalesce(TURNS.c.last_claim, 0.0), BATCHES.c.created_at, LINES.c.line).limit(1)
                .with_for_update(of=LINES, skip_locked=True)).first()
            if row is None:
                return None
            batch_id, number, custom_id, text, key = row
            self.database.take_turns(db, "files", key)
            runs = _taken(db, self.quota, (batch_id, number), key, claimant, now + self.lease)
            turn = self.database.upsert(TURNS).values(owner=key, last_claim=now, rest_until=None)
            db.execute(turn.on_conflict_do_update(index_elements=["owner"], set_={"last_claim": now}))
            batch = _started(db, batch_id, now)
        if not runs:  # its lines are all reported now: the batch ends as its last answer would have ended it
            self.settle(batch_id)
            return None
        return Line(batch_id, number, custom_id, batch["endpoint"], json.loads(text), key, claimant)

    @off_the_hub
    def rest(self, line: Line, until: float) -> None:
        """Put a claimed line back in the queue, and let no line of its key be claimed before ``until`` (its key's
        limits refused it: the key's next window): the runners serve the other keys meanwhile."""
        with self.database.begin() as db:
            db.execute(_held(line).values(state="pending", owner=None, lease_until=None))
            turn = self.database.upsert(TURNS).values(owner=line.owner, last_claim=time.time(), rest_until=until)
            db.execute(turn.on_conflict_do_update(index_elements=["owner"], set_={"rest_until": until}))

    @off_the_hub
    def renew(self, line: Line) -> bool:
        """Extend the claim on a running line; False when it is no longer this claim's (its lease ran out and
        another worker took it)."""
        with self.database.begin() as db:
            return db.execute(_held(line).values(lease_until=time.time() + self.lease)).rowcount > 0

    @off_the_hub
    def finish(self, line: Line, status_code: int | None, body: Any, request_id: str | None,
               error: dict[str, str] | None = None) -> bool:
        """Record a line's answer (``status_code`` and ``body``), or why it has none (``error``); False (nothing
        recorded) when the claim was lost meanwhile: the line's answer is the one of the claim that holds it."""
        ok = status_code is not None and 200 <= status_code < 300
        with self.database.begin() as db:
            text = batch_output.answer_text(line.custom_id, status_code, body, request_id, error)
            self.database.take_turns(db, "files", line.owner)
            kept = batch_output.fits(db, self.quota, line.owner, len(text))
            if not db.execute(_held(line).values(state="done" if kept else OVER_QUOTA, result=text if kept else None,
                                                 ok=int(ok))).rowcount:
                return False
            batch_output.held_or_refused(db, line.batch_id, len(text) if kept else None)
            batch = _batch_in(db, line.batch_id)
            batch["request_counts"]["completed" if ok else "failed"] += kept  # an answer not kept counts at the end
            _save(db, batch)
        self.settle(line.batch_id)
        return True

    @off_the_hub
    def release(self, line: Line) -> None:
        """Put a claimed line back in the queue: it could not run now (the worker is shutting down)."""
        with self.database.begin() as db:
            db.execute(_held(line).values(state="pending", owner=None, lease_until=None))

    @off_the_hub
    def recover(self, alive: Callable[[str], bool]) -> int:
        """Put back in the queue the lines claimed by workers that are no longer ``alive(claimant)``; how many."""
        with self.database.begin() as db:
            claimants = db.scalars(sa.select(LINES.c.owner).distinct().where(LINES.c.state == "running")).all()
            dead = [claimant for claimant in claimants if not alive(claimant)]
            return sum(db.execute(LINES.update().where(LINES.c.state == "running", LINES.c.owner == claimant)
                                  .values(state="pending", owner=None, lease_until=None)).rowcount
                       for claimant in dead)

    @off_the_hub
    def queued_lines(self) -> dict[str, int]:
        """How many lines of every batch wait (``pending``) and run (``running``) now (for /metrics)."""
        with self.database.read() as db:
            rows = db.execute(sa.select(LINES.c.state, sa.func.count()).where(
                LINES.c.state.in_(("pending", "running"))).group_by(LINES.c.state)).all()
        return {state: int(count) for state, count in rows}

    @off_the_hub
    def expire(self, now: float) -> None:
        """Batches past their completion window: their lines not yet taken will not run."""
        with self.database.read() as db:
            rows = db.scalars(sa.select(BATCHES.c.object)).all()
        for batch in (json.loads(row) for row in rows):
            if batch["status"] in ("validating", "in_progress") and now > batch["expires_at"]:
                with self.database.begin() as db:
                    db.execute(LINES.update().where(LINES.c.batch_id == batch["id"], LINES.c.state == "pending")
                               .values(state="expired"))
                self.settle(batch["id"])

    @off_the_hub
    def settle(self, batch_id: str) -> None:
        """When no line of the batch waits or runs any more: write its output and error files, and end it."""
        with self.database.begin() as db:
            batch = _batch_in(db, batch_id)
            left = db.scalar(sa.select(sa.func.count()).select_from(LINES).where(
                LINES.c.batch_id == batch_id, LINES.c.state.in_(("pending", "running"))))
            if left or batch["status"] in TERMINAL:
                return
            owner = db.scalar(sa.select(BATCHES.c.owner).where(BATCHES.c.id == batch_id)) or ""
            _save(db, batch_output.finalize(db, batch, owner))
            _forget_unused_lines(db, batch["input_file_id"])


def _forget_unused_lines(db: sa.Connection, file_id: str) -> None:
    """Drop a deleted file's kept lines once no batch waits on them."""
    if db.scalar(sa.select(FILES.c.id).where(FILES.c.id == file_id)) is not None:
        return
    open_lines = sa.select(LINES.c.line).where(LINES.c.file_id == file_id,
                                                LINES.c.state.in_(("pending", "running"))).limit(1)
    if db.scalar(open_lines) is None:
        db.execute(FILE_LINES.delete().where(FILE_LINES.c.file_id == file_id))


def _started(db: sa.Connection, batch_id: str, now: float) -> dict[str, Any]:
    """The batch of a line just claimed, in progress from now if it was not yet."""
    batch = _batch_in(db, batch_id)
    if batch["status"] == "validating":
        batch.update(status="in_progress", in_progress_at=int(now))
        _save(db, batch)
    return batch


def _taken(db: sa.Connection, quota: Quota, line: tuple[str, int], owner: str, claimant: str,
           lease_until: float) -> bool:
    """The claimed ``line`` (batch id, number) marked running for ``claimant``; or, when an answer would not fit its
    key's room left, never run: it and its batch's waiting lines are over quota (nothing is run whose answer could
    not be kept). Whether it runs (the caller holds the key's turn)."""
    batch_id, number = line
    runs = batch_output.room_for_another(db, quota, owner, batch_id)
    if not runs:
        batch_output.held_or_refused(db, batch_id, None)
    taken = {"state": "running", "owner": claimant, "lease_until": lease_until} if runs else \
        {"state": OVER_QUOTA, "owner": None, "lease_until": None}
    db.execute(LINES.update().where(LINES.c.batch_id == batch_id, LINES.c.line == number).values(**taken))
    return runs


def _held(line: Line) -> Any:
    """An update of ``line`` while ``line``'s claim holds it."""
    return LINES.update().where(LINES.c.batch_id == line.batch_id, LINES.c.line == line.line,
                                 LINES.c.state == "running", LINES.c.owner == line.claimant)


def _new_batch(input_file_id: str, endpoint: str, window: str, metadata: dict | None, total: int,
               errors: list[dict[str, Any]]) -> dict[str, Any]:
    now = int(time.time())
    batch: dict[str, Any] = {
        "id": f"batch_{uuid.uuid4().hex[:24]}", "object": "batch", "endpoint": endpoint, "errors": None,
        "input_file_id": input_file_id, "completion_window": window, "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
        "expires_at": now + WINDOWS[window], "finalizing_at": None, "completed_at": None, "failed_at": None,
        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0}, "metadata": metadata}
    if errors:
        batch.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
        batch["request_counts"]["total"] = 0
    return batch


def _contents_from(folder: Path | None) -> Migration:
    """The second step: the files an earlier release kept in ``folder``/files/ taken into the database."""

    def step(db: sa.Connection) -> None:
        db.execute(FILES.update().where(FILES.c.created.is_(None)).values(created=FILES.c.created_at))
        for file_id in db.scalars(sa.select(FILES.c.id)).all():
            path = folder / "files" / f"{file_id}.jsonl" if folder is not None else None
            if path is not None and path.is_file():
                db.execute(CONTENTS.insert().values(id=file_id, data=path.read_bytes()))

    return step


def _batch_in(db: sa.Connection, batch_id: str) -> dict[str, Any]:
    """The batch's object, its row locked until the transaction ends (its counts are read, then written)."""
    found = db.scalar(sa.select(BATCHES.c.object).where(BATCHES.c.id == batch_id).with_for_update())
    if found is None:
        raise BatchError(f"No batch with id '{batch_id}'.", None)
    return json.loads(found)


def _save(db: sa.Connection, batch: dict[str, Any]) -> None:
    db.execute(BATCHES.update().where(BATCHES.c.id == batch["id"]).values(object=json.dumps(batch)))
