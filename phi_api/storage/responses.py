"""Stored responses of OpenAI's Responses API: what a follow-up's ``previous_response_id`` names, on any worker.

One SQLite file in the server's state folder (shared by the gunicorn master's workers, removed at shutdown):
each stored response's object and the conversation it ends (its predecessors' messages, its own input and its
output, as chat messages), so that a follow-up is answered from the conversation whichever worker takes it.
Bounded: at most ``RESPONSES_STORE_MAX`` responses, none older than ``RESPONSES_STORE_SECONDS``; the oldest go
first. A resource of the app (``init_app`` and an accessor).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from phi_api.storage.sqlite import Database

_TABLES = "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created REAL, response TEXT, messages TEXT);"


class ResponseStore:
    """Responses by id, with the conversations they end, in ``path`` (an SQLite file)."""

    def __init__(self, path: Path, max_items: int, max_age: float) -> None:
        self.path = path
        self.max_items = max_items
        self.max_age = max_age
        self._database = Database(path, _TABLES, timeout=10)

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Keep ``response`` (its ``id``) and the conversation it ends; the oldest beyond the bounds go."""
        with self._database.transaction() as db:
            db.execute("INSERT OR REPLACE INTO responses (id, created, response, messages) VALUES (?, ?, ?, ?)",
                       (response["id"], time.time(), json.dumps(response), json.dumps(messages)))
            db.execute("DELETE FROM responses WHERE created < ?", (time.time() - self.max_age,))
            db.execute("DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY created DESC "
                       "LIMIT ?)", (self.max_items,))

    def response(self, response_id: str) -> dict[str, Any] | None:
        """The stored response object, or None."""
        row = self._row(response_id, "response")
        return json.loads(row) if row is not None else None

    def messages(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation the response ends, as chat messages, or None."""
        row = self._row(response_id, "messages")
        return json.loads(row) if row is not None else None

    def delete(self, response_id: str) -> bool:
        """Forget a response; whether it was there."""
        with self._database.transaction() as db:
            return db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def _row(self, response_id: str, column: str) -> str | None:
        found = self._database.connection().execute(
            f"SELECT {column} FROM responses WHERE id = ? AND created >= ?",  # column: one of two names of ours
            (response_id, time.time() - self.max_age)).fetchone()
        return found[0] if found else None
