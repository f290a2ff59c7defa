"""The API contract: the OpenAPI document covers every route, and schemathesis fuzzes the live server.

Twice: in this process with its checks of the documented responses (valid data), and with its own command
line as a user runs it (valid and invalid data, its coverage phase of boundary values, then fuzzing). Bounded:
generation lengths are capped (tests/support/fuzz_hooks.py) so a valid request costs a fraction of a second. No
5xx, and every 4xx carries the error object the document promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
from tests.support.fuzz_hooks import bound
from tests.support.server import Server

REPO = Path(__file__).resolve().parents[2]


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


def test_fuzzed_requests(fuzz_server):
    spec = requests.get(fuzz_server.url + "/openapi.json").json()
    api = schemathesis.openapi.from_dict(spec)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
              negative_data_rejection]
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) == sum(len(methods) for methods in spec["paths"].values())
    for operation in operations:

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(max_examples=30, deadline=None, derandomize=True, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck))
        def fuzz(case):
            bound(case.path, case.body)
            case.call_and_validate(base_url=fuzz_server.url, timeout=120, checks=checks)

        fuzz()
    assert requests.get(fuzz_server.url + "/v1/models").json()["data"][0]["id"] == MODEL_ID  # still served


def test_fuzzed_as_the_command_line_fuzzes(fuzz_server):
    """The run that found three 500s the in-process fuzzing missed (``tools: [null, null]`` on /api/chat, a model
    path longer than the file system allows): ``st run --mode all`` with the coverage phase."""
    environment = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.fuzz_hooks", "PHI_API_FUZZ_MODEL": MODEL_ID}
    command = [str(Path(sys.executable).with_name("st")), "run", fuzz_server.url + "/openapi.json",
               "--checks", "not_a_server_error", "--mode", "all", "--phases", "examples,coverage,fuzzing",
               "--max-examples", "12", "--generation-deterministic", "--no-color"]
    # One worker (the default): hypothesis describes strategies with ast.parse, and CPython 3.11's AST constructor
    # is not thread-safe (gh-106905: "SystemError: AST constructor recursion depth mismatch" with two workers).
    ran = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=1200)
    assert ran.returncode == 0, ran.stdout[-8000:] + ran.stderr[-2000:]
    counted = re.search(r"(\d+) generated, (\d+) passed", ran.stdout)
    assert counted and int(counted[1]) == int(counted[2]) > 1000, ran.stdout[-3000:]
    assert requests.get(fuzz_server.url + "/v1/models").json()["data"][0]["id"] == MODEL_ID  # still served
