"""A shared server tried as a hostile tenant would (real gunicorn, one worker, the real model, a keys file with
limits), through the official clients: each test is one hole found that way, and fails on the code before its fix.

Keys: team-a (1 request a minute), team-b (50 tokens a day), team-c (no limits), team-d (1 request a minute, for
batches), team-e and team-f (no limits; 3 files, 1 MB each), ops (admin, kept in the keys file as its SHA-256 only).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import re
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest
import requests
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.faults import FAIL_START_SEED
from tests.support.server import Server, wait_until

TEAM_A, TEAM_B, TEAM_C = "sk-hostile-team-a", "sk-hostile-team-b", "sk-hostile-team-c"
TEAM_D, TEAM_E, TEAM_F, OPS = "sk-hostile-team-d", "sk-hostile-team-e", "sk-hostile-team-f", "sk-hostile-ops"
DOCUMENT = " ".join(f"Entry {i}: the ferry to island {i} leaves at {6 + i % 12} o'clock with {i % 4} crates."
                    for i in range(40))  # ~900 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    keys = root / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "team-a", "key": TEAM_A, "requests_per_minute": 1, "max_concurrent_requests": 1},
        {"name": "team-b", "key": TEAM_B, "tokens_per_day": 50},
        {"name": "team-c", "key": TEAM_C},
        {"name": "team-d", "key": TEAM_D, "requests_per_minute": 1},
        {"name": "team-e", "key": TEAM_E},
        {"name": "team-f", "key": TEAM_F},
        {"name": "ops", "key_sha256": hashlib.sha256(OPS.encode()).hexdigest(), "admin": True}]}))
    return {"keys": keys, "data": root / "data"}


@pytest.fixture(scope="module")
def server(model_path, logs_dir, folders) -> Iterator[Server]:
    with Server(logs_dir, app="tests.support.faulty_wsgi:app", MODEL_PATH=model_path, MODEL_ID=MODEL_ID,
                WEB_CONCURRENCY=1, API_KEYS_FILE=folders["keys"], DATA_DIR=folders["data"], BATCH_CONCURRENCY=1,
                FILES_MAX_PER_KEY=3, FILES_MAX_MB_PER_KEY=1, UPLOAD_READ_TIMEOUT=3) as running:
        yield running


def as_key(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def client(server: Server, key: str) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=300)


def usage(server: Server, name: str) -> dict:
    data = requests.get(server.url + "/v1/usage/keys", headers=as_key(OPS), timeout=30).json()["data"]
    return next(item for item in data if item["name"] == name)


def served(server: Server) -> set[str]:
    return {model.id for model in client(server, OPS).models.list()}


def test_an_ordinary_key_s_keep_alive_never_unloads_a_model_an_admin_loaded(server, model_path):
    for name in ("second", "third"):
        loaded = requests.post(server.url + "/v1/models/load", json={"model": name, "path": model_path},
                               headers=as_key(OPS), timeout=120)
        assert loaded.status_code == 200, loaded.text
    ollama.Client(host=server.url, headers=as_key(TEAM_C)).generate(
        model="second", prompt="hi", keep_alive="1ms", options={"num_predict": 2})
    # The admin's own 1 ms is obeyed: once "third" is gone, the worker's expiry pass has run after both requests.
    ollama.Client(host=server.url, headers=as_key(OPS)).generate(
        model="third", prompt="hi", keep_alive="1ms", options={"num_predict": 2})
    wait_until(lambda: "third" not in served(server), 60, interval=0.2, message="the admin's model to expire")
    assert "second" in served(server)
    requests.post(server.url + "/v1/models/unload", json={"model": "second"}, headers=as_key(OPS), timeout=60)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_stream_its_client_leaves_counts_what_the_engine_did(server, kind):
    c = client(server, TEAM_C)
    before = usage(server, "team-c")
    if kind == "chat":
        stream = c.chat.completions.create(model=MODEL_ID, max_tokens=2000, stream=True,
                                           extra_body={"ignore_eos": True},
                                           messages=[{"role": "user", "content": "Tell a long story."}])
    else:
        stream = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=2000, stream=True,
                                      extra_body={"ignore_eos": True})
    read = 0
    for chunk in stream:
        read += bool(chunk.choices)
        if read >= 125:
            break
    stream.close()  # the client hangs up
    def counted() -> dict | None:
        now = usage(server, "team-c")
        return now if now["completion_tokens"] >= before["completion_tokens"] + 120 else None

    after = wait_until(counted, 60, interval=0.2, message="the abandoned stream's tokens in its key's usage")
    generated = after["completion_tokens"] - before["completion_tokens"]
    assert 120 <= generated < 2000  # what the engine did before the hang-up was noticed, not the whole answer
    assert after["requests"] == before["requests"] + 1 and after["prompt_tokens"] > before["prompt_tokens"]
    assert after["now"]["tokens_today"] >= before["now"]["tokens_today"] + generated


def test_a_request_that_could_pass_its_key_s_tokens_is_refused_before_any_work(server):
    b = client(server, TEAM_B)  # 50 tokens a day
    before = usage(server, "team-b")
    with pytest.raises(openai.RateLimitError) as refused:
        b.completions.create(model=MODEL_ID, prompt=["Hello there.", "General Kenobi."], n=4, max_tokens=200)
    assert refused.value.code == "request_too_large"
    assert usage(server, "team-b")["completion_tokens"] == before["completion_tokens"]  # nothing ran
    # Two requests that fit alone but not together: the first holds its worst case while it runs.
    first = b.with_raw_response.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=30, stream=True,
                                                   extra_body={"ignore_eos": True})
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 50 - 30  # the reservation told
    with pytest.raises(openai.RateLimitError) as second:
        b.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=30)
    assert second.value.code == "rate_limit_exceeded"
    assert int(second.value.response.headers["x-ratelimit-remaining-tokens"]) <= 20
    for _ in first.parse():  # read to its end: it used what it reserved at most
        pass
    after = wait_until(lambda: (now := usage(server, "team-b"))["completion_tokens"] > before["completion_tokens"]
                       and now, 30, message="the first request's tokens")
    assert after["now"]["tokens_today"] <= 50


def test_a_prediction_s_refused_tokens_are_charged_to_its_key(server):
    """OpenAI bills the predicted tokens its checks refuse as completion tokens: the engine checked them for the key.
    The prediction holds each 4-token window of the greedy answer followed by junk: each window matches the answer,
    and the junk after it is drafted and refused."""
    f = client(server, TEAM_F)
    ask = {"model": MODEL_ID, "max_tokens": 48, "temperature": 0, "extra_body": {"ignore_eos": True},
           "messages": [{"role": "user", "content": "Write a story about a lighthouse."}]}
    said = f.chat.completions.create(**ask).choices[0].message.content

    def post(route: str, body: dict) -> dict:
        return requests.post(server.url + route, headers=as_key(TEAM_F), json={"model": MODEL_ID, **body},
                             timeout=30).json()

    tokens = post("/tokenize", {"prompt": said})["tokens"]
    prediction = "".join(post("/detokenize", {"tokens": tokens[start - 4:start]})["content"] + " zebra" * 12
                         for start in range(4, len(tokens), 4))
    before = usage(server, "team-f")
    answer = f.chat.completions.create(**ask, prediction={"type": "content", "content": prediction})
    refused = answer.usage.completion_tokens_details.rejected_prediction_tokens
    assert 0 < refused <= len(post("/tokenize", {"prompt": prediction})["tokens"])  # its bound, reserved first
    after = wait_until(lambda: (now := usage(server, "team-f"))["completion_tokens"] > before["completion_tokens"]
                       and now, 30, message="the request's tokens in its key's usage")
    assert after["completion_tokens"] - before["completion_tokens"] == answer.usage.completion_tokens + refused


def batch_file(made: OpenAI, questions: list[str]):
    lines = [{"custom_id": f"q{index}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": question}]}}
             for index, question in enumerate(questions)]
    return made.files.create(file=("requests.jsonl", io.BytesIO(b"".join(json.dumps(line).encode() + b"\n"
                                                                         for line in lines))), purpose="batch")


def test_a_key_whose_limit_refuses_its_batch_lines_does_not_hold_back_another_key_s_batch(server):
    d, e = client(server, TEAM_D), client(server, TEAM_E)  # team-d: 1 request a minute, its upload one of them
    slow = d.batches.create(input_file_id=batch_file(d, ["One?", "Two?", "Three?", "Four?"]).id,
                            endpoint="/v1/chat/completions", completion_window="24h")
    quick = e.batches.create(input_file_id=batch_file(e, ["Five?"]).id, endpoint="/v1/chat/completions",
                             completion_window="24h")
    try:
        wait_until(lambda: e.batches.retrieve(quick.id).status == "completed", 90, interval=0.2,
                   message="team-e's batch to run beside team-d's, whose lines wait for its next minutes")
        assert d.batches.retrieve(slow.id).request_counts.completed < 4  # team-d's still waits on its limit
    finally:
        d.batches.cancel(slow.id)


def stall_ticks_over(server: Server, seconds: str) -> float:
    """Ticks of the worker's hub watch later than ``seconds`` (a bucket bound of phi_api_hub_stall_seconds)."""
    text = requests.get(server.url + "/metrics", headers=as_key(OPS), timeout=30).text
    count = float(re.search(r"^phi_api_hub_stall_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)[1])
    within = float(re.search(rf'^phi_api_hub_stall_seconds_bucket\{{le="{seconds}"\}} (\S+)$', text,
                             re.MULTILINE)[1])
    return count - within


def test_an_answer_is_bounded_before_it_is_computed_and_a_large_one_stalls_no_other_stream(server):
    c = client(server, TEAM_C)
    with pytest.raises(openai.BadRequestError) as refused:
        c.completions.create(model=MODEL_ID, prompt=[DOCUMENT * 2] * 16, n=8, echo=True, logprobs=20, max_tokens=1)
    assert refused.value.param == "logprobs" and "logprobs" in refused.value.message
    stalls = stall_ticks_over(server, "0.25")
    scored = c.completions.create(model=MODEL_ID, prompt=[DOCUMENT] * 4, n=8, echo=True, logprobs=20, max_tokens=1)
    assert len(scored.choices) == 32 and len(scored.choices[5].logprobs.tokens) > 800
    assert scored.choices[0].logprobs.token_logprobs[1:20] == scored.choices[7].logprobs.token_logprobs[1:20]
    assert stall_ticks_over(server, "0.25") == stalls  # the answer was made and encoded off the hub


def test_uploads_count_as_requests_and_a_key_s_files_have_a_quota(server):
    a = client(server, TEAM_A)  # 1 request a minute
    for _ in range(3):  # its request of this minute used up (a minute may have just begun: at most twice)
        try:
            a.chat.completions.create(model=MODEL_ID, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        except openai.RateLimitError:
            break
    with pytest.raises(openai.RateLimitError):
        a.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    e = client(server, TEAM_E)  # at most 3 files and 1 MB (its batch and the batch's output of the test above count)
    kept = [file.id for file in e.files.list()]
    while len(kept) < 3:
        kept.append(e.files.create(file=("e.jsonl", io.BytesIO(b"{}\n")), purpose="batch").id)
    with pytest.raises(openai.BadRequestError) as count:
        e.files.create(file=("more.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    assert count.value.code == "storage_quota_exceeded"
    e.files.delete(kept[-1])
    with pytest.raises(openai.BadRequestError) as size:
        e.files.create(file=("big.jsonl", io.BytesIO(b"{}\n" * 400_000)), purpose="batch")  # 1.2 MB
    assert size.value.code == "storage_quota_exceeded"
    assert len(e.files.list().data) == 2  # nothing of it was kept


def upload_headers(server: Server, key: str, length: int) -> socket.socket:
    """A connection that has sent an upload's headers, declaring ``length`` bytes of body, and none of the body."""
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    connection.sendall((f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                        "Content-Type: multipart/form-data; boundary=b\r\n"
                        f"Content-Length: {length}\r\n\r\n").encode())
    return connection


def answer_of(connection: socket.socket) -> tuple[int, str]:
    """The status and body the server answered on ``connection`` (within its timeout: else the test fails)."""
    response = http.client.HTTPResponse(connection)  # type: ignore[arg-type]
    response.begin()
    return response.status, response.read().decode()


def test_an_upload_s_room_in_its_key_s_quota_is_held_before_its_body_is_read(server):
    with upload_headers(server, TEAM_F, 2 * 2**20) as connection:  # more than its 1 MB: refused unread
        status, body = answer_of(connection)
    assert status == 400 and json.loads(body)["error"]["code"] == "storage_quota_exceeded"
    f = client(server, TEAM_F)
    with upload_headers(server, TEAM_F, 700_000) as slow:  # in flight, its body never sent
        try:
            f.files.create(file=("f.jsonl", io.BytesIO(b"{}\n" * 150_000)), purpose="batch")  # 450 KB
            taken = True
        except openai.BadRequestError as refused:
            assert refused.code == "storage_quota_exceeded"
            taken = False
        if taken:  # the SDK's upload reserved first: the slow one is refused at once, not when its body is in
            status, body = answer_of(slow)
            assert status == 400 and json.loads(body)["error"]["code"] == "storage_quota_exceeded"
        else:  # the slow one held the room; it ends at UPLOAD_READ_TIMEOUT (3 s) with a 408, giving it back
            assert answer_of(slow)[0] == 408
    if not taken:
        f.files.create(file=("f.jsonl", io.BytesIO(b"{}\n" * 150_000)), purpose="batch")
    assert [file.bytes for file in f.files.list()] == [450_000]


def test_a_path_cannot_forge_a_log_line_or_reach_a_terminal(server):
    mark = len(server.log())
    forged = "2026-11-27 06:09:00,000 INFO [7195] [0000] phi_api.access: DELETE /v1/files/x 200 1.0ms"
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/y%1b[31mRED%0d%0a" + forged.replace(" ", "%20"))
    assert connection.getresponse().status == 401
    connection.close()
    written = wait_until(lambda: "RED" in (text := server.log()[mark:]) and text, 30, message="the access line")
    assert "\x1b" not in written and "\r" not in written
    assert not [line for line in written.splitlines() if line.startswith(forged[:23])]
    assert "/y\\x1b[31mRED\\r\\n2026-11-27" in written


def test_cors_answers_any_origin_with_a_star_and_never_with_credentials(server):
    preflight = requests.options(server.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in preflight.headers


def test_one_request_failing_in_the_engine_ends_that_request_only(server):
    """A failure as one request's choices start (where a scheduling slip once failed the whole batch, and left a
    request that arrived then without any answer): every other request, streamed, whole and n > 1, ends as
    asked, and the failing one gets its error."""
    c = client(server, TEAM_C)
    messages = [{"role": "user", "content": "Count slowly."}]
    outcomes: dict[str, object] = {}
    started = threading.Event()

    def streamed() -> None:
        stream = c.chat.completions.create(model=MODEL_ID, max_tokens=60, stream=True, messages=messages,
                                           extra_body={"ignore_eos": True})
        reasons = []
        for chunk in stream:
            started.set()
            reasons += [choice.finish_reason for choice in chunk.choices if choice.finish_reason]
        outcomes["streamed"] = reasons

    def whole(n: int) -> None:
        answer = c.chat.completions.create(model=MODEL_ID, max_tokens=60, n=n, messages=messages,
                                           extra_body={"ignore_eos": True})
        outcomes[f"n={n}"] = [choice.finish_reason for choice in answer.choices]

    threads = [threading.Thread(target=streamed), threading.Thread(target=whole, args=(1,)),
               threading.Thread(target=whole, args=(3,))]
    for thread in threads:
        thread.start()
    assert started.wait(60)
    with pytest.raises(openai.InternalServerError) as failed:
        c.chat.completions.create(model=MODEL_ID, max_tokens=8, seed=FAIL_START_SEED, messages=messages)
    assert "injected" not in failed.value.message
    for thread in threads:
        thread.join(timeout=300)
    assert outcomes == {"streamed": ["length"], "n=1": ["length"], "n=3": ["length"] * 3}


def test_data_files_are_the_server_s_alone_and_a_hashed_key_is_accepted(server, folders):
    assert client(server, OPS).models.list().data  # ops's key is in the keys file only as its SHA-256
    data = folders["data"]
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    databases = list(data.rglob("*.sqlite3"))
    assert databases and all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in databases)
