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

No Flask here: the routes (:mod:`phi_api.api.batches`) and the runner (:mod:`phi_api.batch.runner`) use it.
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
from phi_api.storage.batch_input import parse_lines
from phi_api.storage.database import Database, Migration, create_tables, mine, off_the_hub, owner_column

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
WINDOWS = {"24h": 86_400}  # completion_window: OpenAI accepts only 24h
TERMINAL = ("completed", "failed", "expired", "cancelled")

_TABLES = sa.MetaData()
_FILES = sa.Table("files", _TABLES, sa.Column("id", sa.String(64), primary_key=True), sa.Column("filename", sa.Text),
                  sa.Column("purpose", sa.String(64)), sa.Column("bytes", sa.BigInteger),
                  sa.Column("created_at", sa.BigInteger), owner_column(),
                  sa.Column("created", sa.Float))  # the exact time: the order of files made in the same second
_CONTENTS = sa.Table("file_contents", _TABLES, sa.Column("id", sa.String(64), primary_key=True),
                     sa.Column("data", sa.LargeBinary))
_BATCHES = sa.Table("batches", _TABLES, sa.Column("id", sa.String(64), primary_key=True),
                    sa.Column("object", sa.Text), sa.Column("created_at", sa.Float),
                    owner_column())
_LINES = sa.Table("lines", _TABLES, sa.Column("batch_id", sa.String(64), primary_key=True),
                  sa.Column("line", sa.Integer, primary_key=True), sa.Column("custom_id", sa.Text),
                  sa.Column("body", sa.Text), sa.Column("state", sa.String(16)),
                  sa.Column("owner", sa.String(255)),  # the worker that claimed it (not the key: see batches.owner)
                  sa.Column("result", sa.Text), sa.Column("ok", sa.Integer), sa.Column("lease_until", sa.Float),
                  sa.Index("pending", "state", "batch_id", "line"))


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


class BatchStore:
    """Files and batches in the database at ``url``, each owned by the key (by name) that made it; claims of lines
    last ``lease`` seconds unless renewed. ``folder``: where an earlier release kept the files' contents (taken
    into the database when it is upgraded).

    Reading methods take a ``scope``: the owner whose objects are visible, or None for every owner's (an admin key,
    or a server without keys, whose objects all belong to "").
    """

    def __init__(self, url: str, folder: Path | None = None, lease: float = 60.0) -> None:
        self.lease = lease
        self.database = Database(url, "batches", (create_tables(_TABLES), _contents_from(folder)))

    # Files ------------------------------------------------------------------------------------------

    @off_the_hub
    def add_file(self, filename: str, purpose: str, data: bytes, owner: str = "") -> dict[str, Any]:
        """Keep ``data`` as a new file of ``owner``; its file object."""
        with self.database.begin() as db:
            return _write_file(db, filename, purpose, data, owner)

    @off_the_hub
    def file(self, file_id: str, scope: str | None = None) -> dict[str, Any] | None:
        with self.database.read() as db:
            row = db.execute(_FILES.select().where(_FILES.c.id == file_id, mine(_FILES, scope))).first()
        return _file_object(row) if row else None

    @off_the_hub
    def files(self, purpose: str | None, limit: int, after: str | None, order: str,
              scope: str | None = None) -> tuple[list[dict], bool]:
        """Files (of ``purpose``), newest first (``order`` desc) or oldest, after the one named ``after``."""
        query = _FILES.select().where(mine(_FILES, scope)).order_by(_FILES.c.created_at, _FILES.c.created)
        if purpose is not None:
            query = query.where(_FILES.c.purpose == purpose)
        with self.database.read() as db:
            rows = db.execute(query).all()
        return _page([_file_object(row) for row in (rows[::-1] if order == "desc" else rows)], limit, after)

    @off_the_hub
    def content(self, file_id: str, scope: str | None = None) -> bytes | None:
        """A file's bytes (None: no such file for ``scope``)."""
        with self.database.read() as db:
            return db.scalar(sa.select(_CONTENTS.c.data).join(_FILES, _FILES.c.id == _CONTENTS.c.id)
                             .where(_FILES.c.id == file_id, mine(_FILES, scope)))

    @off_the_hub
    def delete_file(self, file_id: str, scope: str | None = None) -> bool:
        with self.database.begin() as db:
            gone = db.execute(_FILES.delete().where(_FILES.c.id == file_id, mine(_FILES, scope))).rowcount > 0
            if gone:
                db.execute(_CONTENTS.delete().where(_CONTENTS.c.id == file_id))
        return gone

    # Batches ----------------------------------------------------------------------------------------

    @off_the_hub
    def create_batch(self, input_file_id: str, endpoint: str, window: str, metadata: dict | None,
                     owner: str = "", scope: str | None = None) -> dict[str, Any]:
        """A new batch of ``owner`` of the input file's lines (a file ``scope`` sees), queued (or ``failed``, with
        the bad lines, when any is bad)."""
        found = self.file(input_file_id, scope)
        if found is None:
            raise BatchError(f"No file with id '{input_file_id}'.", "input_file_id")
        if found["purpose"] != "batch":
            raise BatchError(f"File '{input_file_id}' has purpose '{found['purpose']}', not 'batch'.", "input_file_id")
        lines, errors = parse_lines(self.content(input_file_id, scope) or b"", endpoint)
        batch = _new_batch(input_file_id, endpoint, window, metadata, len(lines), errors)
        with self.database.begin() as db:
            db.execute(_BATCHES.insert().values(id=batch["id"], object=json.dumps(batch), created_at=time.time(),
                                                owner=owner))
            if not errors:
                db.execute(_LINES.insert(), [{"batch_id": batch["id"], "line": number, "custom_id": custom_id,
                                              "body": json.dumps(body), "state": "pending"}
                                             for number, (custom_id, body) in enumerate(lines, start=1)])
        return batch

    @off_the_hub
    def batch(self, batch_id: str, scope: str | None = None) -> dict[str, Any] | None:
        with self.database.read() as db:
            found = db.scalar(sa.select(_BATCHES.c.object).where(_BATCHES.c.id == batch_id, mine(_BATCHES, scope)))
        return json.loads(found) if found else None

    @off_the_hub
    def batches(self, limit: int, after: str | None, scope: str | None = None) -> tuple[list[dict], bool]:
        with self.database.read() as db:
            rows = db.scalars(sa.select(_BATCHES.c.object).where(mine(_BATCHES, scope))
                              .order_by(_BATCHES.c.created_at.desc())).all()
        return _page([json.loads(row) for row in rows], limit, after)

    @off_the_hub
    def cancel(self, batch_id: str, scope: str | None = None) -> dict[str, Any]:
        """Stop a batch: its lines not yet taken will not run; it is ``cancelled`` once those running end."""
        if self.batch(batch_id, scope) is None:
            raise BatchError(f"No batch with id '{batch_id}'.", None)
        with self.database.begin() as db:  # lines, then the batch: the order every transaction locks them in
            db.execute(_LINES.update().where(_LINES.c.batch_id == batch_id, _LINES.c.state == "pending")
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
        """Take the next line to run (the oldest batch's first), for ``claimant`` (a worker): a waiting line, or one
        whose lease ran out; None when none waits."""
        now = time.time()
        waiting = sa.or_(_LINES.c.state == "pending", sa.and_(_LINES.c.state == "running", _LINES.c.lease_until < now))
        with self.database.begin() as db:
            row = db.execute(sa.select(_LINES.c.batch_id, _LINES.c.line, _LINES.c.custom_id, _LINES.c.body,
                                       _BATCHES.c.owner).join(_BATCHES, _BATCHES.c.id == _LINES.c.batch_id)
                             .where(waiting).order_by(_BATCHES.c.created_at, _LINES.c.line).limit(1)
                             .with_for_update(of=_LINES, skip_locked=True)).first()
            if row is None:
                return None
            batch_id, number, custom_id, body, key = row
            db.execute(_LINES.update().where(_LINES.c.batch_id == batch_id, _LINES.c.line == number)
                       .values(state="running", owner=claimant, lease_until=now + self.lease))
            batch = _batch_in(db, batch_id)
            if batch["status"] == "validating":
                batch.update(status="in_progress", in_progress_at=int(now))
                _save(db, batch)
        return Line(batch_id, number, custom_id, batch["endpoint"], json.loads(body), key, claimant)

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
        result = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.custom_id,
                  "response": None if status_code is None else
                  {"status_code": status_code, "request_id": request_id, "body": body},
                  "error": error}
        with self.database.begin() as db:
            if not db.execute(_held(line).values(state="done", result=json.dumps(result), ok=int(ok))).rowcount:
                return False
            batch = _batch_in(db, line.batch_id)
            batch["request_counts"]["completed" if ok else "failed"] += 1
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
            claimants = db.scalars(sa.select(_LINES.c.owner).distinct().where(_LINES.c.state == "running")).all()
            dead = [claimant for claimant in claimants if not alive(claimant)]
            return sum(db.execute(_LINES.update().where(_LINES.c.state == "running", _LINES.c.owner == claimant)
                                  .values(state="pending", owner=None, lease_until=None)).rowcount
                       for claimant in dead)

    @off_the_hub
    def expire(self, now: float) -> None:
        """Batches past their completion window: their lines not yet taken will not run."""
        with self.database.read() as db:
            rows = db.scalars(sa.select(_BATCHES.c.object)).all()
        for batch in (json.loads(row) for row in rows):
            if batch["status"] in ("validating", "in_progress") and now > batch["expires_at"]:
                with self.database.begin() as db:
                    db.execute(_LINES.update().where(_LINES.c.batch_id == batch["id"], _LINES.c.state == "pending")
                               .values(state="expired"))
                self.settle(batch["id"])

    @off_the_hub
    def settle(self, batch_id: str) -> None:
        """When no line of the batch waits or runs any more: write its output and error files, and end it."""
        with self.database.begin() as db:
            batch = _batch_in(db, batch_id)
            left = db.scalar(sa.select(sa.func.count()).select_from(_LINES).where(
                _LINES.c.batch_id == batch_id, _LINES.c.state.in_(("pending", "running"))))
            if left or batch["status"] in TERMINAL:
                return
            rows = db.execute(sa.select(_LINES.c.custom_id, _LINES.c.state, _LINES.c.result, _LINES.c.ok)
                              .where(_LINES.c.batch_id == batch_id).order_by(_LINES.c.line)).all()
            owner = db.scalar(sa.select(_BATCHES.c.owner).where(_BATCHES.c.id == batch_id)) or ""
            _save(db, _finalize(db, batch, [tuple(row) for row in rows], owner))


def _held(line: Line) -> Any:
    """An update of ``line`` while ``line``'s claim holds it."""
    return _LINES.update().where(_LINES.c.batch_id == line.batch_id, _LINES.c.line == line.line,
                                 _LINES.c.state == "running", _LINES.c.owner == line.claimant)


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


def _write_file(db: sa.Connection, filename: str, purpose: str, data: bytes, owner: str) -> dict[str, Any]:
    """A new file's row and contents; its file object."""
    row = {"id": f"file-{uuid.uuid4().hex[:24]}", "filename": filename, "purpose": purpose, "bytes": len(data),
           "created_at": int(time.time()), "owner": owner, "created": time.time()}
    db.execute(_FILES.insert().values(**row))
    db.execute(_CONTENTS.insert().values(id=row["id"], data=data))
    return _file_object(row)


def _contents_from(folder: Path | None) -> Migration:
    """The second step: the files an earlier release kept in ``folder``/files/ taken into the database."""

    def step(db: sa.Connection) -> None:
        db.execute(_FILES.update().where(_FILES.c.created.is_(None)).values(created=_FILES.c.created_at))
        for file_id in db.scalars(sa.select(_FILES.c.id)).all():
            path = folder / "files" / f"{file_id}.jsonl" if folder is not None else None
            if path is not None and path.is_file():
                db.execute(_CONTENTS.insert().values(id=file_id, data=path.read_bytes()))

    return step


def _finalize(db: sa.Connection, batch: dict[str, Any], rows: list[tuple], owner: str) -> dict[str, Any]:
    """The batch ended: its output and error files written, its status and times set."""
    now = int(time.time())
    status = {"cancelling": "cancelled"}.get(batch["status"], "completed")
    if any(state == "expired" for _, state, _, _ in rows):
        status = "expired"
    output: list[str] = []
    errors: list[str] = []
    for custom_id, state, result, ok in rows:
        if state == "done":
            (output if ok else errors).append(result)
        elif state in ("expired", "cancelled"):
            errors.append(json.dumps(_unrun(custom_id, state)))
    counts = batch["request_counts"]
    counts["failed"] += sum(1 for _, state, _, _ in rows if state == "expired")
    batch.update(finalizing_at=now, status=status, **{f"{status}_at": now})
    for key, lines in (("output_file_id", output), ("error_file_id", errors)):
        if lines:
            batch[key] = _write_file(db, f"batch_{batch['id']}_{key[:-8]}.jsonl", "batch_output",
                                     "".join(line + "\n" for line in lines).encode(), owner)["id"]
    return batch


def _batch_in(db: sa.Connection, batch_id: str) -> dict[str, Any]:
    """The batch's object, its row locked until the transaction ends (its counts are read, then written)."""
    found = db.scalar(sa.select(_BATCHES.c.object).where(_BATCHES.c.id == batch_id).with_for_update())
    if found is None:
        raise BatchError(f"No batch with id '{batch_id}'.", None)
    return json.loads(found)


def _save(db: sa.Connection, batch: dict[str, Any]) -> None:
    db.execute(_BATCHES.update().where(_BATCHES.c.id == batch["id"]).values(object=json.dumps(batch)))


def _unrun(custom_id: str, state: str) -> dict[str, Any]:
    message = {"expired": "This request could not be executed before the completion window expired.",
               "cancelled": "This request was not executed: the batch was cancelled."}[state]
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id, "response": None,
            "error": {"code": f"batch_{state}", "message": message}}


def _file_object(row: Any) -> dict[str, Any]:
    row = row._mapping if hasattr(row, "_mapping") else row
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": row["created_at"],
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed", "status_details": None}


def _page(items: list[dict[str, Any]], limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items after the one whose id is ``after``; and whether more follow."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    return items[:limit], len(items) > limit
