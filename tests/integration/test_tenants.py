"""Two teams and an operator share one server (real gunicorn, two workers, the real model), through the official
clients: each key's files, batches and stored responses are its own; models are managed by the admin key only;
prompts are reused only within a key (and a ``cache_salt``), in memory and from disk after a restart; usage and
stored responses survive the restart; a batch's lines and a bench run count against their key and its limits."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest
import requests
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

TEAM_A, TEAM_B, OPS = "sk-team-a-secret", "sk-team-b-secret", "sk-ops-secret"
TEAM_C, TEAM_D = "sk-team-c-secret", "sk-team-d-secret"
DOCUMENT = " ".join(f"Entry {i}: the ferry to island {i} leaves at {6 + i % 12} o'clock with {i % 4} crates."
                    for i in range(30))  # ~700 tokens: several chunks of the prefill grid


def keys_file(folder: Path) -> Path:
    path = folder / "keys.json"
    path.write_text(json.dumps({"keys": [
        {"name": "team-a", "key": TEAM_A}, {"name": "team-b", "key": TEAM_B},
        {"name": "ops", "key": OPS, "admin": True},
        {"name": "team-c", "key": TEAM_C}, {"name": "team-d", "key": TEAM_D, "requests_per_minute": 1}]}))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tenants")
    return {"keys": keys_file(root), "data": root / "data", "prefixes": root / "prefixes"}


def start(logs_dir: Path, model_path: str, folders: dict[str, Path]) -> Server:
    return Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2,
                  API_KEYS_FILE=folders["keys"], DATA_DIR=folders["data"], PREFIX_CACHE_DIR=folders["prefixes"],
                  BATCH_CONCURRENCY=1).start()


@pytest.fixture(scope="module")
def server(model_path, logs_dir, folders) -> Iterator[Server]:
    running = start(logs_dir, model_path, folders)
    try:
        yield running
    finally:
        running.stop()


def client(server: Server, key: str) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def pinned(server: Server, pid: int, key: str) -> OpenAI:
    """The openai client on a keep-alive connection worker ``pid`` accepted (its memory holds the prompts)."""

    def connect() -> OpenAI:
        http = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=120)
        made = OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, http_client=http)
        made.models.list()
        return made

    return server.connected_to(pid, connect)


def usage(server: Server, name: str) -> dict:
    data = requests.get(server.url + "/v1/usage/keys", headers={"Authorization": f"Bearer {OPS}"}, timeout=30)
    return next(item for item in data.json()["data"] if item["name"] == name)


def ask(made: OpenAI, content: str, **extra):
    return made.chat.completions.create(model=MODEL_ID, max_tokens=4, temperature=0,
                                        messages=[{"role": "user", "content": content}], **extra)


def cached(answer) -> int:
    details = answer.usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def batch_of(made: OpenAI, questions: list[str]):
    lines = [{"custom_id": f"q{index}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL_ID, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]}}
             for index, question in enumerate(questions)]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = made.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    return uploaded, made.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")


def test_files_batches_and_their_outputs_belong_to_the_key_that_made_them(server):
    a, b, ops = client(server, TEAM_A), client(server, TEAM_B), client(server, OPS)
    uploaded, batch = batch_of(a, ["What is 2 + 2?"])
    done = wait_until(lambda: (found := a.batches.retrieve(batch.id)).status == "completed" and found, 120,
                      interval=0.2, message="team-a's batch to end")
    for attempt in (lambda: b.files.retrieve(uploaded.id), lambda: b.files.content(uploaded.id),
                    lambda: b.files.delete(uploaded.id), lambda: b.batches.retrieve(batch.id),
                    lambda: b.batches.cancel(batch.id), lambda: b.files.retrieve(done.output_file_id),
                    lambda: b.files.content(done.output_file_id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    answers = []
    for file_id in (uploaded.id, "file-" + "0" * 24):  # another key's file, and one that never was: alike
        with pytest.raises(openai.BadRequestError) as refused:
            b.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        answers.append(refused.value.message.replace(file_id, "X"))
    assert answers[0] == answers[1]
    assert uploaded.id not in {item.id for item in b.files.list()}
    assert batch.id not in {item.id for item in b.batches.list()}
    assert {uploaded.id, done.output_file_id} <= {item.id for item in a.files.list()}
    assert batch.id in {item.id for item in ops.batches.list()}  # the admin key sees every key's
    assert a.files.content(done.output_file_id).text.count("\n") == 1  # still there: team-b's delete did nothing


def test_stored_responses_are_their_key_s_alone(server):
    a, b = client(server, TEAM_A), client(server, TEAM_B)
    first = a.responses.create(model=MODEL_ID, input="Name a colour.", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as foreign:
        b.responses.create(model=MODEL_ID, previous_response_id=first.id, input="And another?", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError) as unknown:
        b.responses.create(model=MODEL_ID, previous_response_id="resp_" + "0" * 24, input="And another?",
                           max_output_tokens=4)
    assert foreign.value.code == unknown.value.code == "previous_response_not_found"  # as if it never was
    assert foreign.value.message.replace(first.id, "X") == unknown.value.message.replace("resp_" + "0" * 24, "X")
    assert a.responses.retrieve(first.id).id == first.id
    follow = a.responses.create(model=MODEL_ID, previous_response_id=first.id, input="Another?", max_output_tokens=4)
    assert follow.status in ("completed", "incomplete")


def test_only_the_admin_key_manages_models_and_an_ordinary_key_learns_nothing_of_the_disk(server, model_path):
    headers = {"Authorization": f"Bearer {TEAM_A}"}

    def post(path: str, body: dict) -> requests.Response:
        return requests.post(server.url + path, json=body, headers=headers, timeout=60)

    real, missing = post("/v1/models/load", {"model": "x", "path": model_path}), \
        post("/v1/models/load", {"model": "x", "path": "/no/such/folder"})
    assert real.status_code == missing.status_code == 403 and real.json() == missing.json()
    assert real.json()["error"]["code"] == "permission_denied"
    for path, body in (("/v1/models/unload", {"model": MODEL_ID}), ("/openarc/load",
                       {"model_name": "x", "model_path": model_path}), ("/openarc/unload", {"model_name": MODEL_ID}),
                       ("/v1/models/load", {"model": "owner/../secret"})):
        assert post(path, body).status_code == 403, path
    team = ollama.Client(host=server.url, headers=headers)
    for attempt in (lambda: team.delete(MODEL_ID), lambda: team.pull("owner/name", stream=False),
                    lambda: team.generate(model=MODEL_ID, prompt="Hi", keep_alive=0, options={"num_predict": 2})):
        with pytest.raises(ollama.ResponseError) as refused:
            attempt()
        assert refused.value.status_code == 403
    assert requests.get(server.url + "/v1/usage/keys", headers=headers, timeout=30).status_code == 403
    metrics = requests.get(server.url + "/metrics", headers=headers, timeout=30).text
    assert "phi_api_key_" not in metrics and "phi_api_requests_total" in metrics
    assert "phi_api_key_requests_total" in requests.get(server.url + "/metrics", timeout=30,
                                                        headers={"Authorization": f"Bearer {OPS}"}).text
    assert [model.id for model in client(server, TEAM_B).models.list()] == [MODEL_ID]  # still served
    bad_name = requests.post(server.url + "/v1/models/load", json={"model": "owner/../secret"}, timeout=60,
                             headers={"Authorization": f"Bearer {OPS}"})
    assert bad_name.status_code == 400 and bad_name.json()["error"]["param"] == "model"  # before any download


def test_a_prompt_is_reused_only_for_its_own_key_and_salt(server):
    pid = server.worker_pids()[0]
    a = pinned(server, pid, TEAM_A)
    question = DOCUMENT + " Which island has the earliest ferry?"
    first = cached(ask(a, question))  # at most the chat template's start, from team-a's own earlier requests
    assert cached(ask(a, question)) > first + 500  # team-a's own repeat: reused
    # Connected now: a connection idle for gunicorn's keepalive (5 s) is closed, and a new one may reach either worker.
    b = pinned(server, pid, TEAM_B)
    assert cached(ask(b, question)) == 0  # the same prompt from team-b (which has generated nothing): nothing
    assert cached(ask(a, question, extra_body={"cache_salt": "tenant-1"})) == 0  # a salt narrows it further


def disk_written(server: Server) -> float:
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {OPS}"}, timeout=30).text
    return sum(float(value) for value in re.findall(r"^phi_api_prefix_disk_written_tokens_total\{[^}]*\} (\S+)$",
                                                     text, re.MULTILINE))


def test_after_a_restart_usage_stored_responses_and_per_key_prompts_remain(server, model_path, logs_dir, folders):
    a = client(server, TEAM_A)
    question = "Remember this: " + DOCUMENT + " Which island has the most crates?"
    written = disk_written(server)
    ask(a, question)
    wait_until(lambda: disk_written(server) >= written + 256, 60, message="the prompt's chunks to be written")
    kept = a.responses.create(model=MODEL_ID, input="Say yes.", max_output_tokens=4)
    before = usage(server, "team-a")
    server.stop()
    again = start(logs_dir, model_path, folders)
    try:
        after = usage(again, "team-a")
        assert after["requests"] == before["requests"] > 0 and after["now"]["tokens_today"] == \
            before["now"]["tokens_today"] > 0
        a2, b2 = client(again, TEAM_A), client(again, TEAM_B)
        assert a2.responses.retrieve(kept.id).id == kept.id
        assert cached(ask(b2, question)) == 0  # team-b reads nothing of team-a's from disk
        assert cached(ask(a2, question)) >= 256  # team-a's own prompt, read from disk (nothing is in memory)
    finally:
        again.stop()
        server.start()  # the module's server, as it was, for the tests after this one


def test_a_batch_and_a_bench_run_count_against_their_key(server):
    headers = {"Authorization": f"Bearer {TEAM_C}"}
    start_usage = usage(server, "team-c")
    bench = requests.post(server.url + "/v1/bench", headers=headers, timeout=120,
                          json={"model": MODEL_ID, "input_ids": [1, 2, 3, 4], "max_tokens": 4})
    assert bench.status_code == 200 and bench.json()["metrics"]
    after_bench = usage(server, "team-c")
    assert after_bench["requests"] == start_usage["requests"] + 1
    assert after_bench["completion_tokens"] == start_usage["completion_tokens"] + 4
    c = client(server, TEAM_C)
    _, batch = batch_of(c, ["One?", "Two?"])
    wait_until(lambda: c.batches.retrieve(batch.id).status == "completed", 120, interval=0.2,
               message="team-c's batch to end")
    after_batch = usage(server, "team-c")
    assert after_batch["requests"] == after_bench["requests"] + 3  # its two lines, and the file's upload
    assert after_batch["prompt_tokens"] > after_bench["prompt_tokens"] + 10


def refused_lines(server: Server) -> float:
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {OPS}"}, timeout=30).text
    return sum(float(value) for value in re.findall(
        r'^phi_api_requests_total\{[^}]*route="/v1/chat/completions"[^}]*status="429"[^}]*\} (\S+)$', text,
        re.MULTILINE))


def test_a_batch_line_waits_for_its_key_s_limit_and_never_fails_for_it(server):
    d = client(server, TEAM_D)  # requests_per_minute: 1
    line = {"custom_id": "q0", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": "One?"}]}}
    uploaded = d.files.create(file=("requests.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                              purpose="batch")  # an upload counts as a request
    for _ in range(3):  # the key's request of this minute used up (a minute may have just begun: at most twice)
        try:
            ask(d, "Hi")
        except openai.RateLimitError:
            break
    refused = refused_lines(server)
    batch = d.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: refused_lines(server) > refused or d.batches.retrieve(batch.id).status == "completed", 120,
               interval=0.2, message="team-d's line to be refused for its limit, or to run in a new minute")
    state = d.batches.retrieve(batch.id)
    assert state.request_counts.failed == 0 and state.status in ("in_progress", "completed")
    assert usage(server, "team-d")["now"]["requests_this_minute"] <= 1  # the limit held


def queued(server: Server) -> float:
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TEAM_B}"}, timeout=30).text
    return sum(float(value) for value in re.findall(r"^phi_api_requests_queued(?:\{[^}]*\})? (\S+)$", text,
                                                     re.MULTILINE))


def answered(server: Server, status: str) -> float:
    """The chat route's requests answered with ``status``, by the server's metrics."""
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TEAM_B}"}, timeout=30).text
    pattern = (r'^phi_api_requests_total\{[^}]*route="/v1/chat/completions"[^}]*status="' + status
               + r'"[^}]*\} (\S+)$')
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def test_one_key_s_burst_cannot_fill_the_waiting_line(model_path, logs_dir, tmp_path):
    """One slot, a line of 3: team-a's burst of 5 takes the slot and the line (its fifth gets 429); team-b's one
    request still gets a place, the newest of team-a's, and is served before team-a's older waiters."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": TEAM_A}, {"name": "team-b", "key": TEAM_B}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, API_KEYS_FILE=keys,
                MAX_CONCURRENT_REQUESTS=1, MAX_QUEUED_REQUESTS=3, QUEUE_TIMEOUT=120) as server:
        outcomes: dict[str, list] = {"team-a": [], "team-b": []}

        def send(name: str, key: str, tokens: int) -> None:
            try:
                answer = client(server, key).chat.completions.create(
                    model=MODEL_ID, max_tokens=tokens, temperature=0, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": "Tell a long story."}])
                outcomes[name].append((200, time.monotonic(), answer.usage.completion_tokens))
            except openai.RateLimitError:
                outcomes[name].append((429, time.monotonic(), 0))

        burst = [threading.Thread(target=send, args=("team-a", TEAM_A, 200)) for _ in range(5)]
        for thread in burst:
            thread.start()
        wait_until(lambda: queued(server) == 3 and len(outcomes["team-a"]) == 1, 60,
                   message="team-a's burst to fill the slot and the line, its last refused")
        other = threading.Thread(target=send, args=("team-b", TEAM_B, 4))
        other.start()
        for thread in [*burst, other]:
            thread.join(timeout=300)
    a_statuses = sorted(status for status, _, _ in outcomes["team-a"])
    assert a_statuses == [200, 200, 200, 429, 429]  # one refused at once, one bumped for team-b
    [(b_status, b_done, _)] = outcomes["team-b"]
    a_done = sorted(done for status, done, _ in outcomes["team-a"] if status == 200)
    assert b_status == 200 and b_done < a_done[-1]  # served before team-a's last waiter


def test_a_waiter_whose_client_left_gives_up_its_place_in_line(model_path, logs_dir, tmp_path):
    """One slot, a line of 1: a request waits in line, and its client closes the connection. Its place is free
    again at once (before, it kept it until the slot came, and the next request got 429): the next request waits
    in it and is served."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": TEAM_A}, {"name": "team-b", "key": TEAM_B}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, API_KEYS_FILE=keys,
                MAX_CONCURRENT_REQUESTS=1, MAX_QUEUED_REQUESTS=1, QUEUE_TIMEOUT=120) as server:
        running = client(server, TEAM_A).chat.completions.create(
            model=MODEL_ID, max_tokens=6000, temperature=0, stream=True, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": "Tell a long story."}])
        chunks = iter(running)
        next(chunks)  # it holds the slot

        def drain() -> None:
            try:
                for _ in chunks:
                    pass
            except (openai.APIConnectionError, httpx.HTTPError):  # closed below, while it reads
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        body = json.dumps({"model": MODEL_ID, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as ghost:
            ghost.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEAM_A}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
            wait_until(lambda: queued(server) == 1, 60, message="the ghost's request to wait in line")
        wait_until(lambda: queued(server) == 0, 10, message="the ghost's place to be given up")
        wait_until(lambda: answered(server, "499") == 1, 10, message="the ghost counted as a client that left")
        assert answered(server, "429") == 0  # not as a request refused for want of a slot
        assert reader.is_alive()  # the running stream still holds the slot: the place was given up, not served
        outcome: list = []
        waiter = threading.Thread(target=lambda: outcome.append(client(server, TEAM_B).chat.completions.create(
            model=MODEL_ID, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])))
        waiter.start()
        wait_until(lambda: queued(server) == 1 or not waiter.is_alive(), 60, message="the next request to wait")
        running.close()  # the slot is given back
        waiter.join(timeout=120)
    assert len(outcome) == 1 and outcome[0].usage.completion_tokens >= 1
