"""Errors outside the API's own rules: routing, methods, bodies, crashes. Always JSON, never HTML."""

from __future__ import annotations

import logging

import pytest

from tests.api.test_request_errors import ROUTES, assert_error


@pytest.mark.parametrize("path", ["/index.html", "/v1", "/v1/moderations", "/v2/models", "/v1/model/test-model"])
def test_unknown_routes_are_json_404(client, path):
    assert_error(client.get(path), 404, "invalid_request_error", "not_found", None)
    assert_error(client.post(path, json={}), 404, "invalid_request_error", "not_found", None)


@pytest.mark.parametrize("method,path", [("GET", "/v1/chat/completions"), ("PUT", "/v1/completions"),
                                         ("DELETE", "/v1/models"), ("POST", "/v1/models")])
def test_wrong_methods_are_json_405(client, method, path):
    response = client.open(path, method=method)
    assert_error(response, 405, "invalid_request_error", "method_not_allowed", None)
    assert response.headers["Allow"]


@pytest.mark.parametrize(("method", "path", "shape"), [
    ("GET", "/v1/messages", {"type": "error", "error": {"type": "invalid_request_error"}}),
    ("GET", "/api/chat", {}), ("POST", "/api/tags", {})])
def test_a_wrong_method_is_refused_in_its_route_s_own_protocol(client, method, path, shape):
    response = client.open(path, method=method)
    body = response.get_json()
    assert response.status_code == 405 and response.headers["Allow"] and "Method not allowed" in str(body)
    if shape:  # Anthropic's
        assert body["type"] == "error" and body["error"]["type"] == shape["error"]["type"]
    else:  # Ollama's: the message alone
        assert isinstance(body["error"], str)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("raw", [b"{bad json", b"", b"\xff\xfe{}", b'{"model": NaN}', b'{"a": "\\ud800"}',
                                 b"[" * 100_000, b'"a string"', b"[1, 2]", b"null",
                                 b'{"temperature": 1e309}', b'{"seed": -1e400}', b'{"n": ' + b"9" * 5000 + b"}"])
def test_bodies_that_are_not_a_json_object_are_400(client, route, raw):
    response = client.post(route, data=raw, content_type="application/json")
    assert_error(response, 400, "invalid_request_error", "invalid_json", None)


@pytest.mark.parametrize("route", list(ROUTES))
def test_nul_characters_are_refused(client, route):
    body = {**ROUTES[route], "user": "a\u0000b"}
    error = assert_error(client.post(route, json=body), 400, "invalid_request_error", None, None)
    assert "NUL" in error["message"]


@pytest.mark.parametrize(("escaped", "held"), [
    ("a\\\\u0000", "a\\u0000"),  # an escaped backslash, then the letters u0000: no NUL
    ("\\ud83d\\ude00", "\U0001f600"),  # an emoji as an escaped surrogate pair: text
    ("\\\\\\\\\\ud83d\\ude00", "\\\\\U0001f600")])
def test_escapes_that_only_look_like_a_nul_or_a_lone_surrogate_are_text(client, escaped, held):
    raw = b'{"prompt": "' + escaped.encode() + b'"}'
    answer = client.post("/tokenize", data=raw, content_type="application/json")
    assert answer.status_code == 200
    assert answer.get_json()["tokens"] == client.post("/tokenize", json={"prompt": held}).get_json()["tokens"]


@pytest.mark.parametrize("escaped", ["a\\u0000", "\\\\\\u0000", "\\ud800", "\\\\\\udc00x", "\\ud83d\\ud83d"])
def test_a_nul_or_a_lone_surrogate_after_escaped_backslashes_is_refused(client, escaped):
    raw = b'{"model": "test-model", "prompt": "' + escaped.encode() + b'"}'
    assert client.post("/v1/completions", data=raw, content_type="application/json").status_code == 400


def test_a_body_without_content_type_is_read_as_json(client):
    response = client.post("/v1/completions", data=b'{"model": "test-model", "prompt": "hi"}',
                           headers={"Content-Type": ""})
    assert response.status_code == 200


def test_other_media_types_are_415(client):
    response = client.post("/v1/completions", data="model=test-model&prompt=hi",
                           content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "invalid_request_error", "unsupported_media_type", None)


def test_bodies_over_the_limit_are_413(make_app):
    client = make_app(MAX_REQUEST_SIZE_MB=0.01).test_client()
    body = b'{"model": "test-model", "prompt": "' + b"x" * 20_000 + b'"}'
    response = client.post("/v1/completions", data=body, content_type="application/json")
    assert_error(response, 413, "invalid_request_error", "request_too_large", None)


def test_a_crash_is_a_generic_500_and_the_traceback_goes_to_the_log(make_app, caplog):
    app = make_app()

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals at /srv/app.py")

    logger = logging.getLogger("phi_api")
    logger.addHandler(caplog.handler)
    try:
        response = app.test_client().get("/boom")
    finally:
        logger.removeHandler(caplog.handler)
    error = assert_error(response, 500, "server_error", "internal_error", None)
    assert "secret" not in error["message"] and "Traceback" not in response.get_data(as_text=True)
    assert any("secret internals" in (record.exc_text or "") for record in caplog.records)
