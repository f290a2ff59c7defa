"""LOG_FORMAT=json from gunicorn's first line to its last, start-up errors included, against real gunicorn."""

from __future__ import annotations

import json

import requests

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, failed_start


def test_every_line_the_server_writes_is_one_json_object(model_path, logs_dir):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, LOG_FORMAT="json") as server:
        assert requests.get(server.url + "/v1/models", timeout=30).status_code == 200
        log = server.log()
    records = [json.loads(line) for line in log.splitlines() if line.strip()]
    loggers = {record["logger"] for record in records}
    assert any(record["message"].startswith("Listening at") for record in records if record["logger"] ==
               "gunicorn.error")
    assert "phi_api.access" in loggers and "gunicorn.access" not in loggers  # one line per request, ours


def test_a_start_up_error_is_one_json_line(logs_dir):
    code, log = failed_start(logs_dir, LOG_FORMAT="json", SERVER_PORT="eighty")
    assert code == 2
    record = json.loads(log.strip().splitlines()[-1])
    assert record["level"] == "ERROR" and "SERVER_PORT" in record["message"]
