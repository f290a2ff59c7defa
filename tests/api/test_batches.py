"""OpenAI's Batch API on the fake engine: files, batches, their lines run through the app, cancel, expiry, recovery.

The runner's loop is a greenlet in a real worker; here its lines are claimed and run one by one with
:meth:`BatchRunner.run_line`, synchronously, through the same dispatch.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time

import pytest

from phi_api import jsontext
from phi_api.batches.lines import Answer
from phi_api.batches.runner import alive, owner_id, runner_of
from phi_api.service.admission import BATCH_PRIORITY
from phi_api.storage.batches import BatchStore
from phi_api.web.resources import get_batches, get_limiter, get_models, get_resources
from tests.support.fakes import fake_engine, text_pieces

CHAT = "/v1/chat/completions"


def line(custom_id: str, body: dict | None = None, url: str = CHAT, **extra) -> dict:
    body = body if body is not None else {"model": "test-model", "messages": [{"role": "user", "content": custom_id}],
                                          "max_tokens": 4, "temperature": 0}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


def jsonl(*items) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


@pytest.fixture
def engine():
    return fake_engine([1, 2, 0], text_pieces(b"ok", b"!"))


@pytest.fixture
def app(make_app, engine, tmp_path):
    return make_app(engine, BATCH_DIR=str(tmp_path / "batches"))


def upload(client, data: bytes, purpose: str = "batch", name: str = "requests.jsonl"):
    return client.post("/v1/files", data={"purpose": purpose, "file": (io.BytesIO(data), name)},
                       content_type="multipart/form-data")


def create(client, data: bytes, endpoint: str = CHAT) -> dict:
    uploaded = upload(client, data)
    assert uploaded.status_code == 200, uploaded.get_json()
    answer = client.post("/v1/batches", json={"input_file_id": uploaded.get_json()["id"], "endpoint": endpoint,
                                               "completion_window": "24h", "metadata": {"job": "nightly"}})
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


def runner(app):
    return runner_of(get_resources(app))


def run_all(app) -> None:
    work = runner(app)
    while (claimed := get_batches(app).claim(work.owner)) is not None:
        work.run_line(claimed)


def content(client, file_id: str) -> list[dict]:
    answer = client.get(f"/v1/files/{file_id}/content")
    assert answer.status_code == 200
    return [json.loads(text) for text in answer.get_data().splitlines()]


def test_files_are_uploaded_listed_read_and_deleted(app):
    client = app.test_client()
    data = jsonl(line("a"))
    made = upload(client, data).get_json()
    assert made["object"] == "file" and made["purpose"] == "batch" and made["bytes"] == len(data)
    assert made["filename"] == "requests.jsonl"
    assert [item["id"] for item in client.get("/v1/files").get_json()["data"]] == [made["id"]]
    assert client.get(f"/v1/files/{made['id']}").get_json() == made
    assert client.get(f"/v1/files/{made['id']}/content").get_data() == data
    assert client.delete(f"/v1/files/{made['id']}").get_json() == {"id": made["id"], "object": "file",
                                                                    "deleted": True}
    for path in (f"/v1/files/{made['id']}", f"/v1/files/{made['id']}/content"):
        assert client.get(path).status_code == 404
    assert client.delete(f"/v1/files/{made['id']}").status_code == 404


def test_a_batch_runs_each_line_through_the_endpoint_below_every_live_request(app, engine):
    client = app.test_client()
    bad = {"model": "test-model", "messages": [{"role": "user", "content": "x"}], "temperature": 5}
    batch = create(client, jsonl(line("first"), line("second"), line("bad", bad)))
    assert batch["status"] == "validating" and batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"job": "nightly"}
    run_all(app)
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert done["completed_at"] >= done["in_progress_at"] >= batch["created_at"]
    output = content(client, done["output_file_id"])
    assert [item["custom_id"] for item in output] == ["first", "second"]
    assert all(item["response"]["status_code"] == 200 and item["error"] is None for item in output)
    assert output[0]["response"]["body"]["object"] == "chat.completion"
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "ok!"
    [failed] = content(client, done["error_file_id"])
    assert failed["custom_id"] == "bad" and failed["response"]["status_code"] == 400
    assert failed["response"]["body"]["error"]["param"] == "temperature"
    assert engine.model.script.priorities == [BATCH_PRIORITY, BATCH_PRIORITY]


def test_batch_lines_run_outside_the_concurrency_limit(make_app, engine, tmp_path):
    app = make_app(engine, BATCH_DIR=str(tmp_path), MAX_CONCURRENT_REQUESTS=1)
    client = app.test_client()
    held = get_limiter(app).try_acquire()  # a live request holds the only slot
    assert client.post(CHAT, json=line("x")["body"]).status_code == 429
    batch = create(client, jsonl(line("x")))
    run_all(app)
    held.release()
    assert client.get(f"/v1/batches/{batch['id']}").get_json()["request_counts"]["completed"] == 1


def test_batch_lines_need_no_key_but_the_batch_routes_do(make_app, engine, tmp_path):
    app = make_app(engine, BATCH_DIR=str(tmp_path), API_KEYS="secret")
    client = app.test_client()
    assert client.get("/v1/batches").status_code == 401
    client.environ_base["HTTP_AUTHORIZATION"] = "Bearer secret"
    batch = create(client, jsonl(line("x")))
    run_all(app)
    assert client.get(f"/v1/batches/{batch['id']}").get_json()["request_counts"]["completed"] == 1


@pytest.mark.parametrize("bad_line,code", [
    (b"not json", "invalid_json_line"),
    (json.dumps({"method": "POST", "url": CHAT, "body": {}}).encode(), "missing_custom_id"),
    (json.dumps(line("a")).encode(), "duplicate_custom_id"),
    (json.dumps(line("b", method="GET")).encode(), "invalid_method"),
    (json.dumps(line("c", url="/v1/completions")).encode(), "mismatched_endpoint"),
    (json.dumps({**line("d"), "body": []}).encode(), "invalid_body"),
])
def test_a_file_with_a_bad_line_fails_the_batch_naming_the_line(app, engine, bad_line, code):
    batch = create(app.test_client(), jsonl(line("a")) + bad_line + b"\n")
    assert batch["status"] == "failed" and batch["failed_at"]
    assert batch["errors"]["data"] == [{"code": code, "message": batch["errors"]["data"][0]["message"],
                                        "param": batch["errors"]["data"][0]["param"], "line": 2}]
    run_all(app)
    assert engine.model.script.priorities == []  # none of its lines ran


def test_a_cancelled_batch_ends_after_its_running_line_with_the_rest_reported(app):
    client = app.test_client()
    batch = create(client, jsonl(line("a"), line("b"), line("c")))
    work = runner(app)
    claimed = get_batches(app).claim(work.owner)
    cancelling = client.post(f"/v1/batches/{batch['id']}/cancel").get_json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
    work.run_line(claimed)
    assert get_batches(app).claim(work.owner) is None
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert done["status"] == "cancelled" and done["cancelled_at"]
    assert [item["custom_id"] for item in content(client, done["output_file_id"])] == ["a"]
    assert [item["error"]["code"] for item in content(client, done["error_file_id"])] == ["batch_cancelled"] * 2
    assert client.post(f"/v1/batches/{batch['id']}/cancel").status_code == 400


def test_lines_not_run_within_the_completion_window_expire(app):
    client = app.test_client()
    batch = create(client, jsonl(line("a"), line("b")))
    get_batches(app).expire(time.time() + 2 * 86_400)
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert done["status"] == "expired" and done["expired_at"] and done["request_counts"]["failed"] == 2
    assert [item["error"]["code"] for item in content(client, done["error_file_id"])] == ["batch_expired"] * 2


def test_a_line_claimed_by_a_worker_that_died_runs_again(app):
    client = app.test_client()
    create(client, jsonl(line("a")))
    store = get_batches(app)
    dead = f"{socket.gethostname()}:1:dead"
    taken = store.claim(dead)
    assert store.claim(owner_id()) is None
    assert store.recover(alive) == 1
    again = store.claim(owner_id())
    assert again is not None and (again.batch_id, again.line) == (taken.batch_id, taken.line)
    assert alive(owner_id()) and not alive(dead)
    assert alive("another-machine:1:dead")  # another replica's workers: left to the lease


def test_a_claim_is_a_lease_and_only_the_claim_holding_the_line_records_its_answer(app):
    client = app.test_client()
    create(client, jsonl(line("a")))
    store = get_batches(app)
    store.lease = 0.2
    first = store.claim("host-a:1:x")
    assert store.claim("host-b:2:y") is None  # held
    assert store.renew(first)
    deadline = time.monotonic() + 10
    while (second := store.claim("host-b:2:y")) is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the lease runs out (a condition, polled)
    assert second is not None and (second.batch_id, second.line) == (first.batch_id, first.line)
    assert not store.renew(first) and not store.finish(first, 200, {"late": True}, "req-1")
    assert store.finish(second, 200, {"ok": True}, "req-2")
    done = store.batch(first.batch_id)
    assert done["status"] == "completed" and done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert [item["response"]["body"] for item in content(client, done["output_file_id"])] == [{"ok": True}]


def test_two_workers_claiming_at_once_take_each_line_once(app, tmp_path):
    create(app.test_client(), jsonl(*(line(f"l{index}") for index in range(40))))
    url = get_batches(app).database.url
    claimed: list[list[tuple[str, int]]] = [[], []]
    start = threading.Barrier(2)

    def worker(number: int) -> None:
        store = BatchStore(url)  # its own connection, as another worker's
        start.wait()
        while (taken := store.claim(f"{number}:x")) is not None:
            claimed[number].append((taken.batch_id, taken.line))

    threads = [threading.Thread(target=worker, args=(number,)) for number in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = claimed[0] + claimed[1]
    assert len(every) == 40 and len(set(every)) == 40


def test_batches_are_listed_newest_first_and_paginated(app):
    client = app.test_client()
    made = [create(client, jsonl(line("a")))["id"] for _ in range(3)]
    page = client.get("/v1/batches?limit=2").get_json()
    assert [item["id"] for item in page["data"]] == made[::-1][:2] and page["has_more"]
    rest = client.get(f"/v1/batches?limit=2&after={page['last_id']}").get_json()
    assert [item["id"] for item in rest["data"]] == [made[0]] and not rest["has_more"]
    for bad in ("0", "x", "-1", "%C2%B2"):  # ("²": a digit to isdigit(), not to int(): a 500 once)
        for route in ("/v1/batches", "/v1/files"):
            refused = client.get(f"{route}?limit={bad}")
            assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "limit"


@pytest.mark.parametrize("body,param", [
    ({"endpoint": CHAT, "completion_window": "24h"}, "input_file_id"),
    ({"input_file_id": "file-x", "endpoint": "/v1/moderations", "completion_window": "24h"}, "endpoint"),
    ({"input_file_id": "file-x", "endpoint": CHAT, "completion_window": "1h"}, "completion_window"),
    ({"input_file_id": "file-nope", "endpoint": CHAT, "completion_window": "24h"}, "input_file_id"),
])
def test_a_batch_that_cannot_be_made_is_a_400_naming_the_field(app, body, param):
    answer = app.test_client().post("/v1/batches", json=body)
    assert answer.status_code == 400 and answer.get_json()["error"]["param"] == param


def test_uploads_need_a_batch_purpose_a_file_and_a_size_within_the_limit(make_app, engine, tmp_path):
    app = make_app(engine, BATCH_DIR=str(tmp_path), BATCH_FILE_MB=0.001)
    client = app.test_client()
    assert upload(client, b"{}", purpose="fine-tune").get_json()["error"]["param"] == "purpose"
    assert client.post("/v1/files", data={"purpose": "batch"}, content_type="multipart/form-data"
                       ).get_json()["error"]["param"] == "file"
    assert upload(client, b"x" * 2000).status_code == 413
    assert client.get("/v1/batches/batch_nope").status_code == 404


def test_an_upload_is_multipart_and_a_chunked_one_is_cut_at_its_room_not_spooled_whole(make_app, engine, tmp_path):
    app = make_app(engine, BATCH_DIR=str(tmp_path), FILES_MAX_MB_PER_KEY=0.1)  # ~105 KB of room
    client = app.test_client()
    form = client.post("/v1/files", data=b"purpose=batch&" + b"a&" * 50_000,
                       content_type="application/x-www-form-urlencoded")
    assert form.status_code == 415  # refused unparsed (werkzeug parses such a form whole, in pure Python)
    body = (b"--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--b\r\n"
            b"Content-Disposition: form-data; name=\"file\"; filename=\"f.jsonl\"\r\n\r\n"
            + b"{}\n" * 100_000 + b"\r\n--b--\r\n")  # 300 KB, its length unknown to the server
    chunked = client.post("/v1/files", input_stream=io.BytesIO(body), content_type="multipart/form-data; boundary=b",
                          headers={"Transfer-Encoding": "chunked"}, environ_overrides={"wsgi.input_terminated": True})
    assert chunked.status_code == 413  # cut while read: its room and the form's parts, not BATCH_FILE_MB
    assert client.get("/v1/files").get_json()["data"] == []


def test_a_line_the_server_cannot_take_now_goes_back_to_the_queue(app):
    client = app.test_client()
    batch = create(client, jsonl(line("a")))
    work = runner(app)
    work.dispatch = lambda line: Answer(503, {"error": {"message": "shutting down"}}, "r", unavailable=True)
    work.run_line(get_batches(app).claim(work.owner))
    assert client.get(f"/v1/batches/{batch['id']}").get_json()["request_counts"]["failed"] == 0
    run_all(app)  # the real dispatch now
    assert client.get(f"/v1/batches/{batch['id']}").get_json()["request_counts"]["completed"] == 1


def test_a_worker_shutting_down_claims_no_line_and_leaves_them_to_another(app):
    client = app.test_client()
    create(client, jsonl(line("a")))
    work = runner(app)
    get_models(app).drain()
    assert work.next_line() is None  # (it used to claim, get a 503, give the line back, and claim it again)
    assert get_batches(app).claim("another worker") is not None


@pytest.mark.parametrize("endpoint,body,kind", [
    ("/v1/completions", {"model": "test-model", "prompt": "Once", "max_tokens": 4}, "text_completion"),
    ("/v1/responses", {"model": "test-model", "input": "Once", "max_output_tokens": 16}, "response"),
])
def test_completions_and_responses_run_as_batch_endpoints(app, endpoint, body, kind):
    client = app.test_client()
    batch = create(client, jsonl(line("one", body, url=endpoint)), endpoint=endpoint)
    run_all(app)
    done = client.get(f"/v1/batches/{batch['id']}").get_json()
    [result] = content(client, done["output_file_id"])
    assert result["response"]["status_code"] == 200 and result["response"]["body"]["object"] == kind


def test_a_streaming_line_is_answered_with_an_error_not_a_stream(app):
    client = app.test_client()
    streaming = {"model": "test-model", "messages": [{"role": "user", "content": "x"}], "stream": True}
    batch = create(client, jsonl(line("s", streaming)))
    run_all(app)
    [failed] = content(client, client.get(f"/v1/batches/{batch['id']}").get_json()["error_file_id"])
    assert failed["response"]["status_code"] == 400 and failed["response"]["body"]["error"]["param"] == "stream"


def test_a_line_longer_than_a_request_body_may_be_fails_the_batch_unread(make_app, engine, tmp_path, monkeypatch):
    app = make_app(engine, BATCH_DIR=str(tmp_path), MAX_REQUEST_SIZE_MB=0.001)
    longest = int(0.001 * 1024 * 1024)
    read = []
    real_loads = jsontext.strict_loads
    monkeypatch.setattr(jsontext, "strict_loads", lambda text: read.append(len(text)) or real_loads(text))
    fits = json.dumps(line("a", {"model": "test-model", "messages": [{"role": "user", "content": ""}]}))
    fits = fits.replace('"content": ""', '"content": "' + "x" * (longest - len(fits)) + '"')
    too_long = json.dumps(line("b", {"model": "test-model", "messages": [{"role": "user", "content": "x" * longest}]}))
    assert len(fits) == longest and len(too_long) > longest
    batch = create(app.test_client(), (fits + "\n" + too_long + "\n").encode())
    assert batch["status"] == "failed" and [(error["code"], error["line"]) for error in batch["errors"]["data"]] == \
        [("invalid_json_line", 2)]
    assert "MAX_REQUEST_SIZE_MB" in batch["errors"]["data"][0]["message"]
    assert longest in read and max(read) == longest  # the line that fits was read; the other never reached the parser
