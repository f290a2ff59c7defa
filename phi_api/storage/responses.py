"""Stored responses of OpenAI's Responses API: what a follow-up's ``previous_response_id`` names, on any worker.

In the server's database (an SQLite file in the data folder, or PostgreSQL shared by replicas; kept across restarts
and upgrades): each stored response's object, the key (by name) that made it, and the conversation it ends (its
predecessors' messages, its own input and its output, as chat messages), so that a follow-up is answered from the
conversation whichever worker or replica takes it. A key sees and continues only its own responses. Bounded per
key, so that one key never evicts another's: at most ``RESPONSES_STORE_MAX`` responses a key (its oldest go first),
none older than ``RESPONSES_STORE_SECONDS``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from phi_api import jsontext
from phi_api.storage.database import Database, create_tables, mine, off_the_hub, owner_column

_TABLES = sa.MetaData()
_RESPONSES = sa.Table("responses", _TABLES, sa.Column("id", sa.String(255), primary_key=True),
                      sa.Column("created", sa.Float), sa.Column("response", sa.Text), sa.Column("messages", sa.Text),
                      owner_column())


class ResponseStore:
    """Responses by id, with the conversations they end and their owners, in the database at ``url``.

    Reading methods take a ``scope``: the owner whose responses are visible, or None for every owner's.
    """

    def __init__(self, url: str, max_items: int, max_age: float) -> None:
        self.max_items = max_items
        self.max_age = max_age
        self.database = Database(url, "responses", (create_tables(_TABLES),), timeout=10)

    @off_the_hub
    def put(self, response: dict[str, Any], messages: list[dict[str, Any]], owner: str = "") -> None:
        """Keep ``response`` (its ``id``) of ``owner`` and the conversation it ends; the owner's oldest beyond the
        bound, and everyone's past the age, go."""
        # in slices: a response with log-probabilities may be large, and the C encoder keeps the interpreter's lock
        row = {"created": time.time(), "response": jsontext.dumps_in_slices(response), "messages": json.dumps(messages),
               "owner": owner}
        with self.database.begin() as db:
            statement = self.database.upsert(_RESPONSES).values(id=response["id"], **row)
            db.execute(statement.on_conflict_do_update(index_elements=["id"], set_=row))
            db.execute(_RESPONSES.delete().where(_RESPONSES.c.created < time.time() - self.max_age))
            kept = (sa.select(_RESPONSES.c.id).where(_RESPONSES.c.owner == owner)
                    .order_by(_RESPONSES.c.created.desc()).limit(self.max_items))
            db.execute(_RESPONSES.delete().where(_RESPONSES.c.owner == owner, _RESPONSES.c.id.not_in(kept)))

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
            return db.execute(_RESPONSES.delete().where(_RESPONSES.c.id == response_id,
                                                        mine(_RESPONSES, scope))).rowcount > 0

    @off_the_hub
    def _row(self, response_id: str, column: sa.Column, scope: str | None) -> str | None:
        with self.database.read() as db:
            return db.scalar(sa.select(column).where(_RESPONSES.c.id == response_id,
                                                     _RESPONSES.c.created >= time.time() - self.max_age,
                                                     mine(_RESPONSES, scope)))
