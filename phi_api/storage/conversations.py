"""Conversations of OpenAI's Conversations API: a conversation's items kept on the server, in order, for the
responses that name it (``conversation``) and the clients that list, add and delete them.

In the server's database, beside the stored responses (an SQLite file in the data folder, or PostgreSQL shared by
replicas; kept across restarts): each conversation's metadata and its key (by name), and its items (Responses API
items: messages, function calls and their outputs, reasoning), each with its place in the conversation. A key sees
only its own conversations: another key's is answered exactly as one that never was. Bounded per key: at most
``CONVERSATIONS_MAX_PER_KEY`` conversations, ``CONVERSATION_ITEMS_MAX`` items in each, and
``CONVERSATIONS_MB_PER_KEY`` of all its items' text (which also bounds what a response naming one conversation
loads); past a bound, a 400 (never someone else's data dropped). A key's additions take turns, so that two at once
cannot both pass a bound. Conversations do not expire, as at OpenAI: they last until deleted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from phi_api.storage.database import Database, create_tables, mine, off_the_hub, owner_column

_TABLES = sa.MetaData()
_CONVERSATIONS = sa.Table("conversations", _TABLES, sa.Column("id", sa.String(255), primary_key=True),
                          sa.Column("created", sa.Float, nullable=False), sa.Column("metadata", sa.Text),
                          owner_column(),
                          sa.Column("bytes", sa.BigInteger))  # its items' text: a key's sum read from small rows
_ITEMS = sa.Table("conversation_items", _TABLES, sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
                  sa.Column("id", sa.String(255), nullable=False, unique=True),
                  sa.Column("conversation_id", sa.String(255), nullable=False, index=True),
                  sa.Column("item", sa.Text, nullable=False), owner_column())


class ConversationFull(Exception):
    """A bound of the store would be passed (the message says which)."""


@dataclass(frozen=True)
class Page:
    """A page of a conversation's items, in the order asked for, and whether more follow."""

    items: list[dict[str, Any]]
    has_more: bool


class ConversationStore:
    """Conversations and their items by id, with their owners, in the database at ``url``.

    Methods take a ``scope``: the owner whose conversations are visible, or None for every owner's. Items are
    kept as given, each with its ``id``; the caller makes ids and items (:mod:`phi_api.protocols.conversations`).
    """

    def __init__(self, url: str, max_per_key: int, max_items: int, max_bytes: int = 256 * 2**20,
                 max_conversation: int = 10 * 2**20) -> None:
        self.max_per_key = max_per_key
        self.max_items = max_items
        self.max_bytes = max_bytes  # of all of a key's items, as kept (JSON: ASCII)
        # of one conversation's items (MAX_REQUEST_SIZE_MB: a response naming it reads no more than a request carries)
        self.max_conversation = max_conversation
        self.database = Database(url, "conversations", (create_tables(_TABLES), _sized), timeout=10)

    @off_the_hub
    def create(self, conversation_id: str, metadata: dict[str, str], items: list[dict[str, Any]],
               owner: str) -> float:
        """A new conversation of ``owner`` with its first ``items``; when it was made."""
        if len(items) > self.max_items:
            raise ConversationFull(f"A conversation holds at most {self.max_items} items on this server.")
        created, rows = time.time(), _rows(items)
        with self.database.begin() as db:
            self.database.take_turns(db, "conversations", owner)
            held = db.scalar(sa.select(sa.func.count()).select_from(_CONVERSATIONS)
                             .where(_CONVERSATIONS.c.owner == owner)) or 0
            if held >= self.max_per_key:
                raise ConversationFull(f"This key holds {held} conversations, the most this server keeps for one "
                                       "key: delete some first.")
            self._check_bytes(db, owner, rows, 0)
            db.execute(_CONVERSATIONS.insert().values(id=conversation_id, created=created,
                                                      metadata=json.dumps(metadata), owner=owner,
                                                      bytes=_size(rows)))
            _insert(db, conversation_id, rows, owner)
        return created

    @off_the_hub
    def conversation(self, conversation_id: str, scope: str | None) -> tuple[float, dict[str, str]] | None:
        """When the conversation was made and its metadata, or None (also for another owner's)."""
        with self.database.read() as db:
            row = db.execute(sa.select(_CONVERSATIONS.c.created, _CONVERSATIONS.c.metadata).where(
                _CONVERSATIONS.c.id == conversation_id, mine(_CONVERSATIONS, scope))).first()
        return (row.created, json.loads(row.metadata or "{}")) if row else None

    @off_the_hub
    def update(self, conversation_id: str, metadata: dict[str, str], scope: str | None) -> bool:
        """Replace the conversation's metadata; whether it was there (for ``scope``)."""
        with self.database.begin() as db:
            return db.execute(_CONVERSATIONS.update().where(_CONVERSATIONS.c.id == conversation_id,
                                                            mine(_CONVERSATIONS, scope))
                              .values(metadata=json.dumps(metadata))).rowcount > 0

    @off_the_hub
    def delete(self, conversation_id: str, scope: str | None) -> bool:
        """Forget a conversation and its items; whether it was there (for ``scope``)."""
        with self.database.begin() as db:
            gone = db.execute(_CONVERSATIONS.delete().where(_CONVERSATIONS.c.id == conversation_id,
                                                            mine(_CONVERSATIONS, scope))).rowcount > 0
            if gone:
                db.execute(_ITEMS.delete().where(_ITEMS.c.conversation_id == conversation_id))
            return gone

    @off_the_hub
    def add(self, conversation_id: str, items: list[dict[str, Any]], scope: str | None) -> bool:
        """Append ``items`` to the conversation; whether it was there (for ``scope``)."""
        rows = _rows(items)
        with self.database.begin() as db:
            # its row locked: a deletion at once waits, rather than leave these items behind, counted nowhere
            owner = db.scalar(sa.select(_CONVERSATIONS.c.owner).where(_CONVERSATIONS.c.id == conversation_id,
                                                                      mine(_CONVERSATIONS, scope)).with_for_update())
            if owner is None:
                return False
            self.database.take_turns(db, "conversations", owner)
            held = db.scalar(sa.select(sa.func.count()).select_from(_ITEMS)
                             .where(_ITEMS.c.conversation_id == conversation_id)) or 0
            if held + len(items) > self.max_items:
                raise ConversationFull(f"The conversation holds {held} items; with {len(items)} more it would pass "
                                       f"the {self.max_items} this server keeps in one.")
            own = db.scalar(sa.select(_CONVERSATIONS.c.bytes).where(_CONVERSATIONS.c.id == conversation_id)) or 0
            self._check_bytes(db, owner, rows, own)
            _insert(db, conversation_id, rows, owner)
            _grow(db, conversation_id, _size(rows))
            return True

    @off_the_hub
    def items(self, conversation_id: str, scope: str | None, *, after: str | None = None, limit: int | None = None,
              descending: bool = False) -> Page | None:
        """The conversation's items in order (or the reverse), after the item ``after``, at most ``limit``; None
        when the conversation is not there (for ``scope``)."""
        with self.database.read() as db:
            if not self._visible(db, conversation_id, scope):
                return None
            query = sa.select(_ITEMS.c.item).where(_ITEMS.c.conversation_id == conversation_id)
            if after is not None:
                mark = db.scalar(sa.select(_ITEMS.c.seq).where(_ITEMS.c.id == after,
                                                               _ITEMS.c.conversation_id == conversation_id))
                # gone (deleted meanwhile), or never this conversation's: nothing after it, as the files' and batches'
                if mark is None:  # lists answer (not the first page again, whose items the client has: duplicates)
                    return Page([], False)
                query = query.where(_ITEMS.c.seq < mark if descending else _ITEMS.c.seq > mark)
            query = query.order_by(_ITEMS.c.seq.desc() if descending else _ITEMS.c.seq)
            rows = db.scalars(query.limit(limit + 1) if limit is not None else query).all()
        more = limit is not None and len(rows) > limit
        return Page([json.loads(row) for row in rows[:limit] if row], more)

    @off_the_hub
    def item(self, conversation_id: str, item_id: str, scope: str | None) -> dict[str, Any] | None:
        """One item of the conversation, or None (also when the conversation is another owner's)."""
        with self.database.read() as db:
            if not self._visible(db, conversation_id, scope):
                return None
            row = db.scalar(sa.select(_ITEMS.c.item).where(_ITEMS.c.id == item_id,
                                                           _ITEMS.c.conversation_id == conversation_id))
        return json.loads(row) if row else None

    @off_the_hub
    def delete_item(self, conversation_id: str, item_id: str, scope: str | None) -> bool:
        """Forget one item of the conversation; whether it was there (for ``scope``)."""
        with self.database.begin() as db:
            if not self._visible(db, conversation_id, scope):
                return False
            this = sa.and_(_ITEMS.c.id == item_id, _ITEMS.c.conversation_id == conversation_id)
            size = db.scalar(sa.select(sa.func.length(_ITEMS.c.item)).where(this))  # ASCII: bytes
            if size is None:
                return False
            db.execute(_ITEMS.delete().where(this))
            _grow(db, conversation_id, -int(size))
            return True

    def _check_bytes(self, db: sa.Connection, owner: str, rows: list[tuple[str, str]], own: int) -> None:
        """ConversationFull when ``rows`` would take their conversation (``own`` bytes so far) past its bound, or
        ``owner``'s items past the budget (its turn taken first)."""
        adding = _size(rows)
        if not adding:
            return
        if own + adding > self.max_conversation:
            raise ConversationFull(f"The conversation holds {_mb(own)} MB; with these items ({_mb(adding)} MB) it "
                                   f"would pass the {_mb(self.max_conversation)} MB one request may carry "
                                   "(MAX_REQUEST_SIZE_MB), which a response naming it reads.")
        held = db.scalar(sa.select(sa.func.sum(_CONVERSATIONS.c.bytes)).where(_CONVERSATIONS.c.owner == owner)) or 0
        if held + adding > self.max_bytes:
            raise ConversationFull(f"This key's conversations hold {_mb(held)} MB; with these items ({_mb(adding)} MB) "
                                   f"they would pass the {_mb(self.max_bytes)} MB this server keeps for one key: "
                                   "delete some first.")

    @staticmethod
    def _visible(db: sa.Connection, conversation_id: str, scope: str | None) -> bool:
        return db.scalar(sa.select(_CONVERSATIONS.c.id).where(_CONVERSATIONS.c.id == conversation_id,
                                                              mine(_CONVERSATIONS, scope))) is not None


def _rows(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each item's id and text as kept (made before a transaction: its size is checked, then it is written)."""
    return [(item["id"], json.dumps(item)) for item in items]


def _size(rows: list[tuple[str, str]]) -> int:
    return sum(len(text) for _, text in rows)  # JSON with its escapes: ASCII, a byte a character


def _grow(db: sa.Connection, conversation_id: str, size: int) -> None:
    db.execute(_CONVERSATIONS.update().where(_CONVERSATIONS.c.id == conversation_id)
               .values(bytes=sa.func.coalesce(_CONVERSATIONS.c.bytes, 0) + size))


def _sized(connection: sa.Connection) -> None:
    """The second step of the schema: each conversation's size (its items' text), kept on its row from now on,
    measured once for the conversations of an earlier release."""
    create_tables(_TABLES)(connection)  # the column
    measured = (sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(_ITEMS.c.item)), 0))
                .where(_ITEMS.c.conversation_id == _CONVERSATIONS.c.id).scalar_subquery())
    connection.execute(_CONVERSATIONS.update().where(_CONVERSATIONS.c.bytes.is_(None)).values(bytes=measured))


def _insert(db: sa.Connection, conversation_id: str, rows: list[tuple[str, str]], owner: str) -> None:
    if rows:
        db.execute(_ITEMS.insert(), [{"id": item_id, "conversation_id": conversation_id, "item": text, "owner": owner}
                                     for item_id, text in rows])


def _mb(size: int) -> str:
    return f"{size / 2**20:.3g}"
