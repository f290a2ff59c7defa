"""The conversations' store: items in order and in pages, owners kept apart, bounds that refuse rather than drop."""

from __future__ import annotations

import json
import threading

import pytest

from phi_api.storage.conversations import ConversationFull, ConversationStore
from phi_api.storage.database import sqlite_url


def message(number: int) -> dict:
    return {"id": f"msg_{number}", "type": "message", "role": "user", "content": [{"type": "input_text",
                                                                                    "text": str(number)}]}


@pytest.fixture
def store(tmp_path):
    return ConversationStore(sqlite_url(tmp_path / "responses.sqlite3"), max_per_key=2, max_items=5)


def ids(page) -> list[str]:
    return [item["id"] for item in page.items]


def test_items_in_order_in_pages_both_ways(store):
    store.create("conv_a", {"k": "v"}, [message(1), message(2)], "team")
    assert store.add("conv_a", [message(3), message(4)], "team")
    assert ids(store.items("conv_a", "team")) == ["msg_1", "msg_2", "msg_3", "msg_4"]
    first = store.items("conv_a", "team", limit=2, descending=True)
    assert ids(first) == ["msg_4", "msg_3"] and first.has_more
    rest = store.items("conv_a", "team", after="msg_3", limit=2, descending=True)
    assert ids(rest) == ["msg_2", "msg_1"] and not rest.has_more
    assert ids(store.items("conv_a", "team", after="msg_2")) == ["msg_3", "msg_4"]
    assert ids(store.items("conv_a", "team", after="msg_gone")) == []  # not the first page again
    assert store.delete_item("conv_a", "msg_2", "team")
    assert ids(store.items("conv_a", "team")) == ["msg_1", "msg_3", "msg_4"]


def test_another_owner_finds_nothing_and_changes_nothing(store):
    store.create("conv_a", {}, [message(1)], "team")
    assert store.conversation("conv_a", "other") is None and store.items("conv_a", "other") is None
    assert store.item("conv_a", "msg_1", "other") is None
    assert not store.add("conv_a", [message(2)], "other") and not store.update("conv_a", {"x": "y"}, "other")
    assert not store.delete_item("conv_a", "msg_1", "other") and not store.delete("conv_a", "other")
    assert ids(store.items("conv_a", None)) == ["msg_1"]  # an admin's scope sees it, unchanged
    assert store.conversation("conv_a", "team")[1] == {}


def test_bounds_refuse_and_never_drop(store):
    store.create("conv_a", {}, [message(1)], "team")
    store.create("conv_b", {}, [], "team")
    with pytest.raises(ConversationFull):
        store.create("conv_c", {}, [], "team")
    store.create("conv_c", {}, [], "other")  # the bound is per key
    with pytest.raises(ConversationFull):
        store.add("conv_a", [message(n) for n in range(2, 7)], "team")
    assert ids(store.items("conv_a", "team")) == ["msg_1"]


def test_deleting_a_conversation_deletes_its_items(store):
    store.create("conv_a", {}, [message(1)], "team")
    assert store.delete("conv_a", "team") and store.items("conv_a", "team") is None
    store.create("conv_b", {}, [message(1)], "team")  # the item's id is free again
    assert ids(store.items("conv_b", "team")) == ["msg_1"]


def sized(number: int, size: int = 1000) -> dict:
    """A message of ``size`` characters: some 1,100 bytes as the store keeps it."""
    return {"id": f"msg_{number:03d}", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "x" * size}]}


def test_a_key_s_items_are_bounded_by_their_bytes_across_its_conversations(tmp_path):
    store = ConversationStore(sqlite_url(tmp_path / "responses.sqlite3"), max_per_key=10, max_items=100,
                              max_bytes=3500)
    store.create("conv_a", {}, [sized(1), sized(2)], "team")
    with pytest.raises(ConversationFull):
        store.create("conv_b", {}, [sized(3), sized(4)], "team")
    assert store.conversation("conv_b", None) is None  # refused whole
    store.create("conv_b", {}, [sized(3)], "team")
    with pytest.raises(ConversationFull):
        store.add("conv_a", [sized(4)], "team")
    store.create("conv_c", {}, [sized(5), sized(6), sized(7)], "other")  # the budget is per key
    assert ids(store.items("conv_a", "team")) == ["msg_001", "msg_002"]  # nothing dropped
    assert ids(store.items("conv_b", "team")) == ["msg_003"]
    assert store.delete("conv_b", "team") and store.add("conv_a", [sized(4)], "team")  # deleting gives room back
    assert store.delete_item("conv_a", "msg_001", "team") and store.add("conv_a", [sized(8)], "team")
    assert ids(store.items("conv_a", "team")) == ["msg_002", "msg_004", "msg_008"]


def test_a_key_s_budget_holds_for_adds_at_once_on_either_engine(database_url):
    budget = 10 * len(json.dumps(sized(0))) + 100  # ten items fit, not eleven
    store = ConversationStore(database_url, max_per_key=10, max_items=100, max_bytes=budget)
    for number in range(4):
        store.create(f"conv_{number}", {}, [], "team")
    start = threading.Barrier(4)

    def worker(number: int) -> None:
        mine = ConversationStore(database_url, max_per_key=10, max_items=100, max_bytes=budget)  # own connections
        start.wait()
        for index in range(10):
            try:
                mine.add(f"conv_{number}", [sized(100 * number + index)], "team")
            except ConversationFull:
                return

    threads = [threading.Thread(target=worker, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(len(store.items(f"conv_{number}", "team").items) for number in range(4)) == 10
