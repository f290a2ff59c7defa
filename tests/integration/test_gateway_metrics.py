"""The metrics an inference gateway's endpoint picker routes by (the Gateway API Inference Extension's model server
protocol: vLLM's names), on a real gunicorn with two workers, under load: summed over the workers, whichever worker
answers the scrape."""

from __future__ import annotations

import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

LONG = {"model": MODEL_ID, "prompt": "Count slowly:", "max_tokens": 2000, "ignore_eos": True, "stream": True}
NAMES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


@pytest.fixture(scope="module")
def gateway_server(model_path, logs_dir):
    """Two workers, each with room for two of LONG's 2,005-token reserves (93 MB each for SmolLM2), not three."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, KV_CACHE_MB=200,
                MAX_CONCURRENT_REQUESTS=8) as running:
        yield running


def gateway(server: Server, session: requests.Session | None = None) -> dict[str, float | None]:
    """The gateway metrics of the served model (None for one no worker has published yet: each publishes its
    engines' load a quarter of a second after it starts, then every quarter of a second)."""
    text = (session or requests).get(server.url + "/metrics", timeout=10).text
    found = {sample.name: sample.value for family in text_string_to_metric_families(text)
             for sample in family.samples if sample.labels.get("model_name") == MODEL_ID}
    return {name: found.get(name) for name in NAMES}


def stream_on(server: Server, worker: int, stop: threading.Event) -> threading.Thread:
    """A long stream on ``worker``, read until ``stop`` (then its connection closes: it is cancelled)."""
    session = server.session_to(worker)

    def read() -> None:
        with session.post(server.url + "/v1/completions", json=LONG, stream=True, timeout=120) as response:
            for _ in response.iter_lines():
                if stop.is_set():
                    break

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def test_waiting_running_and_key_value_use_are_summed_over_the_workers(gateway_server):
    server = gateway_server
    first, second = server.worker_pids()
    stop = threading.Event()
    readers = [stream_on(server, worker, stop) for worker in (first, first, first, second)]
    try:
        # Two running and one waiting for room on the first worker, one running on the second.
        under_load = wait_until(lambda: (now := gateway(server)) and now["vllm:num_requests_running"] == 3
                                and now["vllm:num_requests_waiting"] == 1 and now, timeout=30,
                                message="the load in the gateway metrics")
        # Three reserves of 93 MB of the two workers' 400 MB: the usage is of the whole server.
        assert 0.6 < under_load["vllm:kv_cache_usage_perc"] < 0.75
        for worker in (first, second):  # whichever worker answers the scrape says the same
            assert gateway(server, server.session_to(worker))["vllm:num_requests_running"] == 3
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=60)
    wait_until(lambda: gateway(server) == {name: 0.0 for name in NAMES}, timeout=30,
               message="an idle server in the gateway metrics")
