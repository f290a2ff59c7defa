"""The stores: owners and their bounds, an earlier release's database upgraded in place, and work off the hub."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import gevent
import sqlalchemy as sa

from phi_api.limits.keys import Key, Usage
from phi_api.storage.batches import BatchStore
from phi_api.storage.database import sqlite_url
from phi_api.storage.responses import ResponseStore


def response(number: int) -> dict:
    return {"id": f"resp_{number}", "object": "response"}


def test_a_key_s_responses_are_bounded_by_its_own_count_not_by_others(tmp_path):
    store = ResponseStore(sqlite_url(tmp_path / "responses.sqlite3"), max_items=2, max_age=3600)
    store.put(response(0), [], "team-b")
    for number in range(1, 5):
        store.put(response(number), [], "team-a")
    assert store.response("resp_0", "team-b") is not None  # team-a's many never evicted team-b's one
    assert [store.response(f"resp_{number}", "team-a") is not None for number in range(1, 5)] == \
        [False, False, True, True]
    assert store.response("resp_4", "team-b") is None and store.response("resp_4", None) is not None
    assert not store.delete("resp_4", "team-b") and store.delete("resp_4", "team-a")


def test_a_folder_of_an_earlier_release_is_upgraded_and_its_files_belong_to_no_key(tmp_path):
    old = sqlite3.connect(tmp_path / "batches.sqlite3")
    old.executescript("CREATE TABLE files (id TEXT PRIMARY KEY, filename TEXT, purpose TEXT, bytes INTEGER, "
                      "created_at INTEGER); CREATE TABLE batches (id TEXT PRIMARY KEY, object TEXT, created_at REAL);"
                      "INSERT INTO files VALUES ('file-old', 'a.jsonl', 'batch', 3, 1);")
    old.commit()
    old.close()
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "file-old.jsonl").write_bytes(b"{}\n")  # where that release kept a file's contents
    store = BatchStore(sqlite_url(tmp_path / "batches.sqlite3"), tmp_path)
    assert store.file("file-old", "")["filename"] == "a.jsonl" and store.file("file-old", "team-a") is None
    assert store.content("file-old", "") == b"{}\n"  # taken into the database
    added = store.add_file("b.jsonl", "batch", b"{}\n", "team-a")
    assert [item["id"] for item in store.files(None, 10, None, "asc", "team-a")[0]] == [added["id"]]
    assert len(store.files(None, 10, None, "asc", None)[0]) == 2


def test_a_busy_database_stalls_its_caller_not_the_hub(tmp_path):
    store = ResponseStore(sqlite_url(tmp_path / "responses.sqlite3"), max_items=10, max_age=3600)
    store.put(response(0), [])  # the tables exist
    holder = sqlite3.connect(tmp_path / "responses.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(time.monotonic()) or gevent.sleep(0.01) for _ in range(30)])
    writer = gevent.spawn(store.put, response(1), [])
    gevent.sleep(0.3)
    assert not writer.ready() and len(ticks) >= 10  # the write waits for the lock; the hub ran meanwhile
    holder.execute("COMMIT")
    writer.get(timeout=10)
    ticker.join(timeout=5)
    assert store.response("resp_1") is not None


def test_concurrent_first_calls_of_a_process_take_turns_on_its_connection(tmp_path):
    store = ResponseStore(sqlite_url(tmp_path / "responses.sqlite3"), max_items=100, max_age=3600)
    calls = [gevent.spawn(store.put, response(number), []) for number in range(20)]
    gevent.joinall(calls, timeout=30, raise_error=True)
    assert all(store.response(f"resp_{number}") is not None for number in range(20))


def test_two_workers_claiming_at_once_take_each_line_once_on_either_engine(database_url):
    store = BatchStore(database_url)
    data = b"".join(json.dumps({"custom_id": f"l{index}", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": "x"}}).encode() + b"\n" for index in range(30))
    made = store.create_batch(store.add_file("in.jsonl", "batch", data)["id"], "/v1/completions", "24h", None)
    claimed: list[list[int]] = [[], []]
    start = threading.Barrier(2)

    def worker(number: int) -> None:
        mine = BatchStore(database_url)  # its own connections, as another worker's or replica's
        start.wait()
        while (taken := mine.claim(f"host-{number}:1:x")) is not None:
            claimed[number].append(taken.line)
            mine.finish(taken, 200, {}, None)

    threads = [threading.Thread(target=worker, args=(number,)) for number in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed[0] + claimed[1]) == list(range(1, 31))
    done = store.batch(made["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 30, "completed": 30, "failed": 0}


def test_a_batch_s_output_larger_than_a_chunk_is_written_a_line_at_a_time_on_either_engine(database_url):
    from phi_api.storage.files import CHUNK_BYTES

    store = BatchStore(database_url)
    data = b"".join(json.dumps({"custom_id": f"l{index}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": "x"}}).encode() + b"\n" for index in range(7))
    made = store.create_batch(store.add_file("in.jsonl", "batch", data)["id"], "/v1/embeddings", "24h", None)
    answers = {}
    while (taken := store.claim("host:1:x")) is not None:
        answers[taken.custom_id] = "v" * (CHUNK_BYTES // 3 + taken.line)  # 7 of them: some 2.3 chunks
        store.finish(taken, 200 if taken.line != 4 else 500, {"data": answers[taken.custom_id]}, None)
    done = store.batch(made["id"])
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 6
    output = [json.loads(line) for line in store.content(done["output_file_id"]).splitlines()]
    errors = [json.loads(line) for line in store.content(done["error_file_id"]).splitlines()]
    assert [line["custom_id"] for line in output] == ["l0", "l1", "l2", "l4", "l5", "l6"]
    assert [line["response"]["body"]["data"] for line in output] == [answers[line["custom_id"]] for line in output]
    assert [line["custom_id"] for line in errors] == ["l3"]
    assert store.file(done["output_file_id"])["bytes"] == len(store.content(done["output_file_id"]))


def test_a_key_s_limit_holds_for_workers_admitting_at_once_on_either_engine(database_url):
    key = Key("k", "secret-key", requests_per_minute=10)
    start = threading.Barrier(4)
    allowed: list[bool] = []

    def worker() -> None:
        usage = Usage(database_url)  # its own connections
        start.wait()
        allowed.extend(usage.admit(key, 1_000_000_000.0).allowed for _ in range(5))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(allowed) == [False] * 10 + [True] * 10
    assert Usage(database_url).totals()["k"]["requests"] == 10


class Reading:
    """A spooled upload, read as the store reads it: how much each read asks for is recorded."""

    def __init__(self, size: int) -> None:
        self.left, self.asked = size, []

    def read(self, size: int) -> bytes:
        self.asked.append(size)
        given = min(size, self.left)
        self.left -= given
        return b"x" * given


def test_an_upload_is_read_a_chunk_at_a_time_and_a_batch_refers_to_its_file_s_lines(tmp_path):
    from phi_api.storage.files import CHUNK_BYTES, FILE_LINES

    store = BatchStore(sqlite_url(tmp_path / "batches.sqlite3"))
    stream = Reading(5 * CHUNK_BYTES + 3)
    made = store.add_file("big.jsonl", "batch", stream, "team-a")  # type: ignore[arg-type]
    assert made["bytes"] == 5 * CHUNK_BYTES + 3 and max(stream.asked) == CHUNK_BYTES
    assert sum(len(chunk) for chunk in store.chunks(made["id"])) == made["bytes"]
    lines = b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                                 "body": {"model": "m", "prompt": str(i)}}).encode() + b"\n" for i in range(5))
    source = store.add_file("in.jsonl", "batch", lines, "team-a")["id"]
    first = store.create_batch(source, "/v1/completions", "24h", None, "team-a")
    second = store.create_batch(source, "/v1/completions", "24h", None, "team-a")
    assert first["status"] == second["status"] == "validating"
    with store.database.read() as db:
        kept = db.execute(sa.select(sa.func.count()).select_from(FILE_LINES)).scalar()
        copies = db.execute(sa.text("SELECT count(*) FROM lines WHERE body IS NOT NULL")).scalar()
    assert kept == 5 and copies == 0  # the file's lines are kept once; the batches' lines refer to them
    assert store.claim("host:1:x").body == {"model": "m", "prompt": "0"}
    other = store.create_batch(source, "/v1/chat/completions", "24h", None, "team-a")
    assert other["status"] == "failed" and other["errors"]["data"][0]["code"] == "mismatched_endpoint"


def said(size: int, text: str = "x") -> list[dict]:
    """A conversation of one message whose text is ``size`` characters of ``text``."""
    return [{"role": "user", "content": text * size}]


def test_a_key_s_responses_are_bounded_by_their_bytes_its_oldest_going_first_on_either_engine(database_url):
    store = ResponseStore(database_url, max_items=100, max_age=3600, max_bytes=3500)
    store.put(response(0), said(3000), "team-b")
    for number in range(1, 6):
        store.put(response(number), said(1000), "team-a")  # some 1,070 bytes each: three fit
    assert [store.response(f"resp_{number}", "team-a") is not None for number in range(1, 6)] == \
        [False, False, True, True, True]
    assert store.messages("resp_0", "team-b") == said(3000)  # team-a's many never evicted team-b's one


def test_a_response_past_the_key_s_whole_budget_is_not_stored_and_evicts_nothing_on_either_engine(database_url):
    store = ResponseStore(database_url, max_items=10, max_age=3600, max_bytes=2000)
    assert store.put(response(1), said(100), "team-a")
    big = {**response(2), "output_text": "é" * 1200}  # 1,200 characters, but 2,400 bytes in UTF-8
    assert store.put(big, [], "team-a") is False
    assert store.response("resp_2", "team-a") is None and store.messages("resp_2", "team-a") is None
    assert store.messages("resp_1", "team-a") == said(100)
    assert not store.put(response(3), said(2000), "team-a")  # its conversation alone is past the budget
    assert store.response("resp_3", None) is None and store.response("resp_1", "team-a") is not None


def test_a_key_s_byte_bound_holds_for_puts_at_once_on_either_engine(database_url):
    start = threading.Barrier(4)
    held: list[int] = []  # the key's responses, seen after each put

    def worker(number: int) -> None:
        mine = ResponseStore(database_url, max_items=100, max_age=3600, max_bytes=3500)  # its own connections
        start.wait()
        for index in range(10):
            mine.put(response(10 * number + index), said(1000), "team-a")  # some 1,070 bytes each: three fit
            with mine.database.read() as db:
                held.append(db.scalar(sa.text("SELECT count(*) FROM responses WHERE owner = 'team-a'")))

    threads = [threading.Thread(target=worker, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(held) == 40 and max(held) == 3 and held[-1] == 3
