"""Embeddings on a shared server (real gunicorn, API keys): each key's usage is the tokens it had embedded (a
request its client left: what was encoded before), its token limit is held before the work, and a Batch API line of
/v1/embeddings answers as the live route does."""

from __future__ import annotations

import io
import json

import numpy as np
import openai
import pytest
import requests
from openai import OpenAI

from tests.integration.test_batches import finished, results
from tests.support.server import Server, wait_until

EMBEDDER = "all-minilm-l6-v2"
KEYS = {"team-a": "sk-team-a-secret", "team-b": "sk-team-b-secret", "small": "sk-small-secret",
        "ops": "sk-ops-secret"}
TEXTS = ["Shared servers keep each key's usage apart.", "Vectors for retrieval.", "A third, longer text about "
         "rate limits, budgets and the tokens each request reserves before any work is done."]


@pytest.fixture(scope="module")
def keyed(embedding_model_path, logs_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("encoder-keys")
    (root / "keys.json").write_text(json.dumps({"keys": [
        {"name": "team-a", "key": KEYS["team-a"]}, {"name": "team-b", "key": KEYS["team-b"]},
        {"name": "small", "key": KEYS["small"], "tokens_per_minute": 20},
        {"name": "ops", "key": KEYS["ops"], "admin": True}]}))
    (root / "models.json").write_text(json.dumps({"models": [{"id": EMBEDDER, "path": embedding_model_path}]}))
    with Server(logs_dir, MODELS_FILE=str(root / "models.json"), API_KEYS_FILE=str(root / "keys.json"),
                WEB_CONCURRENCY=2) as running:
        yield running


def sdk(server: Server, name: str) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=KEYS[name], max_retries=0, timeout=120)


def usage(server: Server) -> dict[str, dict]:
    data = requests.get(server.url + "/v1/usage/keys", headers={"Authorization": f"Bearer {KEYS['ops']}"},
                        timeout=10).json()["data"]
    return {item["name"]: item for item in data}


def test_each_key_is_charged_its_own_tokens(keyed):
    before = usage(keyed)
    answer = sdk(keyed, "team-a").embeddings.create(model=EMBEDDER, input=TEXTS)
    after = usage(keyed)
    team_a = {field: after["team-a"][field] - before.get("team-a", {}).get(field, 0)
              for field in ("requests", "prompt_tokens", "completion_tokens")}
    assert team_a == {"requests": 1, "prompt_tokens": answer.usage.prompt_tokens, "completion_tokens": 0}
    assert after.get("team-b", {}).get("prompt_tokens", 0) == before.get("team-b", {}).get("prompt_tokens", 0)
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=keyed.url + "/v1", api_key="sk-wrong", max_retries=0).embeddings.create(model=EMBEDDER,
                                                                                                input="x")


def test_a_key_s_token_limit_is_held_before_the_work(keyed):
    with pytest.raises(openai.RateLimitError) as refused:
        sdk(keyed, "small").embeddings.create(model=EMBEDDER, input=TEXTS * 4)
    assert refused.value.body["code"] == "request_too_large"
    assert usage(keyed).get("small", {}).get("prompt_tokens", 0) == 0  # refused before anything was encoded
    assert sdk(keyed, "small").embeddings.create(model=EMBEDDER, input="short").usage.prompt_tokens == 3


def test_a_batch_of_embeddings_answers_as_the_live_route(keyed):
    client = sdk(keyed, "team-b")
    lines = [{"custom_id": f"e{index}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBEDDER, "input": text, "encoding_format": "float"}}
             for index, text in enumerate(TEXTS)]
    uploaded = client.files.create(file=("embed.jsonl", io.BytesIO(
        b"".join(json.dumps(line).encode() + b"\n" for line in lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    done = finished(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(TEXTS)
    answered = results(client, done.output_file_id)
    live = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float").data
    for index in range(len(TEXTS)):
        body = answered[f"e{index}"]["response"]["body"]
        assert np.dot(body["data"][0]["embedding"], live[index].embedding) >= 0.99999


def test_a_request_its_client_leaves_is_charged_the_inputs_encoded_before(keyed):
    text = " ".join(["word"] * 200)
    each = sdk(keyed, "team-a").embeddings.create(model=EMBEDDER, input=text).usage.prompt_tokens
    before = usage(keyed)["team-a"]
    inputs = 2048  # ~400k tokens: far more than encoding does in the seconds before the client hangs up
    with pytest.raises(openai.APITimeoutError):
        sdk(keyed, "team-a").with_options(timeout=10).embeddings.create(model=EMBEDDER, input=[text] * inputs)
    # The request counts when its client leaves; its tokens once the encoder is done with the inputs it was at.
    after = wait_until(lambda: (now := usage(keyed)["team-a"])["prompt_tokens"] > before["prompt_tokens"] and now,
                       120, interval=0.2, message="the abandoned request's tokens in its key's usage")
    charged = after["prompt_tokens"] - before["prompt_tokens"]
    assert after["requests"] == before["requests"] + 1
    assert 0 < charged < inputs * each and charged % each == 0  # whole inputs encoded, not the request's tokens


def test_a_batch_s_answers_past_its_key_s_file_quota_are_not_kept(embedding_model_path, logs_dir, tmp_path):
    """Each answer (384 floats as JSON: ~8 KB) holds room in its key's 30 KB quota as it comes: the answers that fit
    are in the output file, the rest (and the lines not yet run) in the error file as storage_quota_exceeded."""
    (tmp_path / "keys.json").write_text(json.dumps({"keys": [{"name": "team-a", "key": KEYS["team-a"]}]}))
    (tmp_path / "models.json").write_text(json.dumps({"models": [{"id": EMBEDDER, "path": embedding_model_path}]}))
    with Server(logs_dir, MODELS_FILE=str(tmp_path / "models.json"), API_KEYS_FILE=str(tmp_path / "keys.json"),
                WEB_CONCURRENCY=1, FILES_MAX_MB_PER_KEY=30 / 1024) as server:
        client = sdk(server, "team-a")
        lines = [{"custom_id": f"e{index}", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": EMBEDDER, "input": f"{index}: {TEXTS[index % 3]}", "encoding_format": "float"}}
                 for index in range(8)]
        uploaded = client.files.create(file=("embed.jsonl", io.BytesIO(
            b"".join(json.dumps(line).encode() + b"\n" for line in lines))), purpose="batch")
        done = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                                      completion_window="24h").id)
        kept, refused = results(client, done.output_file_id), results(client, done.error_file_id)
        assert done.request_counts.completed == len(kept) >= 1 and done.request_counts.failed == len(refused) >= 1
        assert sorted(kept) + sorted(refused) == sorted(line["custom_id"] for line in lines)
        assert {item["error"]["code"] for item in refused.values()} == {"storage_quota_exceeded"}
        stored = sum(item.bytes for item in client.files.list().data)
        assert stored <= 30 * 1024
        with pytest.raises(openai.BadRequestError) as full:  # the output fills the room it held
            client.files.create(file=("more.jsonl", io.BytesIO(b"x" * (30 * 1024 - stored + 1))), purpose="batch")
        assert full.value.body["code"] == "storage_quota_exceeded"
