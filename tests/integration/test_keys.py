"""Per-key limits hold across gunicorn workers: the openai SDK, pinned to each of two workers in turn, gets 429
once its key's requests per minute are used up, whichever worker counted them; usage is reported by key name."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import requests
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

LIMITED, ADMIN = "sk-team-a-secret", "sk-ops-secret"


def pinned(server: Server, pid: int, key: str) -> OpenAI:
    def connect() -> OpenAI:
        http = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=120)
        client = OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, http_client=http)
        client.models.list()
        return client

    return server.connected_to(pid, connect)


def test_a_key_s_requests_per_minute_hold_across_workers(model_path, logs_dir, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": LIMITED, "requests_per_minute": 3},
                                         {"name": "ops", "key": ADMIN, "admin": True}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, API_KEYS_FILE=keys) as server:
        clients = [pinned(server, pid, LIMITED) for pid in server.worker_pids()]
        outcomes = []
        for index in range(5):  # alternating workers
            try:
                raw = clients[index % 2].chat.completions.with_raw_response.create(
                    model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
                outcomes.append((200, raw.headers["x-ratelimit-remaining-requests"]))
            except openai.RateLimitError as refused:
                assert int(refused.response.headers["retry-after"]) >= 1
                outcomes.append((429, refused.response.headers["x-ratelimit-remaining-requests"]))
        assert outcomes == [(200, "2"), (200, "1"), (200, "0"), (429, "0"), (429, "0")]
        usage = requests.get(server.url + "/v1/usage/keys", headers={"Authorization": f"Bearer {ADMIN}"},
                             timeout=10).json()["data"]
        team = next(item for item in usage if item["name"] == "team-a")
        assert team["requests"] == 3 and team["completion_tokens"] > 0
        with pytest.raises(openai.PermissionDeniedError):
            clients[0].get("/usage/keys", cast_to=object)
