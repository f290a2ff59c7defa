"""Clients of the peer systems against the real server: ollama, openai with keys, Prometheus, OpenArc."""

from __future__ import annotations

import http.client
import json

import ollama
import openai
import pytest
import requests
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def keyed_server(model_path, logs_dir):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, API_KEYS=f"other,{KEY}") as s:
        yield s


def test_the_ollama_client_unchanged(server):
    client = ollama.Client(host=server.url)
    assert [model.model for model in client.list().models] == [MODEL_ID]
    answer = client.generate(model=MODEL_ID, prompt="Say hello.", options={"num_predict": 8, "temperature": 0})
    assert answer.done and answer.response and answer.eval_count == 8 and answer.done_reason == "length"
    parts = list(client.generate(model=MODEL_ID, prompt="Say hello.", options={"num_predict": 8, "temperature": 0},
                                 stream=True))
    assert "".join(part.response for part in parts) == answer.response and parts[-1].done
    chat = client.chat(model=MODEL_ID, messages=[{"role": "user", "content": "Hi!"}],
                       options={"num_predict": 6, "temperature": 0})
    streamed = list(client.chat(model=MODEL_ID, messages=[{"role": "user", "content": "Hi!"}],
                                options={"num_predict": 6, "temperature": 0}, stream=True))
    assert "".join(part.message.content for part in streamed) == chat.message.content
    assert streamed[-1].done and streamed[-1].prompt_eval_count == chat.prompt_eval_count
    shown = client.show(MODEL_ID)
    assert shown.details.format == "onnx" and shown.template
    with pytest.raises(ollama.ResponseError) as missing:
        client.generate(model="llama3", prompt="hi")
    assert missing.value.status_code == 404


def test_the_ollama_client_preloads_a_model_without_generating(server):
    """A generate without a prompt, a chat without messages: the model only loaded, as ``ollama run`` asks."""
    client = ollama.Client(host=server.url)
    loaded = client.generate(model=MODEL_ID)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == "" and not loaded.eval_count
    chatted = client.chat(model=MODEL_ID, messages=[])
    assert chatted.done and chatted.done_reason == "load" and chatted.message.content == ""
    assert [part.done_reason for part in client.generate(model=MODEL_ID, stream=True)] == ["load"]
    with pytest.raises(ollama.ResponseError) as missing:
        client.generate(model="llama3")
    assert missing.value.status_code == 404


def test_the_ollama_client_gets_log_probabilities(server):
    client = ollama.Client(host=server.url)
    asked = {"model": MODEL_ID, "prompt": "Say hello.", "logprobs": True, "top_logprobs": 3,
             "options": {"num_predict": 8, "temperature": 0}}
    answer = client.generate(**asked)
    assert answer.logprobs and "".join(entry.token for entry in answer.logprobs) == answer.response
    for entry in answer.logprobs:  # greedy: each token is the likeliest of its alternatives
        assert len(entry.top_logprobs) == 3 and entry.logprob == max(top.logprob for top in entry.top_logprobs)
    parts = list(client.generate(**asked, stream=True))
    assert [entry.token for part in parts for entry in part.logprobs or ()] == [e.token for e in answer.logprobs]


def test_open_webui_s_options_through_the_ollama_client_streamed_and_not(server):
    """What Open WebUI forwards when a user sets the chat's "Context Length" (and other options it may send)."""
    client = ollama.Client(host=server.url)
    options = {"temperature": 0, "num_predict": 24, "num_ctx": 2048, "repeat_last_n": 64, "num_thread": 2,
               "mirostat": 0, "num_keep": 5, "num_gpu": 0, "typical_p": 1.0}
    messages = [{"role": "user", "content": "Name a fruit."}]
    whole = client.chat(model=MODEL_ID, messages=messages, options=options)
    streamed = list(client.chat(model=MODEL_ID, messages=messages, options=options, stream=True))
    assert whole.message.content and whole.eval_count <= 24
    assert "".join(part.message.content for part in streamed) == whole.message.content and streamed[-1].done
    with pytest.raises(ollama.ResponseError) as wrong:
        client.chat(model=MODEL_ID, messages=messages, options={"num_ctx": "big"})
    assert wrong.value.status_code == 400 and "num_ctx" in wrong.value.error


def test_ndjson_framing_byte_by_byte(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v1/generate", body=json.dumps({"model": MODEL_ID, "prompt": "Count to three.",
                                                                "options": {"num_predict": 12, "temperature": 0}}))
    response = connection.getresponse()
    raw = response.read()
    assert response.status == 200 and response.getheader("Content-Type") == "application/x-ndjson"
    assert raw.endswith(b"}\n") and b"\n\n" not in raw and b"\r" not in raw
    lines = raw.split(b"\n")[:-1]
    objects = [json.loads(line) for line in lines]  # every line is one JSON object, nothing more
    assert all(line.startswith(b"{") and line.endswith(b"}") for line in lines)
    assert [obj["done"] for obj in objects] == [False] * (len(objects) - 1) + [True]
    last = objects[-1]
    assert last["done_reason"] in ("stop", "length")
    assert last["eval_count"] == 12 if last["done_reason"] == "length" else last["eval_count"] < 12


def test_openai_client_with_keys(keyed_server):
    good = OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    assert [model.id for model in good.models.list().data] == [MODEL_ID]
    chunks = list(good.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=4, stream=True))
    assert chunks[-1].choices[0].finish_reason
    for wrong in ("sk-wrong", ""):
        client = OpenAI(base_url=keyed_server.url + "/v1", api_key=wrong or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as denied:
            client.models.list()
        assert denied.value.code == "invalid_api_key"


@pytest.mark.parametrize("how,status", [
    ({"headers": {"X-API-Key": KEY}}, 200),
    ({"headers": {"Authorization": f"Bearer {KEY}"}}, 200),
    ({"params": {"api_key": KEY}}, 200),
    ({"params": {"api-key": KEY}}, 200),
    ({}, 401),
    ({"headers": {"X-API-Key": "nope"}}, 401),
    ({"params": {"api_key": "nope"}}, 401),
    ({"headers": {"X-API-Key": "nope"}, "params": {"api_key": KEY}}, 401),
])
def test_every_way_to_pass_a_key_on_the_ollama_routes(keyed_server, how, status):
    response = requests.get(keyed_server.url + "/v1/tags", **how)
    assert response.status_code == status
    if status == 401:
        assert list(response.json()) == ["error"]


def test_the_ollama_client_with_a_key(keyed_server):
    assert ollama.Client(host=keyed_server.url, headers={"X-API-Key": KEY}).list().models[0].model == MODEL_ID
    with pytest.raises(ollama.ResponseError) as denied:
        ollama.Client(host=keyed_server.url, headers={"X-API-Key": "nope"}).list()
    assert denied.value.status_code == 401


def test_health_needs_no_key_and_keys_stay_out_of_the_log(keyed_server):
    assert requests.get(keyed_server.url + "/health").json() == {"status": "ok"}
    requests.get(keyed_server.url + "/v1/models", params={"api_key": KEY})
    assert KEY not in keyed_server.log()


def count(server, route: str) -> float:
    text = requests.get(server.url + "/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "phi_api_requests_total" and sample.labels.get("route") == route
               and sample.labels.get("status") == "200")


def test_prometheus_counts_across_workers(server):
    before = count(server, "/v1/status")
    for _ in range(6):  # the two workers share the traffic
        assert requests.get(server.url + "/v1/status").status_code == 200
    assert count(server, "/v1/status") == before + 6
    families = {family.name for family in text_string_to_metric_families(requests.get(server.url + "/metrics").text)}
    assert {"phi_api_requests", "phi_api_requests_in_flight", "phi_api_rate_limited",
            "phi_api_time_to_first_token_seconds", "phi_api_prompt_tokens", "phi_api_generated_tokens",
            "phi_api_prefill_tokens_per_second", "phi_api_decode_tokens_per_second"} <= families


def test_openarc_endpoints_and_tokenizer(server, reference_token):
    status = requests.get(server.url + "/v1/status").json()
    assert status["models"][0]["model_name"] == MODEL_ID and status["models"][0]["status"] == "loaded"
    tokens = requests.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) == 2
    detokenized = requests.post(server.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert detokenized["prompt"] == "Hello world"
    metrics = requests.post(server.url + "/v1/bench", json={"model": MODEL_ID, "input_ids": tokens["tokens"],
                                                            "max_tokens": 16}).json()["metrics"]
    assert metrics["input_token"] == 2 and metrics["new_token"] == 16 and metrics["decode_throughput"] > 0
    answer = requests.post(server.url + "/v1/completions", json={"model": MODEL_ID, "prompt": "Hi",
                                                                 "max_tokens": 5}).json()
    assert answer["metrics"]["new_token"] == answer["usage"]["completion_tokens"]
