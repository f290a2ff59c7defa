"""Stored responses of OpenAI's Responses API: what a follow-up's ``previous_response_id`` names, on any worker.

One SQLite file in the server's data folder (shared by every worker, kept across restarts and upgrades): each
stored response's object, the key (by name) that made it, and the conversation it ends (its predecessors'
messages, its own input and its output, as chat messages), so that a follow-up is answered from the conversation
whichever worker takes it. A key sees and continues only its own responses. Bounded per key, so that one key never
evicts another's: at most ``RESPONSES_STORE_MAX`` responses a key (its oldest go first), none older than
``RESPONSES_STORE_SECONDS``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from phi_api.storage.sqlite import Database, off_the_hub

_TABLES = ("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created REAL, response TEXT, messages TEXT, "
           "owner TEXT NOT NULL DEFAULT '');")
_ADDED = (("responses", "owner", "TEXT NOT NULL DEFAULT ''"),)
_MINE = "(? IS NULL OR owner = ?)"  # a scope: one owner's rows, or everyone's (None)


class ResponseStore:
    """Responses by id, with the conversations they end and their owners, in ``path`` (an SQLite file).

    Reading methods take a ``scope``: the owner whose responses are visible, or None for every owner's.
    """

    def __init__(self, path: Path, max_items: int, max_age: float) -> None:
        self.path = path
        self.max_items = max_items
        self.max_age = max_age
        self.database = Database(path, _TABLES, timeout=10, added=_ADDED)

    @off_the_hub
    def put(self, response: dict[str, Any], messages: list[dict[str, Any]], owner: str = "") -> None:
        """Keep ``response`` (its ``id``) of ``owner`` and the conversation it ends; the owner's oldest beyond the
        bound, and everyone's past the age, go."""
        with self.database.transaction() as db:
            db.execute("INSERT OR REPLACE INTO responses (id, created, response, messages, owner) "
                       "VALUES (?, ?, ?, ?, ?)",
                       (response["id"], time.time(), json.dumps(response), json.dumps(messages), owner))
            db.execute("DELETE FROM responses WHERE created < ?", (time.time() - self.max_age,))
            db.execute("DELETE FROM responses WHERE owner = ? AND id NOT IN (SELECT id FROM responses WHERE "
                       "owner = ? ORDER BY created DESC LIMIT ?)", (owner, owner, self.max_items))

    def response(self, response_id: str, scope: str | None = None) -> dict[str, Any] | None:
        """The stored response object, or None (also for another owner's)."""
        row = self._row(response_id, "response", scope)
        return json.loads(row) if row is not None else None

    def messages(self, response_id: str, scope: str | None = None) -> list[dict[str, Any]] | None:
        """The conversation the response ends, as chat messages, or None (also for another owner's)."""
        row = self._row(response_id, "messages", scope)
        return json.loads(row) if row is not None else None

    @off_the_hub
    def delete(self, response_id: str, scope: str | None = None) -> bool:
        """Forget a response; whether it was there (for ``scope``)."""
        with self.database.transaction() as db:
            return db.execute(f"DELETE FROM responses WHERE id = ? AND {_MINE}",
                              (response_id, scope, scope)).rowcount > 0

    @off_the_hub
    def _row(self, response_id: str, column: str, scope: str | None) -> str | None:
        found = self.database.connection().execute(
            f"SELECT {column} FROM responses WHERE id = ? AND created >= ? AND {_MINE}",  # column: one of two of ours
            (response_id, time.time() - self.max_age, scope, scope)).fetchone()
        return found[0] if found else None
