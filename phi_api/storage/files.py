"""The Batch API's files, in the server's database: their bytes in chunks (a replica needs no shared volume, and no
file is ever held in memory whole), each file owned by a key and counted against its quota, and a batch file's
request lines parsed once for every batch made from it.

An upload holds its room in the key's quota (``FILES_MAX_PER_KEY`` files, ``FILES_MAX_MB_PER_KEY`` of bytes)
before its body is read: a :class:`Reservation` of the bytes its request declares (or of what room is left, for a
body of unknown length), counted with the stored files by every worker and replica, so a key's uploads in flight,
their spooled copies and their chunks included, never pass its quota together. The upload is then read from the
request's spooled copy on disk and written a chunk at a time, each chunk in a transaction of its own (another
worker's calls wait for one chunk, not for a whole file); the file becomes visible when its last chunk is in, and
its reservation goes with the same transaction. A reservation left by a worker that died lapses at its deadline, and
its chunks go with it. A file's lines (``file_lines``) are written at its first batch: later batches of the
same file refer to them instead of copying them, and they stay while a batch that needs them runs, even if the file
is deleted meanwhile.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import sqlalchemy as sa

from phi_api.errors import QuotaError
from phi_api.storage.batch_input import MAX_ERRORS, Request, endpoint_errors, numbered_lines, read_requests
from phi_api.storage.database import Database, mine, off_the_hub, owner_column

CHUNK_BYTES = 1 << 20
LINES_PER_WRITE = 1000  # a file's lines are kept this many at a time
TABLES = sa.MetaData()  # the files' and the batches' tables: one database, one schema (storage.batches)
FILES = sa.Table("files", TABLES, sa.Column("id", sa.String(64), primary_key=True), sa.Column("filename", sa.Text),
                 sa.Column("purpose", sa.String(64)), sa.Column("bytes", sa.BigInteger),
                 sa.Column("created_at", sa.BigInteger), owner_column(),
                 sa.Column("created", sa.Float),  # the exact time: the order of files made in the same second
                 sa.Column("lines", sa.Integer))  # its request lines in file_lines (None: not parsed yet)
CONTENTS = sa.Table("file_contents", TABLES, sa.Column("id", sa.String(64), primary_key=True),
                    sa.Column("data", sa.LargeBinary))  # a file of an earlier release: its bytes in one row
CHUNKS = sa.Table("file_chunks", TABLES, sa.Column("id", sa.String(64), primary_key=True),
                  sa.Column("seq", sa.Integer, primary_key=True), sa.Column("data", sa.LargeBinary))
UPLOADS = sa.Table("file_uploads", TABLES, sa.Column("id", sa.String(64), primary_key=True), owner_column(),
                   sa.Column("bytes", sa.BigInteger, nullable=False),
                   sa.Column("until", sa.Float, nullable=False))  # an upload in flight: its room in the quota
FILE_LINES = sa.Table("file_lines", TABLES, sa.Column("file_id", sa.String(64), primary_key=True),
                      sa.Column("line", sa.Integer, primary_key=True), sa.Column("custom_id", sa.Text),
                      sa.Column("url", sa.Text), sa.Column("body", sa.Text))


@dataclass(frozen=True)
class Quota:
    """What one key may store: files and bytes (``None``: no bound)."""

    files: int | None = None
    bytes: int | None = None


@dataclass(frozen=True)
class Reservation:
    """Room held in a key's quota for one upload in flight: the id its file will have, and at most how many bytes it
    may hold (None: no bound)."""

    file_id: str
    bytes: int | None


class FileStore:
    """Files in ``database``, each owned by the key (by name) that made it; reading methods take a ``scope``: the
    owner whose files are visible, or None for every owner's."""

    def __init__(self, database: Database, quota: Quota) -> None:
        self.database = database
        self.quota = quota

    @staticmethod
    def answers_held(db: sa.Connection, owner: str) -> int:
        """The bytes of answers ``owner``'s running batches hold (files alone run none)."""
        return 0

    def add_file(self, filename: str, purpose: str, data: bytes | IO[bytes], owner: str = "",
                 counted: bool = True, reserved: Reservation | None = None) -> dict[str, Any]:
        """Keep ``data`` (bytes, or a binary stream read a chunk at a time) as a new file of ``owner``, within its
        quota unless not ``counted`` (what the server writes for a key: a batch's output), in the room ``reserved``
        for it if any (one is held here otherwise); its file object."""
        stream = io.BytesIO(data) if isinstance(data, bytes) else data
        own = None
        if reserved is None and counted:
            reserved = own = self.reserve_upload(owner, len(data) if isinstance(data, bytes) else None, None)
        try:
            return self._write(reserved or Reservation(_new_id(), None), filename, purpose, stream, owner, counted)
        finally:
            if own is not None:
                self.release_upload(own)

    def _write(self, reserved: Reservation, filename: str, purpose: str, stream: IO[bytes], owner: str,
               counted: bool) -> dict[str, Any]:
        size, seq = 0, 0
        try:
            while chunk := stream.read(CHUNK_BYTES):
                size += len(chunk)
                if reserved.bytes is not None and size > reserved.bytes:
                    raise QuotaError(f"This file would take this key's stored files past {self.quota.bytes} bytes "
                                     "(FILES_MAX_MB_PER_KEY): delete some first.", "file")
                self._put_chunk(reserved.file_id, seq, chunk)
                seq += 1
            return self._publish(reserved.file_id, filename, purpose, size, owner, counted)
        except BaseException:
            self._forget_chunks(reserved.file_id)
            raise

    @off_the_hub
    def reserve_upload(self, owner: str, declared: int | None, most: int | None,
                       seconds: float = 3600.0) -> Reservation:
        """Hold room in ``owner``'s quota for one upload of ``declared`` bytes (None: unknown; then whatever room is
        left, up to ``most``) for ``seconds`` at most; :class:`QuotaError` if the quota, counting the uploads in
        flight, has no such room. Give it back with :meth:`release_upload` (a published file takes it over)."""
        now = time.time()
        with self.database.begin() as db:
            self.database.take_turns(db, "files", owner)
            _forget_lapsed(db, now)
            held = _within(db, self.quota, owner, declared or 0, self.answers_held(db, owner))
            room = None if self.quota.bytes is None else self.quota.bytes - held
            size = declared if declared is not None else min((b for b in (room, most) if b is not None), default=None)
            if declared is None and room is not None and room <= 0:  # a body of unknown length needs some room
                raise QuotaError(f"This key's stored files and uploads in flight fill its {self.quota.bytes} bytes "
                                 "(FILES_MAX_MB_PER_KEY): delete some first.", "file")
            reservation = Reservation(_new_id(), size)
            db.execute(UPLOADS.insert().values(id=reservation.file_id, owner=owner, bytes=size or 0,
                                               until=now + seconds))
        return reservation

    @off_the_hub
    def release_upload(self, reservation: Reservation) -> None:
        """Give back an upload's room (nothing if its file was published: the file holds the room now)."""
        with self.database.begin() as db:
            db.execute(UPLOADS.delete().where(UPLOADS.c.id == reservation.file_id))

    @off_the_hub
    def _put_chunk(self, file_id: str, seq: int, chunk: bytes) -> None:
        with self.database.begin() as db:
            db.execute(CHUNKS.insert().values(id=file_id, seq=seq, data=chunk))

    @off_the_hub
    def _forget_chunks(self, file_id: str) -> None:
        with self.database.begin() as db:
            db.execute(CHUNKS.delete().where(CHUNKS.c.id == file_id))

    @off_the_hub
    def _publish(self, file_id: str, filename: str, purpose: str, size: int, owner: str,
                 counted: bool) -> dict[str, Any]:
        with self.database.begin() as db:
            if counted:
                self.database.take_turns(db, "files", owner)
                if not db.execute(UPLOADS.delete().where(UPLOADS.c.id == file_id)).rowcount:
                    # it lapsed, and its chunks may be gone with it: nothing half-written is published
                    raise QuotaError("The upload took longer than its room in this key's quota is held: upload it "
                                     "again.", "file")
                _within(db, self.quota, owner, size, self.answers_held(db, owner))
            return write_file_row(db, file_id, filename, purpose, size, owner)

    @off_the_hub
    def file(self, file_id: str, scope: str | None = None) -> dict[str, Any] | None:
        with self.database.read() as db:
            row = db.execute(FILES.select().where(FILES.c.id == file_id, mine(FILES, scope))).first()
        return file_object(row) if row else None

    @off_the_hub
    def files(self, purpose: str | None, limit: int, after: str | None, order: str,
              scope: str | None = None) -> tuple[list[dict], bool]:
        """Files (of ``purpose``), newest first (``order`` desc) or oldest, after the one named ``after``."""
        query = FILES.select().where(mine(FILES, scope)).order_by(FILES.c.created_at, FILES.c.created)
        if purpose is not None:
            query = query.where(FILES.c.purpose == purpose)
        with self.database.read() as db:
            rows = db.execute(query).all()
        return page([file_object(row) for row in (rows[::-1] if order == "desc" else rows)], limit, after)

    def content(self, file_id: str, scope: str | None = None) -> bytes | None:
        """A file's bytes, whole (None: no such file for ``scope``): for small files and tests; see :meth:`chunks`."""
        if self.file(file_id, scope) is None:
            return None
        return b"".join(self.chunks(file_id))

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """A file's bytes a chunk at a time, each read in a call of its own (a download streams them)."""
        seq = 0
        while (chunk := self._chunk(file_id, seq)) is not None:
            yield chunk
            seq += 1

    @off_the_hub
    def _chunk(self, file_id: str, seq: int) -> bytes | None:
        with self.database.read() as db:
            found = db.scalar(sa.select(CHUNKS.c.data).where(CHUNKS.c.id == file_id, CHUNKS.c.seq == seq))
            if found is None and seq == 0:  # an earlier release's file: one row
                found = db.scalar(sa.select(CONTENTS.c.data).where(CONTENTS.c.id == file_id))
        return found

    @off_the_hub
    def delete_file(self, file_id: str, scope: str | None = None) -> bool:
        """Forget a file; its lines stay while a batch that runs them needs them (see ``storage.batches``)."""
        with self.database.begin() as db:
            gone = db.execute(FILES.delete().where(FILES.c.id == file_id, mine(FILES, scope))).rowcount > 0
            if gone:
                db.execute(CONTENTS.delete().where(CONTENTS.c.id == file_id))
                db.execute(CHUNKS.delete().where(CHUNKS.c.id == file_id))
        return gone


def requests_of(db: sa.Connection, file_id: str, endpoint: str,
                longest: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """How many requests the file holds, and what is wrong with it for a batch of ``endpoint`` (in OpenAI's form; a
    line of more than ``longest`` bytes is one); its lines kept the first time it is read whole and good (its row
    locked: two batches made of a new file at once read it once)."""
    kept = db.scalar(sa.select(FILES.c.lines).where(FILES.c.id == file_id).with_for_update())
    errors: list[dict[str, Any]] = []
    if kept is None:
        kept = keep_lines(db, file_id, errors, longest)
    urls = db.execute(sa.select(FILE_LINES.c.line, FILE_LINES.c.url)
                      .where(FILE_LINES.c.file_id == file_id, FILE_LINES.c.url != endpoint)
                      .order_by(FILE_LINES.c.line).limit(MAX_ERRORS)).all()
    errors = sorted(errors + endpoint_errors([tuple(row) for row in urls], endpoint),
                    key=lambda error: (error["line"] is None, error["line"] or 0))[:MAX_ERRORS]
    if any(error["code"] != "mismatched_endpoint" for error in errors):  # a bad file: nothing kept
        db.execute(FILE_LINES.delete().where(FILE_LINES.c.file_id == file_id))
    else:
        db.execute(FILES.update().where(FILES.c.id == file_id).values(lines=kept))
    return kept, errors


def keep_lines(db: sa.Connection, file_id: str, errors: list[dict[str, Any]], longest: int | None = None) -> int:
    """Read the file's chunks and keep its good requests, :data:`LINES_PER_WRITE` at a time; how many there are
    (what is wrong with the others, lines of more than ``longest`` bytes too, goes to ``errors``)."""
    db.execute(FILE_LINES.delete().where(FILE_LINES.c.file_id == file_id))

    def chunks() -> Any:
        seq = 0
        while (chunk := db.scalar(sa.select(CHUNKS.c.data).where(CHUNKS.c.id == file_id, CHUNKS.c.seq == seq))
               or (seq == 0 and db.scalar(sa.select(CONTENTS.c.data).where(CONTENTS.c.id == file_id)))):
            yield chunk
            seq += 1

    written, pending = 0, []
    for request in read_requests(numbered_lines(chunks(), longest), errors):
        pending.append(request)
        if len(pending) == LINES_PER_WRITE:
            written += write_lines(db, file_id, pending)
            pending = []
    return written + write_lines(db, file_id, pending)


def write_lines(db: sa.Connection, file_id: str, requests: list[Request]) -> int:
    if requests:
        db.execute(FILE_LINES.insert(), [{"file_id": file_id, "line": request.line, "custom_id": request.custom_id,
                                          "url": request.url, "body": request.body} for request in requests])
    return len(requests)


def stored(db: sa.Connection, owner: str) -> tuple[int, int]:
    """The files ``owner`` stores or uploads now, and their bytes (an upload's: the room it holds)."""
    count, size = 0, 0
    for table, live in ((FILES, sa.true()), (UPLOADS, UPLOADS.c.until >= time.time())):
        files, held = db.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(table.c.bytes), 0))
                                 .where(table.c.owner == owner, live)).one()
        count, size = count + files, size + held
    return int(count), int(size)


def _within(db: sa.Connection, quota: Quota, owner: str, size: int, answers: int) -> int:
    """The bytes ``owner`` stores, holds for its uploads in flight and in its running batches' ``answers``;
    :class:`QuotaError` unless it may store one more file of ``size`` bytes."""
    count, stored_bytes = stored(db, owner)
    stored_bytes += answers
    if quota.files is not None and count + 1 > quota.files:
        raise QuotaError(f"This key stores {count} files, as many as a key may (FILES_MAX_PER_KEY): delete some "
                         "first.", "file")
    if quota.bytes is not None and stored_bytes + size > quota.bytes:
        raise QuotaError(f"This file would take this key's stored files (and its running batches' answers) past "
                         f"{quota.bytes} bytes (FILES_MAX_MB_PER_KEY): delete some first.", "file")
    return stored_bytes


def _forget_lapsed(db: sa.Connection, now: float) -> None:
    """Uploads whose room lapsed (their worker died): their reservations and the chunks they wrote."""
    lapsed = sa.select(UPLOADS.c.id).where(UPLOADS.c.until < now)
    db.execute(CHUNKS.delete().where(CHUNKS.c.id.in_(lapsed)))
    db.execute(UPLOADS.delete().where(UPLOADS.c.until < now))


def _new_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def write_file_row(db: sa.Connection, file_id: str, filename: str, purpose: str, size: int,
                   owner: str) -> dict[str, Any]:
    """A file's row, once its bytes are in; its file object."""
    row = {"id": file_id, "filename": filename, "purpose": purpose, "bytes": size, "created_at": int(time.time()),
           "owner": owner, "created": time.time()}
    db.execute(FILES.insert().values(**row))
    return file_object(row)


class FileWriter:
    """A new file the server writes inside a transaction a piece at a time (a batch's output, however large): its
    bytes go to chunks as they fill, never held whole."""

    def __init__(self, db: sa.Connection) -> None:
        self.db, self.file_id, self.size, self._seq, self._pending = db, _new_id(), 0, 0, bytearray()

    def add(self, data: bytes) -> None:
        self._pending += data
        self.size += len(data)
        while len(self._pending) >= CHUNK_BYTES:
            self._flush(CHUNK_BYTES)

    def close(self, filename: str, purpose: str, owner: str) -> dict[str, Any]:
        """The file, its last chunk written: its object."""
        while self._pending:
            self._flush(CHUNK_BYTES)
        return write_file_row(self.db, self.file_id, filename, purpose, self.size, owner)

    def _flush(self, most: int) -> None:
        chunk = bytes(self._pending[:most])
        del self._pending[:most]
        self.db.execute(CHUNKS.insert().values(id=self.file_id, seq=self._seq, data=chunk))
        self._seq += 1


def file_object(row: Any) -> dict[str, Any]:
    row = row._mapping if hasattr(row, "_mapping") else row
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": row["created_at"],
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed", "status_details": None}


def page(items: list[dict[str, Any]], limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items after the one whose id is ``after``; and whether more follow."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    return items[:limit], len(items) > limit
