"""API keys: every way to pass one, every way to get it wrong, and what needs none."""

from __future__ import annotations

import logging

import pytest

from phi_api.web.resources import get_models
from tests.support.server import wait_until

KEYS = "key-one,key-two"
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def keyed(make_app):
    app = make_app(API_KEYS=KEYS)
    models = get_models(app)
    models.start()
    wait_until(lambda: models.ready, timeout=10, message="the engine thread")
    return app.test_client()


@pytest.mark.parametrize("how", [
    {"headers": {"X-API-Key": "key-one"}},
    {"headers": {"Authorization": "Bearer key-two"}},
    {"headers": {"Authorization": "bearer   key-one "}},
    {"query_string": {"api_key": "key-one"}},
    {"query_string": {"api-key": "key-two"}},
])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/tags", "/api/tags", "/metrics", "/v1/status"])
def test_every_way_of_passing_a_key(keyed, how, path):
    assert keyed.get(path, **how).status_code == 200


@pytest.mark.parametrize("how", [
    {},
    {"headers": {"X-API-Key": "wrong"}},
    {"headers": {"Authorization": "Bearer wrong"}},
    {"headers": {"Authorization": "Basic a2V5LW9uZQ=="}},
    {"headers": {"Authorization": "Bearer "}},
    {"query_string": {"api_key": "key-one-and-more"}},
    {"query_string": {"apikey": "key-one"}},
    {"headers": {"X-API-Key": "wrong"}, "query_string": {"api_key": "key-one"}},  # the header wins
])
def test_every_way_of_getting_it_wrong_openai_routes(keyed, how):
    response = keyed.post("/v1/chat/completions", json=CHAT, **how)
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "invalid_api_key"
    assert response.get_json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/api/generate", "/v1/generate"])
def test_ollama_routes_answer_401_in_their_shape(keyed, path):
    response = keyed.post(path, json={"model": "test-model", "prompt": "hi"})
    assert response.status_code == 401 and list(response.get_json()) == ["error"]


def test_a_header_key_wins_over_a_wrong_query_key(keyed):
    response = keyed.get("/v1/models", headers={"X-API-Key": "key-two"}, query_string={"api_key": "nope"})
    assert response.status_code == 200


def test_preflight_and_health_need_no_key(keyed):
    preflight = keyed.options("/v1/chat/completions", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "X-API-Key, Content-Type, Authorization"})
    assert preflight.status_code == 200
    allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
    assert all(header in allowed for header in ("x-api-key", "content-type", "authorization"))
    assert set(preflight.headers["Access-Control-Allow-Methods"].split(", ")) >= {"GET", "POST", "OPTIONS"}
    assert keyed.get("/health").status_code == 200


def test_no_keys_configured_means_no_authentication(client):
    assert client.get("/v1/models").status_code == 200


def test_keys_never_reach_the_logs(keyed, caplog):
    logger = logging.getLogger("phi_api")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger="phi_api")
    try:
        keyed.get("/v1/models", query_string={"api_key": "key-one"}).close()  # closed: its line is logged
        keyed.get("/v1/models", query_string={"api_key": "not-a-key-at-all"}).close()
        keyed.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer key-two"}).close()
    finally:
        logger.removeHandler(caplog.handler)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "GET /v1/models 200" in logged  # the request was logged...
    assert "key-one" not in logged and "key-two" not in logged and "not-a-key" not in logged  # ...its key not


def test_cors_gives_credentials_only_to_origins_named(make_app):
    named = make_app(CORS_ORIGINS="https://app.example").test_client()
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed = named.options("/v1/chat/completions", headers={"Origin": "https://app.example", **preflight})
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert allowed.headers["Access-Control-Allow-Credentials"] == "true"
    other = named.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **preflight})
    assert "Access-Control-Allow-Origin" not in other.headers
    anyone = make_app().test_client().options("/v1/chat/completions",
                                               headers={"Origin": "https://evil.example", **preflight})
    assert anyone.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in anyone.headers
