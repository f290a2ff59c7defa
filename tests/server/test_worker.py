"""The gunicorn worker's own answers: the error object, never HTML, and no request text in the log."""

from __future__ import annotations

import json
import logging
import socket

import pytest
from gunicorn.http import errors

from phi_api.server.worker import Worker
from phi_api.web.foreign import from_foreign


@pytest.mark.parametrize("exc,status", [
    (errors.LimitRequestLine(9000, 4094), 414),
    (errors.LimitRequestHeaders("too many"), 431),
    (errors.InvalidRequestLine("GET /?api_key=secret HTTP/9"), 400),
    (errors.InvalidHeaderName("bad name"), 400),
    (errors.UnsupportedTransferCoding("gzip"), 501),
    (errors.InvalidResponseHeader("X"), 500),
    (RuntimeError("boom"), 500),
])
def test_each_refusal_has_its_status(exc, status):
    assert from_foreign(exc).status == status


@pytest.mark.parametrize("exc,status,code", [
    (errors.LimitRequestLine(9000, 4094), 414, "uri_too_long"),
    (errors.LimitRequestHeaders("too many"), 431, "headers_too_large"),
    (errors.InvalidRequestLine("GET /?api_key=secret-key HTTP/9"), 400, None),
])
def test_refusals_are_the_error_object(exc, status, code, caplog):
    server, client = socket.socketpair()
    with server, client, caplog.at_level(logging.DEBUG, logger="phi_api"):
        Worker.handle_error(None, None, server, ("127.0.0.1", 1), exc)  # self is not used
        server.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := client.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].startswith(f"HTTP/1.1 {status} ".encode())
    assert b"Content-Type: application/json" in head and b"X-Request-Id: " in head
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    assert "secret-key" not in caplog.text and "secret-key" not in body.decode()
