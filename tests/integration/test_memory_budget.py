"""One memory budget for the whole server (MEMORY_LIMIT_MB), filled for real: the default model served as three
models by two workers, fed distinct conversations until their kept prefixes would overflow it."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support.server import Server, failed_start, wait_until

MODELS = ("a", "b", "c")
KV_SHARE_MB = 160  # each worker's keys and values: ~3,600 tokens of the default model (45 KB a token)
MARGIN = 1.10  # PSS may pass the budget by this much: the processes' own memory is measured once, at start


def metric(server: Server, name: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, flags=re.M))


def listing(tmp_path, model_path) -> str:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [{"id": model, "path": model_path} for model in MODELS]}))
    return str(path)


def measured(server: Server) -> None:
    """Wait until every worker has measured its own memory (once its engines are ready; published each 0.25 s).
    Each worker's share is the limit less the weights, the master and the workers' own memory (every worker counted
    as large as itself), split between the workers: the shares add up to what the limit leaves only once every
    worker has published its own figure (one worker's alone is half of what the two make)."""
    def every_worker() -> bool:
        own = metric(server, "phi_api_memory_worker_private_bytes")
        left = (metric(server, "phi_api_memory_limit_bytes") - metric(server, "phi_api_memory_weights_bytes")
                - metric(server, "phi_api_memory_master_private_bytes") - own)
        return own > 0 and abs(left - metric(server, "phi_api_kv_cache_share_bytes")) <= 16  # integer division

    wait_until(every_worker, timeout=60, message="every worker's own memory, measured")


def fixed_mb(logs_dir, models: str, workers: int) -> float:
    """What a server takes besides keys and values (weights, master, workers), measured by a first start."""
    with Server(logs_dir, MODELS_FILE=models, WEB_CONCURRENCY=workers, MEMORY_LIMIT_MB=4096) as probe:
        measured(probe)
        share = metric(probe, "phi_api_kv_cache_share_bytes")
        assert 0 < share < 4096 * 2**20
        return 4096 - share / 2**20


def conversation(index: int) -> list[dict[str, str]]:
    """A distinct conversation of some 300 tokens: no two share a prefix worth reusing."""
    facts = " ".join(f"Item {index}-{n} weighs {(index * 37 + n * 11) % 97} grams." for n in range(30))
    return [{"role": "system", "content": f"You are assistant number {index}."},
            {"role": "user", "content": f"{facts} Which item is the heaviest?"}]


def test_three_models_on_two_workers_stay_inside_the_memory_limit(model_path, logs_dir, tmp_path):
    models = listing(tmp_path, model_path)
    limit_mb = fixed_mb(logs_dir, models, 2) + 2 * KV_SHARE_MB
    with Server(logs_dir, MODELS_FILE=models, WEB_CONCURRENCY=2, MEMORY_LIMIT_MB=f"{limit_mb:.0f}",
                MAX_CONCURRENT_REQUESTS=8) as server:
        measured(server)
        workers = set(server.worker_pids())
        peak, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], server.pss_bytes())
                stop.wait(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()

        def ask(index: int) -> int:
            body = {"model": MODELS[index % 3], "messages": conversation(index), "max_tokens": 24, "temperature": 0}
            return requests.post(server.url + "/v1/chat/completions", json=body, timeout=300).status_code

        try:
            with ThreadPoolExecutor(6) as pool:
                statuses = list(pool.map(ask, range(36)))  # 36 x ~400 tokens: twice both shares
        finally:
            stop.set()
            sampler.join()
        assert set(server.worker_pids()) == workers  # no worker died
        assert all(status == 200 or 400 <= status < 500 for status in statuses), statuses
        assert statuses.count(200) >= 30
        assert metric(server, "phi_api_kv_cache_evictions_total") > 0  # the kept prefixes did fill the shares
        assert metric(server, "phi_api_kv_cache_kept_bytes") <= metric(server, "phi_api_kv_cache_share_bytes")
        assert metric(server, "phi_api_memory_limit_bytes") == pytest.approx(limit_mb * 2**20, rel=0.01)
        assert peak[0] <= limit_mb * 2**20 * MARGIN, (peak[0] / 2**20, limit_mb)


def test_declared_models_that_do_not_fit_stop_start_up_saying_so(model_path, logs_dir, tmp_path):
    status, log = failed_start(logs_dir, MODELS_FILE=listing(tmp_path, model_path), MEMORY_LIMIT_MB=200)
    assert status != 0
    assert "insufficient_memory" in log and "MEMORY_LIMIT_MB is 200 MB" in log


@pytest.fixture
def one_worker_near_its_limit(model_path, logs_dir, tmp_path):
    """One worker serving "a" with room for one request of keys and values beside it (about 90 MB) and not much
    more; a copy of the default model in another folder ("a2": its weights count again) to load."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for entry in Path(model_path).iterdir():
        if entry.is_file() and not entry.name.startswith("."):
            (copy / entry.name).symlink_to(entry)
    solo = tmp_path / "solo.json"
    solo.write_text(json.dumps({"models": [{"id": "a", "path": model_path}]}))
    limit = fixed_mb(logs_dir, str(solo), 1) + 128
    with Server(logs_dir, MODELS_FILE=str(solo), WEB_CONCURRENCY=1, MEMORY_LIMIT_MB=f"{limit:.0f}") as server:
        measured(server)
        yield server, copy


def model_ids(server: Server) -> list[str]:
    return [model["id"] for model in requests.get(server.url + "/v1/models", timeout=30).json()["data"]]


def test_a_load_that_cannot_fit_beside_a_busy_model_is_refused_naming_the_memory(one_worker_near_its_limit):
    server, copy = one_worker_near_its_limit
    body = {"model": "a", "prompt": "Count: 1 2 3", "max_tokens": 2000, "ignore_eos": True,  # fits the share
            "stream": True}
    # streamed, and the connection closed once the load is answered: the generation ends then, not 2,000 tokens later
    with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=300):
        wait_until(lambda: metric(server, "phi_api_engine_sequences_running") > 0, timeout=30,
                   message='"a" generating')  # busy: it may not be unloaded to make room
        answer = requests.post(server.url + "/v1/models/load", json={"model": "a2", "path": str(copy)}, timeout=120)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["code"] == "insufficient_memory"
    assert re.search(r"loading a2: \d+ MB needed .* MEMORY_LIMIT_MB is \d+ MB", error["message"])
    assert model_ids(server) == ["a"]


def test_loading_unloads_idle_models_least_recently_used_first(one_worker_near_its_limit):
    server, copy = one_worker_near_its_limit
    answer = requests.post(server.url + "/v1/models/load", json={"model": "a2", "path": str(copy)}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert model_ids(server) == ["a2"]
    assert "model a unloaded to make room for a2" in server.log()


def test_a_model_that_could_never_fit_is_refused_and_nothing_is_unloaded(one_worker_near_its_limit):
    server, copy = one_worker_near_its_limit
    for index in range(8):  # eight more copies of the weights in the folder: gigabytes past the limit
        (copy / f"padding-{index}.data").symlink_to(copy / "model.onnx.data")
    answer = requests.post(server.url + "/v1/models/load", json={"model": "a2", "path": str(copy)}, timeout=120)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "insufficient_memory"
    assert model_ids(server) == ["a"]
