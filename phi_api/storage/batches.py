"""OpenAI's Batch API's files and batches, on the server's disk: they survive restarts and worker recycling.

One SQLite database (``batches.sqlite3``) and a folder of files in ``BATCH_DIR``: uploaded files and the output
and error files of finished batches, each under its id, with a row saying what it is; each batch, with a row per
line of its input file. SQLite's write lock makes a line's claim atomic, so with several workers each line runs
exactly once; a line claimed by a worker that has since died goes back to the queue (:meth:`BatchStore.recover`).

A batch's life (OpenAI's statuses): ``validating`` (created; its file's lines are checked and queued at once),
``in_progress`` (a worker took its first line), ``finalizing`` (every line has its answer: the output and error
files are being written), ``completed``; or ``failed`` (its file has bad lines: none runs), ``expired`` (its
``completion_window`` passed: the lines that had not run are reported so), ``cancelling`` then ``cancelled``.

No Flask here: the routes (:mod:`phi_api.api.batches`) and the runner (:mod:`phi_api.batch.runner`) use it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phi_api.errors import BatchError
from phi_api.storage.sqlite import Database, off_the_hub

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
WINDOWS = {"24h": 86_400}  # completion_window: OpenAI accepts only 24h
MAX_LINES = 50_000  # lines of one batch, as OpenAI
TERMINAL = ("completed", "failed", "expired", "cancelled")

_TABLES = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT, purpose TEXT, bytes INTEGER,
    created_at INTEGER, owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, object TEXT, created_at REAL, owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS lines (batch_id TEXT, line INTEGER, custom_id TEXT, body TEXT,
    state TEXT, owner TEXT, result TEXT, ok INTEGER, PRIMARY KEY (batch_id, line));
CREATE INDEX IF NOT EXISTS pending ON lines (state, batch_id, line);
"""
# Columns added since the first release: a folder of an earlier one gets them, its rows owned by no key ("").
_ADDED = (("files", "owner", "TEXT NOT NULL DEFAULT ''"), ("batches", "owner", "TEXT NOT NULL DEFAULT ''"))
_MINE = "(? IS NULL OR owner = ?)"  # a scope: one owner's rows, or everyone's (None)


@dataclass(frozen=True)
class Line:
    """A claimed line of a batch: what to send, and where."""

    batch_id: str
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]
    owner: str = ""  # the key (by name) that created the batch: the line runs as a request of it


class BatchStore:
    """Files and batches in ``folder``, each owned by the key (by name) that made it.

    Reading methods take a ``scope``: the owner whose objects are visible, or None for every owner's (an admin key,
    or a server without keys, whose objects all belong to "").
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.database = Database(self.folder / "batches.sqlite3", _TABLES, added=_ADDED)

    # Files ------------------------------------------------------------------------------------------

    @off_the_hub
    def add_file(self, filename: str, purpose: str, data: bytes, owner: str = "") -> dict[str, Any]:
        """Keep ``data`` as a new file of ``owner``; its file object."""
        with self.database.connection() as db:
            return self._write_file(db, filename, purpose, data, owner)

    @off_the_hub
    def file(self, file_id: str, scope: str | None = None) -> dict[str, Any] | None:
        row = self.database.connection().execute(f"SELECT * FROM files WHERE id = ? AND {_MINE}",
                                                 (file_id, scope, scope)).fetchone()
        return _file_object(row) if row else None

    @off_the_hub
    def files(self, purpose: str | None, limit: int, after: str | None, order: str,
              scope: str | None = None) -> tuple[list[dict], bool]:
        """Files (of ``purpose``), newest first (``order`` desc) or oldest, after the one named ``after``."""
        rows = self.database.connection().execute(
            f"SELECT * FROM files WHERE (? IS NULL OR purpose = ?) AND {_MINE} ORDER BY created_at, rowid",
            (purpose, purpose, scope, scope)).fetchall()
        return _page([_file_object(row) for row in (rows[::-1] if order == "desc" else rows)], limit, after)

    def content(self, file_id: str, scope: str | None = None) -> Path | None:
        return self._path(file_id) if self.file(file_id, scope) is not None else None

    @off_the_hub
    def delete_file(self, file_id: str, scope: str | None = None) -> bool:
        with self.database.connection() as db:
            gone = db.execute(f"DELETE FROM files WHERE id = ? AND {_MINE}", (file_id, scope, scope)).rowcount > 0
        if gone:
            self._path(file_id).unlink(missing_ok=True)
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
        lines, errors = parse_lines(self._path(input_file_id).read_bytes(), endpoint)
        now = int(time.time())
        batch: dict[str, Any] = {
                 "id": f"batch_{uuid.uuid4().hex[:24]}", "object": "batch", "endpoint": endpoint, "errors": None,
                 "input_file_id": input_file_id, "completion_window": window, "status": "validating",
                 "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
                 "expires_at": now + WINDOWS[window], "finalizing_at": None, "completed_at": None, "failed_at": None,
                 "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                 "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "metadata": metadata}
        if errors:
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
            batch["request_counts"]["total"] = 0
        with self.database.connection() as db:
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?)", (batch["id"], json.dumps(batch), time.time(), owner))
            if not errors:
                db.executemany("INSERT INTO lines VALUES (?, ?, ?, ?, 'pending', NULL, NULL, NULL)",
                               [(batch["id"], number, custom_id, json.dumps(body))
                                for number, (custom_id, body) in enumerate(lines, start=1)])
        return batch

    @off_the_hub
    def batch(self, batch_id: str, scope: str | None = None) -> dict[str, Any] | None:
        row = self.database.connection().execute(f"SELECT object FROM batches WHERE id = ? AND {_MINE}",
                                                 (batch_id, scope, scope)).fetchone()
        return json.loads(row[0]) if row else None

    @off_the_hub
    def batches(self, limit: int, after: str | None, scope: str | None = None) -> tuple[list[dict], bool]:
        rows = self.database.connection().execute(
            f"SELECT object FROM batches WHERE {_MINE} ORDER BY created_at DESC", (scope, scope)).fetchall()
        return _page([json.loads(row[0]) for row in rows], limit, after)

    @off_the_hub
    def cancel(self, batch_id: str, scope: str | None = None) -> dict[str, Any]:
        """Stop a batch: its lines not yet taken will not run; it is ``cancelled`` once those running end."""
        if self.batch(batch_id, scope) is None:
            raise BatchError(f"No batch with id '{batch_id}'.", None)
        with self.database.transaction() as db:
            batch = _batch_in(db, batch_id)
            if batch["status"] in TERMINAL or batch["status"] == "finalizing":
                raise BatchError(f"Batch '{batch_id}' is {batch['status']}: it cannot be cancelled.", None)
            db.execute("UPDATE lines SET state = 'cancelled' WHERE batch_id = ? AND state = 'pending'", (batch_id,))
            batch.update(status="cancelling", cancelling_at=int(time.time()))
            _save(db, batch)
        self.settle(batch_id)
        return self.batch(batch_id) or batch

    # The runner's side ------------------------------------------------------------------------------

    @off_the_hub
    def claim(self, owner: str) -> Line | None:
        """Take the next line to run (the oldest batch's first), for ``owner`` (a worker); None when none waits."""
        with self.database.transaction() as db:
            row = db.execute("SELECT lines.batch_id, line, custom_id, body, batches.owner FROM lines JOIN batches "
                             "ON batches.id = lines.batch_id WHERE state = 'pending' "
                             "ORDER BY batches.created_at, line LIMIT 1").fetchone()
            if row is None:
                return None
            batch_id, number, custom_id, body, key = row
            db.execute("UPDATE lines SET state = 'running', owner = ? WHERE batch_id = ? AND line = ?",
                       (owner, batch_id, number))
            batch = _batch_in(db, batch_id)
            if batch["status"] == "validating":
                batch.update(status="in_progress", in_progress_at=int(time.time()))
                _save(db, batch)
        return Line(batch_id, number, custom_id, batch["endpoint"], json.loads(body), key)

    @off_the_hub
    def finish(self, line: Line, status_code: int | None, body: Any, request_id: str | None,
               error: dict[str, str] | None = None) -> None:
        """Record a line's answer (``status_code`` and ``body``), or why it has none (``error``)."""
        ok = status_code is not None and 200 <= status_code < 300
        result = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.custom_id,
                  "response": None if status_code is None else
                  {"status_code": status_code, "request_id": request_id, "body": body},
                  "error": error}
        with self.database.transaction() as db:
            db.execute("UPDATE lines SET state = 'done', result = ?, ok = ? WHERE batch_id = ? AND line = ?",
                       (json.dumps(result), int(ok), line.batch_id, line.line))
            batch = _batch_in(db, line.batch_id)
            batch["request_counts"]["completed" if ok else "failed"] += 1
            _save(db, batch)
        self.settle(line.batch_id)

    @off_the_hub
    def release(self, line: Line) -> None:
        """Put a claimed line back in the queue: it could not run now (the worker is shutting down)."""
        with self.database.transaction() as db:
            db.execute("UPDATE lines SET state = 'pending', owner = NULL WHERE batch_id = ? AND line = ? AND "
                       "state = 'running'", (line.batch_id, line.line))

    @off_the_hub
    def recover(self, alive: Any) -> int:
        """Put back in the queue the lines claimed by owners that are no longer ``alive(owner)``; how many."""
        with self.database.transaction() as db:
            owners = [row[0] for row in db.execute("SELECT DISTINCT owner FROM lines WHERE state = 'running'")]
            dead = [owner for owner in owners if not alive(owner)]
            return sum(db.execute("UPDATE lines SET state = 'pending', owner = NULL WHERE state = 'running' AND "
                                  "owner = ?", (owner,)).rowcount for owner in dead)

    @off_the_hub
    def expire(self, now: float) -> None:
        """Batches past their completion window: their lines not yet taken will not run."""
        rows = self.database.connection().execute("SELECT object FROM batches").fetchall()
        for batch in (json.loads(row[0]) for row in rows):
            if batch["status"] in ("validating", "in_progress") and now > batch["expires_at"]:
                with self.database.transaction() as db:
                    db.execute("UPDATE lines SET state = 'expired' WHERE batch_id = ? AND state = 'pending'",
                               (batch["id"],))
                self.settle(batch["id"])

    @off_the_hub
    def settle(self, batch_id: str) -> None:
        """When no line of the batch waits or runs any more: write its output and error files, and end it."""
        with self.database.transaction() as db:
            batch = _batch_in(db, batch_id)
            left = db.execute("SELECT COUNT(*) FROM lines WHERE batch_id = ? AND state IN ('pending', 'running')",
                              (batch_id,)).fetchone()[0]
            if left or batch["status"] in TERMINAL:
                return
            rows = db.execute("SELECT custom_id, state, result, ok FROM lines WHERE batch_id = ? ORDER BY line",
                              (batch_id,)).fetchall()
            owner = db.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,)).fetchone()[0]
            batch = _finalize(self, db, batch, rows, owner)
            _save(db, batch)

    # Inside -----------------------------------------------------------------------------------------

    def _write_file(self, db: sqlite3.Connection, filename: str, purpose: str, data: bytes,
                    owner: str) -> dict[str, Any]:
        """Write ``data`` (a temporary file renamed into place) and its row; its file object."""
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        path = self._path(file_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_bytes(data)
        os.replace(path.with_suffix(".tmp"), path)
        row = (file_id, filename, purpose, len(data), int(time.time()), owner)
        db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)", row)
        return _file_object(row)

    def _path(self, file_id: str) -> Path:
        return self.folder / "files" / f"{file_id}.jsonl"


def _finalize(store: BatchStore, db: sqlite3.Connection, batch: dict[str, Any], rows: list[tuple],
              owner: str) -> dict[str, Any]:
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
            batch[key] = store._write_file(db, f"batch_{batch['id']}_{key[:-8]}.jsonl", "batch_output",
                                          "".join(line + "\n" for line in lines).encode(), owner)["id"]
    return batch


def _batch_in(db: sqlite3.Connection, batch_id: str) -> dict[str, Any]:
    row = db.execute("SELECT object FROM batches WHERE id = ?", (batch_id,)).fetchone()
    if row is None:
        raise BatchError(f"No batch with id '{batch_id}'.", None)
    return json.loads(row[0])


def _save(db: sqlite3.Connection, batch: dict[str, Any]) -> None:
    db.execute("UPDATE batches SET object = ? WHERE id = ?", (json.dumps(batch), batch["id"]))


def parse_lines(data: bytes, endpoint: str) -> tuple[list[tuple[str, dict]], list[dict[str, Any]]]:
    """An input file's requests as (custom_id, body), and its errors in OpenAI's form (empty when it is good)."""
    lines: list[tuple[str, dict]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    text = data.decode("utf-8", errors="replace").splitlines()
    for number, raw in enumerate(text, start=1):
        if not raw.strip():
            continue
        problem = _line_problem(raw, endpoint, seen)
        if isinstance(problem, tuple):
            lines.append(problem)
            seen.add(problem[0])
        else:
            errors.append({**problem, "line": number})
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": None})
    if len(lines) > MAX_LINES:
        errors.append({"code": "too_many_requests", "message": f"A batch holds at most {MAX_LINES} requests.",
                       "param": None, "line": None})
    return lines, errors[:100]


def _line_problem(raw: str, endpoint: str, seen: set[str]) -> tuple[str, dict] | dict[str, Any]:
    """A line's (custom_id, body), or what is wrong with it."""
    try:
        item = json.loads(raw)
    except ValueError:
        return _problem("invalid_json_line", "This line is not JSON.", None)
    if not isinstance(item, dict):
        return _problem("invalid_json_line", "This line is not a JSON object.", None)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _problem("missing_custom_id", "Each request needs a custom_id (a string).", "custom_id")
    if custom_id in seen:
        return _problem("duplicate_custom_id", f"The custom_id '{custom_id}' is used twice.", "custom_id")
    if item.get("method") != "POST":
        return _problem("invalid_method", "The method must be POST.", "method")
    if item.get("url") != endpoint:
        return _problem("mismatched_endpoint", f"The url must be the batch's endpoint, {endpoint}.", "url")
    if not isinstance(item.get("body"), dict):
        return _problem("invalid_body", "The body must be a JSON object.", "body")
    return custom_id, item["body"]


def _problem(code: str, message: str, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param}


def _unrun(custom_id: str, state: str) -> dict[str, Any]:
    message = {"expired": "This request could not be executed before the completion window expired.",
               "cancelled": "This request was not executed: the batch was cancelled."}[state]
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id, "response": None,
            "error": {"code": f"batch_{state}", "message": message}}


def _file_object(row: tuple) -> dict[str, Any]:
    file_id, filename, purpose, size, created, _ = row
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created, "filename": filename,
            "purpose": purpose, "status": "processed", "status_details": None}


def _page(items: list[dict[str, Any]], limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items after the one whose id is ``after``; and whether more follow."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    return items[:limit], len(items) > limit
