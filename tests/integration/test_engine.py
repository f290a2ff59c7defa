"""The engine as gunicorn runs it: every worker on its own session over one shared prepacked file; the KV budget."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until


def mapped_bytes(pid: int, marker: str) -> dict[str, int]:
    """Rss and Pss bytes of ``pid``'s mappings whose path contains ``marker``.

    Pss, not Shared_Clean, tells sharing: a freshly written file may be mapped as large folios, which smaps
    counts in neither Shared_Clean nor Private_Clean (seen on Linux 6.18), while Pss splits them fairly.
    """
    totals = {"Rss": 0, "Pss": 0}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = marker in line
        elif inside and fields and fields[0].rstrip(":") in totals:
            totals[fields[0].rstrip(":")] += int(fields[1]) * 1024
    return totals


def test_every_worker_maps_the_one_prepacked_file_and_shares_its_pages(server):
    body = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 4}
    for session in server.sessions().values():  # one request on each worker
        assert session.post(server.url + "/v1/completions", json=body).status_code == 200
    for pid in server.worker_pids():
        pages = mapped_bytes(pid, "/prepacked/")
        assert pages["Rss"] > 10 * 2**20, pages  # the weights are read from the mapped file ...
        assert pages["Pss"] < 0.75 * pages["Rss"], pages  # ... whose pages the other worker maps too


def test_each_worker_computes_with_its_share_of_the_cores(server):
    import os

    status = requests.get(server.url + "/v1/status").json()["models"][0]["runtime_config"]
    assert status["workers"] == 2
    assert status["intra_op_threads"] == max(1, (os.cpu_count() or 1) // 2)


@pytest.fixture(scope="module")
def small_budget(model_path, logs_dir):
    """10 MB of keys and values per worker: room for one request of 155 tokens, not two (SmolLM2 needs 45 KB a token,
    held in pages of 16 tokens a head: 7.4 MB for 155 tokens)."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, KV_CACHE_MB=10) as running:
        yield running


def test_a_request_larger_than_the_budget_is_refused_before_it_starts(small_budget):
    body = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 400, "stream": True}
    response = requests.post(small_budget.url + "/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
    assert "KV_CACHE_MB" in error["message"]


def test_requests_that_do_not_fit_together_wait_their_turn_and_all_finish(small_budget):
    def ask(request_id):
        body = {"model": MODEL_ID, "prompt": "Count with me:", "max_tokens": 150, "ignore_eos": True}
        return requests.post(small_budget.url + "/v1/completions", json=body, timeout=120,
                             headers={"X-Request-Id": request_id}).json()

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, ["budget-1", "budget-2", "budget-3"]))
    assert [answer["usage"]["completion_tokens"] for answer in answers] == [150] * 3
    rows = wait_until(lambda: (found := re.findall(r"\[budget-\d\] .* batch_rows=([\d.]+)", small_budget.log()))
                      and len(found) == 3 and found, timeout=10, message="the three generations' log lines")
    assert rows == ["1.0"] * 3  # one at a time: the budget held, and nobody was refused
