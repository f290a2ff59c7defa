"""deploy/nginx/phi-api.conf, as shipped (ports substituted), in front of two real replicas on loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from phi_api.bench.replicas import Nginx, nginx_binary
from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

SYSTEM = "You are a helpful assistant. " + " ".join(f"Fact {i}: {i} cubed is {i ** 3}." for i in range(30))


@pytest.fixture
def cluster(model_path, logs_dir, tmp_path):
    """Two replicas (one worker, one intra-op thread each: two share this machine's cores) behind nginx."""
    settings = dict(MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, INTRA_OP_THREADS=1,
                    MAX_CONCURRENT_REQUESTS=4)
    if nginx_binary() is None:
        pytest.fail("The deployment tests need nginx: install Debian's package (make test installs it as root: "
                    "tests/system_packages.sh).")
    with Server(logs_dir, **settings) as first, Server(logs_dir, **settings) as second:
        proxy = Nginx(tmp_path / "nginx", [first, second])
        try:
            yield proxy, [first, second]
        finally:
            proxy.stop()


def served_by(replicas: list[Server], request_id: str) -> list[int]:
    """Which replicas logged the request ``request_id``."""
    return [index for index, replica in enumerate(replicas) if f"[{request_id}]" in replica.log()]


def chat(url: str, messages, request_id: str, session: str | None = None, **extra):
    headers = {"X-Request-Id": request_id, **({"X-Session-Id": session} if session else {})}
    body = {"model": MODEL_ID, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}
    response = requests.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_requests_spread_over_both_replicas(cluster):
    proxy, replicas = cluster
    ids = [f"spread-{uuid.uuid4().hex[:8]}" for _ in range(16)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda request_id: chat(proxy.url, [{"role": "user", "content": "Hi"}], request_id), ids))
    where = [wait_until(lambda request_id=request_id: served_by(replicas, request_id), timeout=10,
                        message=f"the log line of {request_id}") for request_id in ids]
    assert all(len(replica) == 1 for replica in where)
    assert {replica[0] for replica in where} == {0, 1}  # both served some
    assert requests.get(proxy.url + "/v1/models", headers={"X-Request-Id": "passed-through-1"}).headers[
        "X-Request-Id"] == "passed-through-1"


def test_a_conversation_s_key_keeps_it_on_the_replica_with_its_cache(cluster):
    """With X-Session-Id, both turns reach one replica and the second reuses the first's prompt; without it, a
    second turn reuses it exactly when it happens to reach the same replica."""
    proxy, replicas = cluster
    for keyed in (True, False):
        for conversation in range(6):
            tag = f"{'keyed' if keyed else 'free'}-{conversation}-{uuid.uuid4().hex[:6]}"
            messages = [{"role": "system", "content": f"[{tag}] {SYSTEM}"}, {"role": "user", "content": "Fact 3?"}]
            session = tag if keyed else None
            first = chat(proxy.url, messages, f"{tag}-1", session)
            messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And fact 4?"}]
            second = chat(proxy.url, messages, f"{tag}-2", session)
            before, after = (wait_until(lambda request_id=request_id: served_by(replicas, request_id), timeout=10,
                                        message=request_id) for request_id in (f"{tag}-1", f"{tag}-2"))
            cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            if keyed:
                assert before == after and cached > 0
            else:
                assert (cached > 0) == (before == after)


def test_a_stream_passes_through_token_by_token(cluster):
    """Every token reaches the client through nginx, and the first before the replica finishes."""
    proxy, replicas = cluster
    request_id = f"stream-{uuid.uuid4().hex[:8]}"
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True,
            "logprobs": 0}
    with requests.post(proxy.url + "/v1/completions", json=body, stream=True, timeout=120,
                       headers={"X-Request-Id": request_id}) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        lines = (line for line in response.iter_lines() if line.startswith(b"data: "))
        first = next(lines)
        # The first event is here while the replica still generates: nothing buffered it on the way.
        assert not any(f"[{request_id}]" in line and "generation finish" in line
                       for replica in replicas for line in replica.log().splitlines())
        rest = list(lines)
    assert rest[-1] == b"data: [DONE]" and streamed_tokens([first, *rest]) == 300


def streamed_tokens(lines: list[bytes]) -> int:
    """The tokens a completion stream carried, by its chunks' logprobs: counting events would undercount, since a
    kept draft brings several tokens in one chunk."""
    chunks = [json.loads(line[len(b"data: "):]) for line in lines if line != b"data: [DONE]"]
    logprobs = [chunk["choices"][0]["logprobs"] for chunk in chunks if chunk["choices"]]
    return sum(len(each["tokens"]) for each in logprobs if each)  # the final chunk has none


def test_a_killed_replica_is_left_out_and_requests_keep_succeeding(cluster):
    proxy, replicas = cluster
    os.killpg(replicas[1].process.pid, signal.SIGKILL)
    replicas[1].process.wait()
    for index in range(12):
        chat(proxy.url, [{"role": "user", "content": "Hi"}], f"after-kill-{index}-{uuid.uuid4().hex[:6]}",
             max_tokens=2)


def test_a_draining_replica_finishes_its_streams_and_new_requests_go_elsewhere(cluster):
    proxy, replicas = cluster
    request_id = f"drain-{uuid.uuid4().hex[:8]}"
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "stream": True,
            "logprobs": 0}
    with requests.post(proxy.url + "/v1/completions", json=body, stream=True, timeout=120,
                       headers={"X-Request-Id": request_id, "X-Session-Id": "drain"}) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith(b"data: {"))
        draining = streaming_replica(replicas)
        replicas[draining].process.send_signal(signal.SIGTERM)
        others = [chat(proxy.url, [{"role": "user", "content": "Hi"}], f"during-drain-{index}", max_tokens=2)
                  for index in range(4)]  # meanwhile, new requests are answered (by the other replica)
        rest = [line for line in lines if line.startswith(b"data: ")]
    assert rest[-1] == b"data: [DONE]" and streamed_tokens([first, *rest]) == 200  # the stream finished
    assert len(others) == 4
    assert replicas[draining].process.wait(timeout=60) == 0


def in_flight(replica: Server) -> float:
    """The replica's requests in flight, by its own /metrics (the scrape itself counts one)."""
    text = requests.get(replica.url + "/metrics", timeout=5).text
    return float(re.search(r"^phi_api_requests_in_flight (\S+)$", text, re.MULTILINE).group(1))


def streaming_replica(replicas: list[Server]) -> int:
    """Which replica is serving the one open stream (a request's log line is written only once it ends)."""
    counts = [in_flight(replica) for replica in replicas]
    assert sorted(counts) == [1.0, 2.0], counts
    return counts.index(2.0)
