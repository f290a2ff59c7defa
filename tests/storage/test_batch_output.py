"""A batch's answers hold room in its key's file quota while it runs, on SQLite and PostgreSQL: a line whose answer
would not fit the room left (as large as the batch's answers so far) is not run, nor are the lines after it; an answer
past the room anyway is not kept; and an ended batch's answers live in its files alone."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from phi_api.errors import QuotaError
from phi_api.storage.batch_tables import LINES
from phi_api.storage.batches import BatchStore
from phi_api.storage.files import Quota

ROOM = 2000
ANSWER = "v" * 300  # a line's answer takes ~420 bytes with its envelope


@pytest.fixture
def store(database_url):
    return BatchStore(database_url, quota=Quota(files=10, bytes=ROOM))


def batch_of(store: BatchStore, owner: str, lines: int) -> dict:
    data = b"".join(json.dumps({"custom_id": f"l{index}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": "x"}}).encode() + b"\n" for index in range(lines))
    made = store.add_file("in.jsonl", "batch", data, owner)
    return store.create_batch(made["id"], "/v1/embeddings", "24h", None, owner=owner)


def test_answers_past_the_key_s_room_are_not_kept_and_its_waiting_lines_do_not_run(store):
    batch = batch_of(store, "team-a", 6)  # its input file: ~490 bytes of the 2,000
    other = batch_of(store, "team-b", 1)  # another key's room is its own
    answered = []
    while (taken := store.claim("host:1:x")) is not None:
        assert store.finish(taken, 200, {"data": ANSWER}, None)
        answered.append((taken.owner, taken.custom_id))
        if answered == [("team-a", "l0"), ("team-b", "l0"), ("team-a", "l1")]:
            with pytest.raises(QuotaError):  # the running batch's two answers (~840 bytes) hold room too
                store.reserve_upload("team-a", ROOM - 1200, None)
    # l3's answer would not fit (the room left is less than the answers so far): it was never run, nor were the rest
    assert [custom for owner, custom in answered if owner == "team-a"] == ["l0", "l1", "l2"]
    done = store.batch(batch["id"], "team-a")
    assert done["status"] == "completed" and done["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    output = [json.loads(line) for line in store.content(done["output_file_id"]).splitlines()]
    errors = [json.loads(line) for line in store.content(done["error_file_id"]).splitlines()]
    assert [line["custom_id"] for line in output] == ["l0", "l1", "l2"]
    assert all(line["response"]["body"]["data"] == ANSWER for line in output)
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        ("l3", "storage_quota_exceeded"), ("l4", "storage_quota_exceeded"), ("l5", "storage_quota_exceeded")]
    assert store.batch(other["id"], "team-b")["request_counts"]["completed"] == 1
    with store.database.read() as db:  # the ended batches' answers are in their files alone
        assert db.scalar(sa.select(sa.func.count()).select_from(LINES)) == 0


def test_an_ended_batch_s_output_counts_as_its_files_and_no_longer_as_held_answers(store):
    batch = batch_of(store, "team-a", 2)
    while (taken := store.claim("host:1:x")) is not None:
        store.finish(taken, 200, {"data": ANSWER}, None)
    done = store.batch(batch["id"], "team-a")
    used = sum(item["bytes"] for item in store.files(None, 10, None, "asc", "team-a")[0])
    assert done["output_file_id"] and used > 2 * len(ANSWER)
    held = store.reserve_upload("team-a", ROOM - used, None)  # the room left is the quota less the files
    with pytest.raises(QuotaError):
        store.reserve_upload("team-a", 1, None)
    store.release_upload(held)
