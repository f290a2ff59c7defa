"""Operations endpoints with a fake engine: health, metrics, status, bench, tokenize."""

from __future__ import annotations

import json
import time

import gevent
import pytest
from prometheus_client.parser import text_string_to_metric_families

from phi_api.web.resources import get_models
from tests.support.server import wait_until

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Say hello"}]}


def samples(client) -> dict:
    text = client.get("/metrics").get_data(as_text=True)
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_health_follows_the_engine(make_app):
    app = make_app()
    client = app.test_client()
    models = get_models(app)
    assert client.get("/health").status_code == 503
    assert client.get("/health").get_json() == {"status": "starting"}
    models.start()  # each engine thread loads its decoder session, then the worker is ready
    wait_until(lambda: client.get("/health").status_code == 200, timeout=10, message="a ready engine")
    assert client.get("/health").get_json() == {"status": "ok"}
    models.drain()
    assert client.get("/health").status_code == 503 and client.get("/health").get_json()["status"] == "draining"


def test_a_worker_whose_models_are_all_unloaded_stays_healthy_until_it_drains(make_app):
    app = make_app()
    client, models = app.test_client(), get_models(app)
    models.start()
    wait_until(lambda: client.get("/health").status_code == 200, timeout=10, message="a ready engine")
    for model in models.ids():
        assert client.post("/v1/models/unload", json={"model": model}).status_code == 200
    assert models.ids() == []
    assert client.get("/health").status_code == 200  # it can still load a model
    models.drain()
    assert client.get("/health").get_json() == {"status": "draining"}


def test_a_draining_worker_refuses_new_generations(make_app):
    app = make_app()
    get_models(app).drain()
    response = app.test_client().post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503 and response.get_json()["error"]["code"] == "unavailable"


def test_a_draining_worker_s_refusals_are_not_counted_as_the_key_s_requests(make_app, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": "sk-team-a-1", "requests_per_minute": 2}]}))
    app = make_app(API_KEYS_FILE=str(keys))
    get_models(app).drain()
    key = {"Authorization": "Bearer sk-team-a-1"}
    answers = [app.test_client().post("/v1/chat/completions", json=CHAT, headers=key) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [503, 503, 503]  # a retry elsewhere, not a 429 here


def test_metrics_count_requests_tokens_and_429s(make_app):
    client = make_app(MAX_CONCURRENT_REQUESTS=1).test_client()
    client.post("/v1/chat/completions", json=CHAT).close()
    held = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, buffered=False)
    client.post("/v1/chat/completions", json=CHAT).close()  # 429
    held.close()
    # Generations are reported to the hub's thread asynchronously: let it run until they are in.
    deadline = time.monotonic() + 10
    while sum(value for (name, _), value in samples(client).items() if name == "phi_api_generations_total") < 2:
        assert time.monotonic() < deadline, "the generations never reached the metrics"
        gevent.sleep(0.01)
    seen = samples(client)
    route = (("method", "POST"), ("route", "/v1/chat/completions"))
    assert seen[("phi_api_requests_total", tuple(sorted(route + (("status", "200"),))))] == 2
    assert seen[("phi_api_requests_total", tuple(sorted(route + (("status", "429"),))))] == 1
    assert seen[("phi_api_rate_limited_total", ())] == 1
    stop = seen[("phi_api_generations_total", (("finish_reason", "stop"),))]
    cancelled = seen.get(("phi_api_generations_total", (("finish_reason", "cancelled"),)), 0)
    # The held stream may finish (the fake engine is instant) or be cancelled by its close first.
    assert (stop, cancelled) in ((2, 0), (1, 1))
    assert seen[("phi_api_generated_tokens_total", ())] >= 5
    assert seen[("phi_api_prompt_tokens_total", ())] >= len("<user>Say hello<assistant>")
    assert seen[("phi_api_time_to_first_token_seconds_count", ())] >= 1
    assert ("phi_api_decode_tokens_per_second_count", ()) in seen
    assert ("phi_api_requests_in_flight", ()) in seen


def test_status_in_openarc_s_shape(client):
    for path in ("/v1/status", "/openarc/status"):
        body = client.get(path).get_json()
        assert body["total_loaded_models"] == 1 and body["openai_model_names"] == ["test-model"]
        model = body["models"][0]
        assert (model["model_name"], model["model_type"], model["engine"], model["device"], model["status"]) == (
            "test-model", "llm", "onnxruntime", "CPU", "loaded")
        assert "runtime_config" in model and model["time_loaded"].endswith("Z")
        assert "/" not in str(model["runtime_config"])  # no file paths


def test_bench_generates_max_tokens_and_reports_metrics(make_app):
    from tests.support.fakes import fake_engine, text_pieces

    engine = fake_engine([1, 0], text_pieces(b"x"))
    client = make_app(engine).test_client()
    for path in ("/v1/bench", "/openarc/bench"):
        metrics = client.post(path, json={"model": "test-model", "input_ids": [5, 6, 7], "max_tokens": 6}).get_json()[
            "metrics"]
        assert (metrics["input_token"], metrics["new_token"], metrics["total_token"]) == (3, 6, 9)
        assert set(metrics) == {"ttft", "prefill_throughput", "decode_throughput", "decode_duration", "tpot",
                                "input_token", "new_token", "total_token"}


def test_tokenize_text_and_messages_and_back(client):
    text = client.post("/tokenize", json={"prompt": "hello"}).get_json()
    assert text["count"] == 5 == len(text["tokens"]) and text["max_model_len"] == 512
    assert client.post("/tokenize", json={"content": "hello"}).get_json()["tokens"] == text["tokens"]
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).get_json()
    assert chat["count"] == len("<user>hi<assistant>")
    bare = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                          "add_generation_prompt": False}).get_json()
    assert bare["count"] == len("<user>hi")
    back = client.post("/detokenize", json={"tokens": [1, 2, 3]}).get_json()
    assert back == {"prompt": "Hello, world", "content": "Hello, world"}


def test_a_method_no_route_knows_is_counted_as_other_and_adds_no_series(make_app):
    client = make_app().test_client()
    for method in ("FOO1", "BAR2", "BAZ3"):  # gunicorn passes any token as a method
        client.open("/v1/models", method=method).close()
    methods = {dict(labels)["method"] for (name, labels), _ in samples(client).items()
               if name == "phi_api_requests_total"}
    assert "other" in methods and not methods & {"FOO1", "BAR2", "BAZ3"}


@pytest.mark.parametrize(("route", "body"), [
    ("/tokenize", {"prompt": "hello"}), ("/detokenize", {"tokens": [1, 2, 3]}),
    ("/v1/messages/count_tokens", {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]})])
def test_tokenizing_counts_against_the_key_s_requests(make_app, tmp_path, route, body):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": "sk-team-a-1", "requests_per_minute": 2}]}))
    client = make_app(API_KEYS_FILE=str(keys)).test_client()
    answers = [client.post(route, json=body, headers={"Authorization": "Bearer sk-team-a-1"}) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert answers[0].get_json() == answers[1].get_json()  # (the answer itself, twice)


def test_tokenize_errors(client):
    assert client.post("/tokenize", json={}).status_code == 400
    assert client.post("/detokenize", json={"tokens": [10_000]}).get_json()["error"]["param"] == "tokens"
    longest = client.post("/tokenize", json={"prompt": "x"}).get_json()["max_model_len"]
    assert client.post("/detokenize", json={"tokens": [1] * longest}).status_code == 200
    past = client.post("/detokenize", json={"tokens": [1] * (longest + 1)})  # past the context: a 400, not undone
    assert past.status_code == 400 and past.get_json()["error"]["param"] == "tokens"


def test_the_gateway_metrics_show_what_the_engines_hold(make_app):
    """vLLM's names, as the Gateway API Inference Extension's endpoint picker reads them: a generation held at its
    first decode step is one running request holding part of the key/value budget; when it ends, nothing is."""
    import threading

    from phi_api.web.resources import get_metrics
    from tests.support.fakes import fake_engine, text_pieces

    gate = threading.Semaphore(0)
    engine = fake_engine([1, 2, 3], text_pieces(b"a", b"b", b"c"), gate=gate, kv_budget_bytes=1 << 20)
    app = make_app(engine=engine)
    client, metrics = app.test_client(), get_metrics(app)
    held = client.post("/v1/completions", json={"model": "test-model", "prompt": "Hi", "max_tokens": 50,
                                                "stream": True}, buffered=False)
    gate.release()  # the prompt; then the engine waits at its first decode step

    def gateway() -> dict:
        metrics.observe_engines({"test-model": engine})  # what each worker does every quarter second
        found = samples(client)
        return {name: found.get((name, (("model_name", "test-model"),))) for name in (
            "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")}

    running = wait_until(lambda: (now := gateway())["vllm:num_requests_running"] == 1 and now, timeout=10,
                         message="the running generation in the metrics")
    assert running["vllm:num_requests_waiting"] == 0
    assert 0 < running["vllm:kv_cache_usage_perc"] < 1
    for _ in range(100):
        gate.release()
    held.close()
    wait_until(lambda: gateway() == {"vllm:num_requests_waiting": 0, "vllm:num_requests_running": 0,
                                     "vllm:kv_cache_usage_perc": 0}, timeout=10, message="an idle engine")


def test_metrics_count_drafts_checked_and_kept(make_app):
    from tests.support.fakes import VOCAB, fake_engine

    copied = "the cat sat on the mat and the dog sat on the log"
    pieces = {1 + ord(ch) % (VOCAB - 1): ch.encode() for ch in copied}  # the fake's own encoding: a token a letter
    tokens = [1 + ord(ch) % (VOCAB - 1) for ch in copied]  # so its answer is in the prompt
    engine = fake_engine([*tokens, 0], pieces, draft_max=8)
    client = make_app(engine).test_client()
    body = {"model": "test-model", "messages": [{"role": "user", "content": "Copy: " + copied}], "max_tokens": 64}
    answer = client.post("/v1/chat/completions", json=body).get_json()
    assert answer["choices"][0]["message"]["content"] == copied
    deadline = time.monotonic() + 10  # generations reach the metrics on the hub's thread: let it run
    model = (("model_name", "test-model"),)  # counted by model, as vLLM labels its metrics
    while samples(client).get(("phi_api_draft_checks_total", model), 0) == 0:
        assert time.monotonic() < deadline, "the draft counters never moved"
        gevent.sleep(0.01)
    seen = samples(client)
    drafted, kept = seen[("phi_api_draft_tokens_total", model)], seen[("phi_api_draft_accepted_tokens_total", model)]
    assert 0 < kept <= drafted
    assert kept > len(tokens) / 2  # most of the copy came from drafts
    by_source = {key: value for key, value in seen.items() if key[0] == "phi_api_draft_source_tokens_total"}
    assert by_source == {
        ("phi_api_draft_source_tokens_total", (*model, ("outcome", "checked"), ("source", "prompt"))): drafted,
        ("phi_api_draft_source_tokens_total", (*model, ("outcome", "kept"), ("source", "prompt"))): kept}
