"""The API contract: the OpenAPI document covers every route, and schemathesis fuzzes the live server.

Bounded: a few dozen examples per operation, with generation lengths capped so a
valid request costs a fraction of a second. No 5xx, and every 4xx carries the
error object the document promises.
"""

from __future__ import annotations

import hypothesis
import pytest
import requests
import schemathesis
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

CAPS = {"max_tokens": 8, "max_completion_tokens": 8, "num_predict": 8, "n": 2, "top_logprobs": 3, "logprobs": 3}


@pytest.fixture(scope="module")
def fuzz_server(model_path, logs_dir):
    """The server with short default answers: most fuzzed bodies give no max_tokens (or num_predict)."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, MAX_CONCURRENT_REQUESTS=16,
                DEFAULT_MAX_TOKENS=8) as running:
        yield running


def test_every_route_is_described(server, make_app):
    endpoints = {rule.endpoint for rule in make_app().url_map.iter_rules() if rule.endpoint != "static"}
    spec = requests.get(server.url + "/openapi.json").json()
    assert spec["openapi"] == "3.1.0"
    assert {op["operationId"].rsplit(".", 1)[0] for path in spec["paths"].values() for op in path.values()} == (
        endpoints)
    assert spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "$ref"] == "#/components/schemas/chat_completion"


# Fuzzed like the rest, but never aimed at the served model: the fuzzing would unload it.
UNLOADS = {"/v1/models/unload", "/openarc/unload", "/api/delete"}


def _bounded(case) -> None:
    """Point valid-looking bodies at the served model (unless they would unload it) and keep generations
    short."""
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path not in UNLOADS and isinstance(body.get("model"), str) and hash(body["model"]) % 2 == 0:
        body["model"] = MODEL_ID
    if body.get("model") == MODEL_ID:
        body.pop("keep_alive", None)  # 0 unloads the model after the answer (as `ollama stop` does)
    for key, cap in CAPS.items():
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > cap:
            body[key] = cap
    options = body.get("options")
    if isinstance(options, dict) and isinstance(options.get("num_predict"), int) and options["num_predict"] > 8:
        options["num_predict"] = 8
    if body.get("ignore_eos") is True or isinstance(body.get("min_tokens"), int):
        body.pop("ignore_eos", None)
        body.pop("min_tokens", None)


def test_fuzzed_requests(fuzz_server):
    spec = requests.get(fuzz_server.url + "/openapi.json").json()
    api = schemathesis.openapi.from_dict(spec)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
              negative_data_rejection]
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) == sum(len(methods) for methods in spec["paths"].values())
    for operation in operations:

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(max_examples=60, deadline=None, derandomize=True, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck))
        def fuzz(case):
            _bounded(case)
            case.call_and_validate(base_url=fuzz_server.url, timeout=120, checks=checks)

        fuzz()
    assert requests.get(fuzz_server.url + "/v1/models").json()["data"][0]["id"] == MODEL_ID  # still served
