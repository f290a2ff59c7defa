"""The byte budgets of stored responses and conversations read sizes kept beside the data (not the data itself);
a database of an earlier release, which kept none, has them measured once at its upgrade, on SQLite and
PostgreSQL."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from phi_api import jsontext
from phi_api.storage.conversations import ConversationFull, ConversationStore
from phi_api.storage.database import driver_url
from phi_api.storage.responses import ResponseStore, utf8_size

# text a cast to bytes could misread: quotes, backslashes (JSON's escapes), and two-byte characters
TEXT = 'Il a dit "ça va" \\ C:\\temp\\new — élan'


def as_earlier_release(url: str, store: str, undo: str) -> None:
    """Make the database look as an earlier release left it: ``undo`` run, the store's schema at its first step."""
    engine = sa.create_engine(driver_url(url))
    with engine.begin() as connection:
        connection.execute(sa.text(undo))
        connection.execute(sa.text("UPDATE schema_versions SET version = 1 WHERE store = :store"), {"store": store})
    engine.dispose()


def stored_size(response: dict, messages: list) -> int:
    return utf8_size(jsontext.dumps_in_slices(response)) + utf8_size(json.dumps(messages))


def test_an_earlier_release_s_responses_are_measured_once_and_count_against_the_budget(database_url):
    first, second = {"id": "resp_1", "note": TEXT}, {"id": "resp_2", "note": TEXT * 2}
    messages = [{"role": "user", "content": TEXT}]
    ResponseStore(database_url, 100, 3600.0).put(first, messages, "team-a")
    as_earlier_release(database_url, "responses", "DROP TABLE response_sizes")
    budget = stored_size(first, messages) + stored_size(second, messages)
    store = ResponseStore(database_url, 100, 3600.0, max_bytes=budget)
    with store.database.read() as db:
        measured = db.scalar(sa.text("SELECT bytes FROM response_sizes WHERE id = 'resp_1'"))
    assert measured == stored_size(first, messages)  # as a put of this release counts it
    store.put(second, messages, "team-a")  # both fit, to the byte
    assert store.response("resp_1", "team-a") is not None
    store.put({"id": "resp_3"}, [], "team-a")  # one byte more: the oldest goes
    assert store.response("resp_1", "team-a") is None and store.response("resp_2", "team-a") is not None


def test_an_earlier_release_s_conversations_are_measured_once_and_count_against_the_budget(database_url):
    items = [{"id": f"msg_{n}", "type": "message", "content": TEXT} for n in range(3)]
    size = sum(len(json.dumps(item)) for item in items)
    ConversationStore(database_url, 10, 100).create("conv_1", {}, items, "team-a")
    as_earlier_release(database_url, "conversations", "UPDATE conversations SET bytes = NULL")
    store = ConversationStore(database_url, 10, 100, max_bytes=size + len(json.dumps(items[0])))
    store.add("conv_1", [dict(items[0], id="msg_3")], "team-a")  # fits, to the byte
    with pytest.raises(ConversationFull):
        store.add("conv_1", [{"id": "msg_4"}], "team-a")
    assert store.delete_item("conv_1", "msg_0", "team-a")  # its bytes given back
    assert store.add("conv_1", [{"id": "msg_4"}], "team-a")
