"""Several models in one server, against real gunicorn with two workers: declared, loaded, unloaded."""

from __future__ import annotations

import collections
import json
import re
import time

import ollama
import pytest
import requests
from openai import OpenAI

from tests.support.server import Server, failed_start, wait_until

HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def two_models(model_path, logs_dir, tmp_path_factory):
    """The default model declared twice, as "alpha" and "beta" (each with options of its own), two workers."""
    listing = tmp_path_factory.mktemp("models") / "models.json"
    listing.write_text(json.dumps({"models": [
        {"id": "alpha", "path": model_path},
        {"id": "beta", "path": model_path, "options": {"KV_CACHE_MB": 256, "MAX_BATCH_ROWS": 8}},
    ]}))
    with Server(logs_dir, MODELS_FILE=str(listing), WEB_CONCURRENCY=2, MAX_MODELS=3) as running:
        yield running


def engines_ended(server: Server) -> dict[str, int]:
    """How many engines each worker (by pid) has stopped and given the memory of back, from its log."""
    return collections.Counter(re.findall(r"INFO \[(\d+)\] \[[^]]*\] [\w.]+: engine stopped", server.log()))


def post(server: Server, path: str, body: dict, request_id: str | None = None) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120,
                         headers={"X-Request-Id": request_id} if request_id else {})


def test_declared_models_answer_through_the_openai_sdk_and_the_ollama_client(two_models):
    client = OpenAI(base_url=two_models.url + "/v1", api_key="x", max_retries=0)
    assert [model.id for model in client.models.list().data] == ["alpha", "beta"]
    for model in ("alpha", "beta"):
        answer = client.chat.completions.create(model=model, messages=HELLO, max_tokens=8, temperature=0)
        assert answer.model == model and answer.choices[0].message.content
        assert client.models.retrieve(model).id == model
    local = ollama.Client(host=two_models.url)
    assert sorted(entry.model for entry in local.list().models) == ["alpha", "beta"]
    for model in ("alpha", "beta"):
        assert local.chat(model=model, messages=HELLO, options={"num_predict": 8}).message.content
    status = requests.get(two_models.url + "/openarc/status").json()
    assert status["openai_model_names"] == ["alpha", "beta"]
    assert status["models"][1]["runtime_config"]["max_batch_rows"] == 8


def test_a_model_loaded_at_run_time_is_served_by_every_worker(two_models, tiny_phi3):
    started = time.monotonic()
    loaded = post(two_models, "/v1/models/load", {"model": "tiny", "path": str(tiny_phi3)})
    print(f"load of the tiny model answered in {time.monotonic() - started:.2f} s")
    assert loaded.status_code == 200, loaded.text
    assert len(two_models.worker_pids()) == 2
    for session in two_models.sessions().values():  # each worker answers for it and lists it
        answer = session.post(two_models.url + "/v1/chat/completions",
                              json={"model": "tiny", "messages": HELLO, "max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["model"] == "tiny"
        assert [m["id"] for m in session.get(two_models.url + "/v1/models").json()["data"]] == [
            "alpha", "beta", "tiny"]
    assert [entry.model for entry in ollama.Client(host=two_models.url).ps().models] == ["alpha", "beta", "tiny"]

    unloaded = post(two_models, "/v1/models/unload", {"model": "tiny"})
    assert unloaded.status_code == 200
    for session in two_models.sessions().values():  # each worker refuses it
        refused = session.post(two_models.url + "/v1/chat/completions", json={"model": "tiny", "messages": HELLO})
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "model_not_found")


def test_load_errors(two_models, tmp_path, model_path):
    (tmp_path / "empty").mkdir()
    for body, status, code in (({"model": "x", "path": str(tmp_path / "nowhere")}, 400, "invalid_parameter"),
                               ({"model": "x", "path": str(tmp_path / "empty")}, 400, "invalid_parameter"),
                               ({"model": "alpha", "path": model_path}, 400, "model_exists")):
        response = post(two_models, "/v1/models/load", body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.text
    openarc = post(two_models, "/openarc/load", {"model_name": "beta", "model_path": model_path})
    assert openarc.status_code == 400
    assert post(two_models, "/openarc/unload", {"model_name": "nobody"}).status_code == 404
    assert [m["id"] for m in requests.get(two_models.url + "/v1/models").json()["data"]] == ["alpha", "beta"]


def test_the_ollama_client_deletes_a_model_and_every_worker_refuses_it(two_models, model_path):
    assert post(two_models, "/openarc/load", {"model_name": "gamma", "model_path": model_path,
                                              "runtime_config": {"MAX_BATCH_ROWS": 4}}).json()["status"] == "loaded"
    local = ollama.Client(host=two_models.url)
    assert "gamma" in [entry.model for entry in local.ps().models]
    assert local.delete("gamma").status == "success"
    for session in two_models.sessions().values():  # every worker refuses it
        refused = session.post(two_models.url + "/api/chat", json={"model": "gamma", "messages": HELLO})
        assert refused.status_code == 404 and "error" in refused.json()
    with pytest.raises(ollama.ResponseError) as missing:
        local.chat(model="gamma", messages=HELLO)
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as gone:  # as Ollama does for a model it does not have
        local.delete("gamma")
    assert gone.value.status_code == 404


def test_memory_is_shared_when_loaded_and_given_back_when_unloaded(two_models, model_path):
    """PSS of the whole server (master and two workers) before a load, after it, and after the unload."""
    def run_on_both_workers(model: str) -> None:
        for session in two_models.sessions().values():
            answer = session.post(two_models.url + "/v1/completions",
                                  json={"model": model, "prompt": "Hello", "max_tokens": 8})
            assert answer.status_code == 200, answer.text

    for model in ("alpha", "beta"):
        run_on_both_workers(model)
    threads = two_models.engine_threads()
    before = two_models.pss_bytes()
    started = time.monotonic()
    assert post(two_models, "/v1/models/load", {"model": "delta", "path": model_path}).status_code == 200
    load_time = time.monotonic() - started
    run_on_both_workers("delta")
    assert two_models.engine_threads() == [count + 1 for count in threads]
    loaded = two_models.pss_bytes()
    ended = engines_ended(two_models)
    assert post(two_models, "/v1/models/unload", {"model": "delta"}).status_code == 200
    wait_until(lambda: two_models.engine_threads() == threads, timeout=20,
               message="every worker's engine thread for the unloaded model has ended")
    wait_until(lambda: all(engines_ended(two_models).get(pid, 0) > ended.get(pid, 0)
                           for pid in map(str, two_models.worker_pids())),
               timeout=20, message="every worker has given the unloaded model's memory back")
    unloaded = two_models.pss_bytes()
    print(f"load of the default model answered in {load_time:.2f} s; PSS of the server: {before / 2**20:.0f} MB, "
          f"with one more model {loaded / 2**20:.0f} MB, after its unload {unloaded / 2**20:.0f} MB")
    assert loaded > before
    assert unloaded < loaded


def test_a_declared_model_that_fails_to_load_stops_start_up_naming_it(logs_dir, model_path, tmp_path):
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps({"models": [{"id": "good", "path": model_path},
                                              {"id": "missing", "path": str(tmp_path / "nowhere")}]}))
    code, output = failed_start(logs_dir, MODELS_FILE=str(listing))
    assert code != 0
    json_lines = [line for line in output.splitlines() if line.startswith("{")]
    assert len(json_lines) == 1
    error = json.loads(json_lines[0])["error"]
    assert (error["type"], error["code"]) == ("server_error", "model_loading_failed")
    assert error["message"].startswith(f"Failed to load model 'missing' from {tmp_path / 'nowhere'}: ")
    assert "Booting worker" not in output
