"""A batch's answers: held in its lines while it runs, counted against its key's file quota (an embeddings batch
answers ~1,600x its input, so its output is bounded as an upload is), then written as its output and error files a
line at a time, and forgotten from its lines."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from phi_api import jsontext
from phi_api.storage.batch_tables import BATCHES, LINES
from phi_api.storage.files import FileWriter, Quota, stored

OVER_QUOTA = "over_quota"  # a line's state: its answer, or its run, would have passed its key's quota
SMALLEST_ANSWER = 512  # bytes: an answer line's envelope (ids, status, the body's own fields) takes about this
_UNRUN = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed: the batch was cancelled."),
    OVER_QUOTA: ("storage_quota_exceeded", "This request's answer was not kept: this key's stored files and its "
                 "batches' answers reached its quota (FILES_MAX_MB_PER_KEY). Delete some files and run it again."),
}


def answers_held(db: sa.Connection, owner: str) -> int:
    """The bytes of answers ``owner``'s running batches hold (an ended batch's are in its files)."""
    return int(db.scalar(sa.select(sa.func.coalesce(sa.func.sum(BATCHES.c.held), 0))
                         .where(BATCHES.c.owner == owner)) or 0)


def fits(db: sa.Connection, quota: Quota, owner: str, size: int) -> bool:
    """Whether an answer of ``size`` bytes fits ``owner``'s quota, with its files, uploads in flight and answers held
    (the caller takes the owner's turn first)."""
    return quota.bytes is None or stored(db, owner)[1] + answers_held(db, owner) + size <= quota.bytes


def room_for_another(db: sa.Connection, quota: Quota, owner: str, batch_id: str) -> bool:
    """Whether another answer of ``batch_id`` may still fit ``owner``'s quota: as large as its answers so far on
    average (``SMALLEST_ANSWER`` before any), checked before a line runs, so that a key at its quota stops running
    lines whose answers could not be kept (the caller takes the owner's turn first)."""
    held, answered = db.execute(sa.select(sa.func.coalesce(BATCHES.c.held, 0), sa.func.count(LINES.c.line))
                                .select_from(BATCHES).outerjoin(LINES, sa.and_(LINES.c.batch_id == BATCHES.c.id,
                                                                                LINES.c.state == "done"))
                                .where(BATCHES.c.id == batch_id).group_by(BATCHES.c.id, BATCHES.c.held)).one()
    return fits(db, quota, owner, max(SMALLEST_ANSWER, int(held) // answered if answered else 0))


def answer_text(custom_id: str, status_code: int | None, body: Any, request_id: str | None,
                error: dict[str, str] | None) -> str:
    """A line of the output or error file: the line's answer (``status_code`` and ``body``), or why it has none."""
    result = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id,
              "response": None if status_code is None else
              {"status_code": status_code, "request_id": request_id, "body": body},
              "error": error}
    return jsontext.dumps_in_slices(result)  # in slices: an answer with log-probabilities may be large


def held_or_refused(db: sa.Connection, batch_id: str, size: int | None) -> None:
    """A line's answer of ``size`` bytes held against its key's quota; or none (None: it did not fit), and the
    batch's lines not yet taken will not run (they are reported so when it ends)."""
    if size is None:
        db.execute(LINES.update().where(LINES.c.batch_id == batch_id, LINES.c.state == "pending")
                   .values(state=OVER_QUOTA))
    else:
        db.execute(BATCHES.update().where(BATCHES.c.id == batch_id)
                   .values(held=sa.func.coalesce(BATCHES.c.held, 0) + size))


def finalize(db: sa.Connection, batch: dict[str, Any], owner: str) -> dict[str, Any]:
    """The batch ended: its output and error files written (a line at a time), its lines and their hold forgotten,
    its status and times set."""
    now = int(time.time())
    files = {"output_file_id": FileWriter(db), "error_file_id": FileWriter(db)}
    failed = {"expired": 0, OVER_QUOTA: 0}  # lines that did not run and count as failed (a cancelled one does not)
    for custom_id, state, result, ok in _answers(db, batch["id"]):
        if state == "done":
            files["output_file_id" if ok else "error_file_id"].add(result.encode() + b"\n")
        elif state in _UNRUN:
            files["error_file_id"].add(json.dumps(_unrun(custom_id, state)).encode() + b"\n")
            if state in failed:
                failed[state] += 1
    status = "expired" if failed["expired"] else {"cancelling": "cancelled"}.get(batch["status"], "completed")
    batch["request_counts"]["failed"] += failed["expired"] + failed[OVER_QUOTA]
    batch.update(finalizing_at=now, status=status, **{f"{status}_at": now})
    for key, writer in files.items():
        if writer.size:
            batch[key] = writer.close(f"batch_{batch['id']}_{key[:-8]}.jsonl", "batch_output", owner)["id"]
    db.execute(LINES.delete().where(LINES.c.batch_id == batch["id"]))
    db.execute(BATCHES.update().where(BATCHES.c.id == batch["id"]).values(held=0))
    return batch


def _answers(db: sa.Connection, batch_id: str) -> Iterable[tuple]:
    """The batch's lines (custom id, state, answer, whether it is a success) in order, read a few at a time: a
    batch's output may be far larger than memory."""
    rows = db.execute(sa.select(LINES.c.custom_id, LINES.c.state, LINES.c.result, LINES.c.ok)
                      .where(LINES.c.batch_id == batch_id).order_by(LINES.c.line).execution_options(yield_per=8))
    return (tuple(row) for row in rows)


def _unrun(custom_id: str, state: str) -> dict[str, Any]:
    code, message = _UNRUN[state]
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}
