"""Stored responses of OpenAI's Responses API: what a follow-up's ``previous_response_id`` names, on any worker.

In the server's database (an SQLite file in the data folder, or PostgreSQL shared by replicas; kept across restarts
and upgrades): each stored response's object, the key (by name) that made it, and the conversation it ends (its
predecessors' messages, its own input and its output, as chat messages), so that a follow-up is answered from the
conversation whichever worker or replica takes it. A key sees and continues only its own responses. Bounded per
key, so that one key never evicts another's: at most ``RESPONSES_STORE_MAX`` responses a key and
``RESPONSES_STORE_MB_PER_KEY`` of their text (each response's object and conversation, in UTF-8 bytes: a chain of
follow-ups stores its whole history again at every link), its oldest going first; none older than
``RESPONSES_STORE_SECONDS``. A response whose own text is past the whole budget is not stored: a follow-up naming it
is answered as one naming an evicted response (``previous_response_not_found``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from phi_api import jsontext
from phi_api.storage.database import Database, create_tables, mine, off_the_hub, owner_column

_LEADING = ("system", "developer")  # the messages truncation keeps at a conversation's start
_TABLES = sa.MetaData()
_RESPONSES = sa.Table("responses", _TABLES, sa.Column("id", sa.String(255), primary_key=True),
                      sa.Column("created", sa.Float), sa.Column("response", sa.Text), sa.Column("messages", sa.Text),
                      owner_column())
# each response's size (its object's and its conversation's text, in UTF-8 bytes), in rows small enough that a key's
# sum is read without reading its responses
_SIZES = sa.Table("response_sizes", _TABLES, sa.Column("id", sa.String(255), primary_key=True),
                  sa.Column("created", sa.Float), owner_column(), sa.Column("bytes", sa.BigInteger, nullable=False),
                  sa.Index("response_sizes_owner", "owner", "created"))


class ResponseStore:
    """Responses by id, with the conversations they end and their owners, in the database at ``url``.

    Reading methods take a ``scope``: the owner whose responses are visible, or None for every owner's.
    """

    def __init__(self, url: str, max_items: int, max_age: float, max_bytes: int = 2**30,
                 max_conversation: int = 10 * 2**20) -> None:
        self.max_items = max_items
        self.max_age = max_age
        self.max_bytes = max_bytes  # of each owner's responses and conversations, in UTF-8
        # of one response's conversation (MAX_REQUEST_SIZE_MB: a follow-up reads no more than one request may carry)
        self.max_conversation = max_conversation
        self.database = Database(url, "responses", (create_tables(_TABLES), _sized), timeout=10)

    @off_the_hub
    def put(self, response: dict[str, Any], messages: list[dict[str, Any]], owner: str = "",
            trim: bool = False) -> bool:
        """Keep ``response`` (its ``id``) of ``owner`` and the conversation it ends (past ``max_conversation``
        bytes, its oldest messages after the leading system ones go if it may be ``trim``-med, as ``truncation:
        "auto"`` drops them when reading it); the owner's oldest beyond the bounds, and everyone's past the age, go.
        Whether it was kept: not when its conversation is too long and may not be trimmed, or its text is past the
        owner's whole budget (nothing else then goes)."""
        # in slices: a response with log-probabilities may be large, and the C encoder keeps the interpreter's lock
        text, conversation = jsontext.dumps_in_slices(response), _within_bytes(messages, self.max_conversation, trim)
        if conversation is None:
            return False
        size = utf8_size(text) + utf8_size(conversation)
        if size > self.max_bytes:
            return False
        row = {"created": time.time(), "response": text, "messages": conversation, "owner": owner}
        sized = {"created": row["created"], "owner": owner, "bytes": size}
        with self.database.begin() as db:
            self.database.take_turns(db, "responses", owner)  # two of the owner's at once: the later trims both
            for table, values in ((_RESPONSES, row), (_SIZES, sized)):
                statement = self.database.upsert(table).values(id=response["id"], **values)
                db.execute(statement.on_conflict_do_update(index_elements=["id"], set_=values))
            for table in (_RESPONSES, _SIZES):
                db.execute(table.delete().where(table.c.created < time.time() - self.max_age))
            gone = sa.select(_SIZES.c.id).where(_SIZES.c.owner == owner, _SIZES.c.id.not_in(self._kept(owner)))
            db.execute(_RESPONSES.delete().where(_RESPONSES.c.owner == owner, _RESPONSES.c.id.in_(gone)))
            db.execute(_SIZES.delete().where(_SIZES.c.owner == owner, _SIZES.c.id.not_in(self._kept(owner))))
        return True

    def _kept(self, owner: str) -> sa.Select:
        """The ids of the owner's newest responses within both bounds: counted from the newest, the first past
        either bound goes, and every older one with it (a smaller, older one is not kept in a newer one's place)."""
        newest_first = (_SIZES.c.created.desc(), _SIZES.c.id.desc())  # a total order: running sums
        ranked = (sa.select(_SIZES.c.id, sa.func.row_number().over(order_by=newest_first).label("place"),
                            sa.func.sum(_SIZES.c.bytes).over(order_by=newest_first).label("held"))
                  .where(_SIZES.c.owner == owner).subquery())
        return sa.select(ranked.c.id).where(ranked.c.place <= self.max_items, ranked.c.held <= self.max_bytes)

    def response(self, response_id: str, scope: str | None = None) -> dict[str, Any] | None:
        """The stored response object, or None (also for another owner's)."""
        row = self._row(response_id, _RESPONSES.c.response, scope)
        return json.loads(row) if row is not None else None

    def messages(self, response_id: str, scope: str | None = None) -> list[dict[str, Any]] | None:
        """The conversation the response ends, as chat messages, or None (also for another owner's)."""
        row = self._row(response_id, _RESPONSES.c.messages, scope)
        return json.loads(row) if row is not None else None

    @off_the_hub
    def delete(self, response_id: str, scope: str | None = None) -> bool:
        """Forget a response; whether it was there (for ``scope``)."""
        with self.database.begin() as db:
            gone = db.execute(_RESPONSES.delete().where(_RESPONSES.c.id == response_id,
                                                        mine(_RESPONSES, scope))).rowcount > 0
            if gone:
                db.execute(_SIZES.delete().where(_SIZES.c.id == response_id))
            return gone

    @off_the_hub
    def _row(self, response_id: str, column: sa.Column, scope: str | None) -> str | None:
        with self.database.read() as db:
            return db.scalar(sa.select(column).where(_RESPONSES.c.id == response_id,
                                                     _RESPONSES.c.created >= time.time() - self.max_age,
                                                     mine(_RESPONSES, scope)))


def _within_bytes(messages: list[dict[str, Any]], most: int, trim: bool) -> str | None:
    """``messages`` as kept (JSON), at most ``most`` bytes: whole, or without their oldest after the leading system
    ones if ``trim`` allows; None when they do not fit."""
    sizes = [utf8_size(json.dumps(message)) + 2 for message in messages]  # with the list's separator
    excess = sum(sizes) - most
    if excess <= 0:
        return json.dumps(messages)
    if not trim:
        return None
    start = next((index for index, message in enumerate(messages) if message.get("role") not in _LEADING),
                 len(messages))
    end = start
    while excess > 0 and end < len(messages):
        excess -= sizes[end]
        end += 1
    return json.dumps(messages[:start] + messages[end:]) if excess <= 0 else None


def utf8_size(text: str) -> int:
    """The bytes of ``text`` in UTF-8 (an ASCII string, as JSON with its escapes is, is not encoded to be measured)."""
    return len(text) if text.isascii() else len(text.encode())


def _sized(connection: sa.Connection) -> None:
    """The second step of the schema: each response's size in its own small row (``response_sizes``), measured
    once for the responses of an earlier release (their text in UTF-8 bytes, as :func:`utf8_size` counts)."""
    create_tables(_TABLES)(connection)

    def octets(column: sa.Column) -> Any:  # SQLite 3.40 has no octet_length: a blob's length is its bytes
        if connection.dialect.name == "sqlite":
            return sa.func.coalesce(sa.func.length(sa.cast(column, sa.LargeBinary)), 0)
        return sa.func.coalesce(sa.func.octet_length(column), 0)

    measured = sa.select(_RESPONSES.c.id, _RESPONSES.c.created, _RESPONSES.c.owner,
                         octets(_RESPONSES.c.response) + octets(_RESPONSES.c.messages)
                         ).where(_RESPONSES.c.id.not_in(sa.select(_SIZES.c.id)))
    connection.execute(_SIZES.insert().from_select(["id", "created", "owner", "bytes"], measured))

