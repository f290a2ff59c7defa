"""Uploads in flight hold their room in their key's file quota, on SQLite and PostgreSQL: before their bytes are
read, together with the stored files, and only until they end or lapse."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from phi_api.errors import QuotaError
from phi_api.storage.batches import BatchStore
from phi_api.storage.files import CHUNKS, Quota

ROOM = 1000


@pytest.fixture
def store(database_url):
    return BatchStore(database_url, quota=Quota(files=3, bytes=ROOM))


def test_uploads_in_flight_share_their_key_s_room_and_give_it_back_when_they_end(store):
    first = store.reserve_upload("team-a", 700, None)
    with pytest.raises(QuotaError):
        store.reserve_upload("team-a", 400, None)  # 700 held + 400 > 1000, though nothing is stored yet
    other = store.reserve_upload("team-b", 900, None)  # another key's room is its own
    store.release_upload(first)
    second = store.reserve_upload("team-a", 400, None)
    made = store.add_file("a.jsonl", "batch", b"x" * 400, "team-a", reserved=second)
    store.release_upload(second)  # after publishing: nothing more to give back, the file holds the room
    with pytest.raises(QuotaError):
        store.reserve_upload("team-a", 601, None)
    assert store.file(made["id"], "team-a")["bytes"] == 400
    store.release_upload(other)


def test_an_upload_of_unknown_length_holds_what_room_is_left_and_may_not_pass_it(store):
    store.add_file("a.jsonl", "batch", b"x" * 600, "team-a")
    unknown = store.reserve_upload("team-a", None, 10_000)
    assert unknown.bytes == ROOM - 600
    with pytest.raises(QuotaError):
        store.reserve_upload("team-a", None, 10_000)  # no room left while it is in flight
    with pytest.raises(QuotaError):
        store.add_file("b.jsonl", "batch", b"x" * 401, "team-a", reserved=unknown)
    store.release_upload(unknown)
    capped = store.reserve_upload("team-a", None, 100)
    assert capped.bytes == 100
    store.release_upload(capped)
    with store.database.read() as db:  # the refused upload left no chunk behind
        assert db.scalar(sa.select(sa.func.count()).select_from(CHUNKS)) == 1


def test_uploads_in_flight_count_as_files_too(store):
    held = [store.reserve_upload("team-a", 10, None) for _ in range(3)]
    with pytest.raises(QuotaError):
        store.reserve_upload("team-a", 10, None)
    for reservation in held:
        store.release_upload(reservation)


def test_a_lapsed_upload_s_room_and_chunks_go_and_it_is_never_published(store):
    lapsed = store.reserve_upload("team-a", 900, None, seconds=-1.0)  # its deadline already passed
    store._put_chunk(lapsed.file_id, 0, b"x" * 900)  # what a worker that died had written
    fresh = store.reserve_upload("team-a", 900, None)  # the lapsed one no longer holds the room
    with store.database.read() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(CHUNKS).where(CHUNKS.c.id == lapsed.file_id)) == 0
    with pytest.raises(QuotaError):  # its worker, were it still writing, publishes nothing half-written
        store.add_file("late.jsonl", "batch", b"y", "team-a", reserved=lapsed)
    store.release_upload(fresh)
    assert store.files(None, 10, None, "asc", "team-a") == ([], False)

