"""Prompts stored on disk (``PREFIX_CACHE_DIR``) with the real model and real gunicorn: a prompt one worker computed is
read by the other worker, and after a restart, and the answer is the cold request's, bit for bit."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import requests
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

CHUNK = 64  # PREFILL_CHUNK_TOKENS: the grid the chunks on disk lie on
DOCUMENT = " ".join(f"Record {i}: the keeper of lighthouse {i} logged {i % 5} ships and {i % 3} storms in {1800 + i}."
                    for i in range(30))


def pinned(server: Server, pid: int) -> OpenAI:
    """The openai client on a keep-alive connection worker ``pid`` accepted."""

    def connect() -> OpenAI:
        http = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=120)
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, http_client=http)
        client.models.list()
        return client

    return server.connected_to(pid, connect)


def complete(client: OpenAI, prompt: str, max_tokens: int = 12):
    return client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     logprobs=3)


def stored(folder: Path) -> int:
    return len(list(folder.rglob("*.kv")))


def disk_tokens(server: Server, what: str) -> float:
    """What /metrics says the workers read from disk or wrote to it (``what``), all told."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    pattern = rf"^phi_api_prefix_disk_{what}_tokens_total\{{[^}}]*\}} (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def same_answer(warm, cold) -> None:
    assert warm.choices[0].text == cold.choices[0].text
    assert warm.choices[0].logprobs.token_logprobs == cold.choices[0].logprobs.token_logprobs
    assert warm.choices[0].logprobs.top_logprobs == cold.choices[0].logprobs.top_logprobs


@pytest.mark.parametrize("mode", ["on", "exact"])
def test_a_prompt_one_worker_computed_is_read_by_the_other_and_answers_the_same(model_path, logs_dir, tmp_path, mode):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, PREFIX_CACHE=mode,
                PREFIX_CACHE_DIR=tmp_path, PREFILL_CHUNK_TOKENS=CHUNK) as server:
        pids = server.worker_pids()
        cold = complete(pinned(server, pids[0]), DOCUMENT)
        tokens = cold.usage.prompt_tokens
        assert tokens > 4 * CHUNK and cold.usage.prompt_tokens_details.cached_tokens == 0
        wait_until(lambda: stored(tmp_path) == tokens // CHUNK, 30, message="the prompt's chunks on disk")
        # Connected now, not before the cold request: gunicorn closes a connection idle for 5 s (keepalive), and a
        # new one may reach either worker.
        warm = complete(pinned(server, pids[1]), DOCUMENT)  # the other worker: nothing of it in its memory
        assert warm.usage.prompt_tokens_details.cached_tokens == (tokens - 1) // CHUNK * CHUNK
        same_answer(warm, cold)
        wait_until(lambda: disk_tokens(server, "read") == (tokens - 1) // CHUNK * CHUNK, 30, message="/metrics")


def test_a_prompt_stored_ahead_survives_a_restart(model_path, logs_dir, tmp_path):
    """Stored with max_tokens 0 (nothing generated), read after a restart; a server of its own without the disk
    tier gives the cold answer to compare with."""
    settings = dict(MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, PREFILL_CHUNK_TOKENS=CHUNK)
    with Server(logs_dir, PREFIX_CACHE_DIR=tmp_path, **settings) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        warmed = client.completions.create(model=MODEL_ID, prompt=DOCUMENT, max_tokens=0)
        assert warmed.choices[0].text == "" and warmed.usage.completion_tokens == 0
        tokens = warmed.usage.prompt_tokens
        wait_until(lambda: stored(tmp_path) == tokens // CHUNK, 30, message="the prompt's chunks on disk")
    with Server(logs_dir, PREFIX_CACHE_DIR=tmp_path, **settings) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        warm = complete(client, DOCUMENT)
    with Server(logs_dir, PREFIX_CACHE_DISK_MB=0, **settings) as server:
        cold = complete(OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120), DOCUMENT)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens == (tokens - 1) // CHUNK * CHUNK
    same_answer(warm, cold)


def test_the_folder_stays_within_its_bound(model_path, logs_dir, tmp_path):
    """A bound of about three prompts' chunks: after five prompts, the folder holds no more than it allows."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE_DIR=tmp_path,
                PREFILL_CHUNK_TOKENS=CHUNK) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        one = client.completions.create(model=MODEL_ID, prompt=DOCUMENT, max_tokens=0)
        wait_until(lambda: stored(tmp_path) == one.usage.prompt_tokens // CHUNK, 30)
        chunk_bytes = max(path.stat().st_size for path in tmp_path.rglob("*.kv"))
    bound_mb = 3 * stored(tmp_path) * chunk_bytes / 2**20
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE_DIR=tmp_path,
                PREFILL_CHUNK_TOKENS=CHUNK, PREFIX_CACHE_DISK_MB=f"{bound_mb:.3f}") as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        written = 0
        for index in range(5):  # one at a time: a burst may outrun the writer, whose chunks are then not stored
            answer = client.completions.create(model=MODEL_ID, prompt=f"Copy {index}. {DOCUMENT}", max_tokens=0)
            written += answer.usage.prompt_tokens // CHUNK * CHUNK
            wait_until(lambda total=written: disk_tokens(server, "written") == total, 30, message="its chunks written")
        assert written * chunk_bytes / CHUNK > 1.5 * bound_mb * 2**20  # more than the bound was written ...
        total = sum(path.stat().st_size for path in tmp_path.rglob("*.kv"))
        assert 0 < total <= bound_mb * 2**20  # ... and the folder holds no more than it allows
