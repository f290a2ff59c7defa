"""OpenAI's Batch API with the ``openai`` SDK against real gunicorn (two workers) and the real model: the results
match the same requests sent live; a batch survives a restart; live requests never get 429 because of it."""

from __future__ import annotations

import io
import json

from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Say hello in Spanish.",
             "What do bees make?", "Which planet is called the red planet?"]


def requests_file(count: int, max_tokens: int = 12) -> bytes:
    lines = [{"custom_id": f"q{index}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL_ID, "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]}}
             for index in range(count)]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def start_batch(client: OpenAI, data: bytes):
    uploaded = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h", metadata={"test": "yes"})


def finished(client: OpenAI, batch_id: str, timeout: float = 120):
    def ended():
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None

    return wait_until(ended, timeout, interval=0.2, message=f"batch {batch_id} to end")


def results(client: OpenAI, file_id: str) -> dict[str, dict]:
    text = client.files.content(file_id).text
    return {item["custom_id"]: item for item in map(json.loads, text.splitlines())}


def test_a_batch_with_the_sdk_matches_the_same_requests_sent_live(model_path, logs_dir, tmp_path):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, BATCH_DIR=tmp_path) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        data = requests_file(len(QUESTIONS))
        batch = start_batch(client, data)
        assert batch.status == "validating" and batch.request_counts.total == len(QUESTIONS)
        done = finished(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == len(QUESTIONS)
        assert done.error_file_id is None and done.metadata == {"test": "yes"}
        answers = results(client, done.output_file_id)
        for line in map(json.loads, data.splitlines()):
            live = client.chat.completions.create(**line["body"])
            response = answers[line["custom_id"]]["response"]
            assert response["status_code"] == 200 and response["request_id"]
            assert response["body"]["choices"][0]["message"]["content"] == live.choices[0].message.content
        assert [item.id for item in client.batches.list(limit=5).data] == [batch.id]


def test_a_batch_survives_a_restart(model_path, logs_dir, tmp_path):
    settings = dict(MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, BATCH_DIR=tmp_path)
    with Server(logs_dir, **settings) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        batch = start_batch(client, requests_file(24))
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1, 60, interval=0.1)
    with Server(logs_dir, **settings) as server:  # stopped mid-batch: the rest runs after the restart
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        before = client.batches.retrieve(batch.id)
        assert before.status == "in_progress" and before.request_counts.completed < 24
        done = finished(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 24
        assert sorted(results(client, done.output_file_id)) == sorted(f"q{index}" for index in range(24))


def test_live_requests_are_not_refused_because_of_a_batch(model_path, logs_dir, tmp_path):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, BATCH_DIR=tmp_path,
                MAX_CONCURRENT_REQUESTS=1, BATCH_CONCURRENCY=2) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        batch = start_batch(client, requests_file(40, max_tokens=24))
        wait_until(lambda: client.batches.retrieve(batch.id).status == "in_progress", 30, interval=0.1)
        during = 0
        for question in QUESTIONS:  # one at a time: only batch work could take the one slot
            running = client.batches.retrieve(batch.id).status == "in_progress"
            answer = client.chat.completions.create(model=MODEL_ID, max_tokens=8, temperature=0,
                                                    messages=[{"role": "user", "content": question}])
            assert answer.choices[0].finish_reason in ("stop", "length")
            during += running
        assert during >= 1  # (40 lines take far longer than one short answer)
        assert finished(client, batch.id, timeout=300).request_counts.completed == 40


def test_lines_whose_answers_would_not_fit_the_key_s_quota_are_not_run(model_path, logs_dir, tmp_path):
    """Each line's answer held against its key's file quota: once the room left is less than an answer so far, the
    key's lines stop running, so that no line is generated, and charged, only for its answer to be thrown away."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": "sk-team-a-1"},
                                         {"name": "ops", "key": "sk-ops-admin", "admin": True}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, BATCH_CONCURRENCY=1,
                FILES_MAX_MB_PER_KEY=0.01, API_KEYS_FILE=str(keys), DATA_DIR=str(tmp_path / "data")) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="sk-team-a-1", max_retries=0, timeout=120)
        batch = finished(client, start_batch(client, requests_file(12, max_tokens=40)).id)
        assert batch.status == "completed" and batch.request_counts.failed > 0  # 10 KB: not room for 12 answers
        kept = results(client, batch.output_file_id)
        refused = results(client, batch.error_file_id)
        assert {item["error"]["code"] for item in refused.values()} == {"storage_quota_exceeded"}
        generated = sum(item["response"]["body"]["usage"]["completion_tokens"] for item in kept.values())
        admin = OpenAI(base_url=server.url + "/v1", api_key="sk-ops-admin", max_retries=0)
        usage = next(row for row in admin.get("/usage/keys", cast_to=object)["data"] if row["name"] == "team-a")
        assert usage["completion_tokens"] == generated  # every line run was kept
