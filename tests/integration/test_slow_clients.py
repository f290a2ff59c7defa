"""Slow, stalled and oversized clients against the real server: the limits and timeouts that protect it."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
import requests

from phi_api.bench.load import free_slots
from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

READ_TIMEOUT = 2  # REQUEST_READ_TIMEOUT of the strict server
KEEPALIVE = 5  # gunicorn.conf.py: how long a request's headers may take
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def strict_server(model_path, logs_dir):
    """Two workers, two slots, a 2-second body deadline and a 3-second generation timeout."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, MAX_CONCURRENT_REQUESTS=2,
                REQUEST_READ_TIMEOUT=READ_TIMEOUT, GENERATION_TIMEOUT=3) as running:
        yield running


def connect(server: Server, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)  # before connecting: the window
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def json_error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    if b"transfer-encoding: chunked" in head.lower():
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    return status, json.loads(body)["error"]


def test_an_overlong_request_line_is_414_json(server):
    response = requests.get(server.url + "/v1/models?padding=" + "x" * 10_000)
    assert response.status_code == 414
    assert response.json()["error"]["code"] == "uri_too_long"


@pytest.mark.parametrize("headers", [{f"X-Filler-{i}": "x" for i in range(150)}, {"X-Huge": "x" * 10_000}],
                         ids=["150 headers", "a 10 KB header"])
def test_too_many_or_too_large_headers_are_431_json(server, headers):
    response = requests.get(server.url + "/v1/models", headers=headers)
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "headers_too_large"


def test_broken_http_is_400_json(server):
    with connect(server) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n")
        status, error = json_error(read_all(sock))
    assert status == 400 and error["type"] == "invalid_request_error"


def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closes(strict_server):
    body = json.dumps(CHAT).encode()
    with connect(strict_server) as sock:
        sock.sendall(post_head("/v1/chat/completions", len(body)) + body[:10])  # and then nothing
        started = time.monotonic()
        status, error = json_error(read_all(sock))  # read_all returns once the server closes
        waited = time.monotonic() - started
    assert status == 408 and error["code"] == "request_timeout"
    assert waited < READ_TIMEOUT + KEEPALIVE


def test_headers_that_never_finish_are_dropped(strict_server):
    with connect(strict_server) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and then nothing
        started = time.monotonic()
        assert read_all(sock) == b""  # closed without an answer
        assert time.monotonic() - started < KEEPALIVE + 5


def test_slow_clients_cannot_hold_the_slots(strict_server):
    body = json.dumps(CHAT).encode()
    stalled = []
    try:
        for _ in range(20):
            slow_headers = connect(strict_server)
            slow_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow_body = connect(strict_server)
            slow_body.sendall(post_head("/v1/chat/completions", len(body)) + body[:5])
            stalled += [slow_headers, slow_body]
        # Forty stalled clients hold no slot: both of the server's two slots still serve.
        assert free_slots(strict_server.url, MODEL_ID, 2, timeout=10)
    finally:
        for sock in stalled:
            sock.close()


def test_a_client_that_stops_reading_frees_its_slot(limited_server):
    request = json.dumps({"model": MODEL_ID, "prompt": "Count:", "max_tokens": 4000, "ignore_eos": True,
                          "stream": True}).encode()
    with connect(limited_server, receive_buffer=4096) as sock:
        sock.sendall(post_head("/v1/completions", len(request), "X-Request-Id: stalled-reader\r\n") + request)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        # The client reads no more, but keeps the connection open.
        pattern = r"\[stalled-reader\] phi_api.engine: generation finish_reason=cancelled .* completion_tokens=(\d+)"
        generated = int(wait_until(lambda: re.findall(pattern, limited_server.log()), timeout=30,
                                   message="the stalled stream's generation to be cancelled")[0])
        assert generated < 4000
        assert free_slots(limited_server.url, MODEL_ID, 2, timeout=10)  # its slot is free again
    print(f"the stalled reader's generation stopped after {generated} tokens")


def test_a_generation_past_the_timeout_is_504(strict_server):
    body = {"model": MODEL_ID, "prompt": "Count:", "max_tokens": 4000, "ignore_eos": True}
    response = requests.post(strict_server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 504
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "timeout")


def test_a_stream_past_the_timeout_ends_with_an_error_event_and_done(strict_server):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    response = requests.post(strict_server.url + "/v1/chat/completions", json=body, timeout=60)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["type"], error["code"]) == ("server_error", "timeout")
    assert len(events) > 3  # tokens were streamed before the timeout
    assert free_slots(strict_server.url, MODEL_ID, 2, timeout=10)


def test_an_abandoned_answer_is_cancelled_and_frees_its_slot_within_a_second(logs_dir, model_path):
    """A non-streaming client that times out and leaves: the generation stops, the slot comes back, and an
    orphan never delays the server's shutdown."""
    import openai

    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1,
                MAX_CONCURRENT_REQUESTS=1) as server:
        impatient = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=1)
        body = dict(model=MODEL_ID, prompt="I believe the meaning of life is", max_tokens=1000,
                    extra_body={"ignore_eos": True})
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(**body)
        left = time.monotonic()
        small = {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 1}
        # 1000 tokens take several seconds here: a slot back within a second means the generation stopped.
        wait_until(lambda: requests.post(server.url + "/v1/completions", json=small, timeout=10).status_code == 200,
                   timeout=1.0, message="the abandoned request's slot")
        assert time.monotonic() - left < 1.5
        wait_until(lambda: "finish_reason=cancelled" in server.log(), timeout=5, message="the cancellation log")
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(**{**body, "max_tokens": 1500})
        stopping = time.monotonic()
        assert server.stop(timeout=30) == 0
        assert time.monotonic() - stopping < 5
