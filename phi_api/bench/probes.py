"""The bench's probes of one server beyond raw speed: long prompts, head-of-line waits, prompt reuse, the cost of
optional features, key/value capacity and memory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.client import stream_completion, unique
from phi_api.bench.common import (
    LONG_PROMPT,
    PREFILLING_PROMPT,
    PROMPT,
    SHORT_PROMPT,
    Target,
    completion_body,
    median,
)
from phi_api.bench.raw import RawReference
from phi_api.bench.server import Server


def measure_prompt_ttft(target: Target, runs: int, raw: RawReference | None) -> dict[str, Any]:
    """First-token time of a fresh ~300-token prompt, each run paired with the raw engine's just before it."""
    results, ratios = [], []
    for _ in range(runs):
        body = unique(completion_body(target, LONG_PROMPT, 2))
        reference = raw.sample(body["prompt"], 2)[max(raw.engines)].prefill_seconds if raw else None
        result = stream_completion(target.url, body)
        results.append(result)
        if reference:
            ratios.append(result.ttft / reference)
    measured = {"prompt_tokens": median([r.prompt_tokens or 0 for r in results]),
                "ttft_s": median([r.ttft for r in results])}
    if ratios:
        measured["ratio_to_raw_paired"] = median(ratios)
    return measured


def measure_head_of_line(target: Target, runs: int, long_tokens: int = 400) -> dict[str, Any]:
    """First-token time of a short request: on an idle server, while a long generation decodes, and while a long
    prompt is prefilled."""
    short = completion_body(target, SHORT_PROMPT, 4)
    idle = [stream_completion(target.url, unique(short)).ttft for _ in range(runs)]
    decoding, prefilling = [], []
    for _ in range(runs):
        long_body = {**unique(completion_body(target, PROMPT, long_tokens)), "stream": True}
        with requests.post(target.url + "/v1/completions", json=long_body, stream=True, timeout=600) as long_stream:
            lines = long_stream.iter_lines()
            next(line for line in lines if line.startswith(b"data: {"))  # the long one is generating
            decoding.append(stream_completion(target.url, unique(short)).ttft)
        if target.other:
            continue
        with _Background(lambda: stream_completion(target.url, unique(completion_body(target, PREFILLING_PROMPT, 2)))):
            _wait_for_running(target.url)  # the long prompt is being prefilled
            prefilling.append(stream_completion(target.url, unique(short)).ttft)
    measured = {"idle_ttft_s": median(idle), "busy_ttft_s": median(decoding), "ratio": median(decoding) / median(idle)}
    if prefilling:
        measured.update({"prefilling_ttft_s": median(prefilling),
                         "prefilling_ratio": median(prefilling) / median(idle)})
    return measured


class _Background:
    """``work()`` on a thread for the duration of a block (the block waits for it at its end)."""

    def __init__(self, work: Any) -> None:
        import threading

        self._thread = threading.Thread(target=work)

    def __enter__(self) -> _Background:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._thread.join()


def _wait_for_running(url: str, timeout: float = 60) -> None:
    """Until the server's gateway metrics say a request is running (prefilling or decoding)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = requests.get(url + "/metrics", timeout=10).text
        running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
        if any(float(line.rsplit(" ", 1)[1]) >= 1 for line in running):
            return
        time.sleep(0.05)
    raise RuntimeError("no request started running")


def kv_capacity(url: str) -> dict[str, Any]:
    """The served model's key/value type, bytes a token and tokens held per GB (from OpenArc's status)."""
    runtime = requests.get(url + "/v1/status", timeout=30).json()["models"][0]["runtime_config"]
    return {"kv_cache_dtype": runtime["kv_cache_dtype"], "kv_bytes_per_token": runtime["kv_bytes_per_token"],
            "tokens_per_gb": 2**30 // runtime["kv_bytes_per_token"]}


def conversation(seed: int, facts: int = 58) -> list[dict[str, str]]:
    """A long chat (about 1500 tokens with the default model), unique to ``seed`` so no cache knows it."""
    notes = " ".join(f"Note {seed}.{i}: item {i} costs {i * 7 + seed} coins." for i in range(facts))
    return [{"role": "system", "content": "You are a careful bookkeeper. " + notes},
            {"role": "user", "content": "What does item 12 cost?"}]


def measure_prompt_reuse(target: Target, runs: int) -> dict[str, Any]:
    """First-token time of a long conversation's first request (cold) and of its next turn.

    Both turns go over one keep-alive connection, as an SDK client's do, so
    they reach the same worker and its cache.
    """
    cold: list[float] = []
    warm: list[float] = []
    cached: list[float] = []
    prompts: list[float] = []
    for run in range(runs):
        session = requests.Session()
        messages = conversation(int(time.time() * 1000) % 100_000 + run)
        body = {"model": target.model, "max_tokens": 32, "temperature": 0}
        first = stream_completion(target.url, {**body, "messages": messages}, session, "/v1/chat/completions")
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And item 40?"}]
        second = stream_completion(target.url, {**body, "messages": messages}, session, "/v1/chat/completions")
        cold.append(first.ttft)
        warm.append(second.ttft)
        cached.append(second.cached_tokens or 0)
        prompts.append(second.prompt_tokens or 0)
    return {"prompt_tokens": median(prompts), "cold_ttft_s": median(cold), "next_turn_ttft_s": median(warm),
            "cached_tokens": median(cached), "ratio": median(warm) / median(cold)}


FEATURES: dict[str, dict[str, Any]] = {
    "plain": {},
    "logprobs (top 5)": {"logprobs": True, "top_logprobs": 5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "logit_bias": {"logit_bias": {"11": 1}},
    "min_p (sampling)": {"min_p": 0.05, "temperature": 1.0, "seed": 1},
    "json_schema grammar": {"ignore_eos": False, "min_tokens": 0, "response_format": {
        "type": "json_schema", "json_schema": {
        "name": "essay", "schema": {"type": "object", "properties": {"essay": {"type": "string", "maxLength": 4000}},
                                    "required": ["essay"]}}}},
}


def measure_feature_costs(target: Target, max_tokens: int, runs: int) -> dict[str, Any]:
    """Single-stream decode rate with each optional feature, runs interleaved so drift hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in FEATURES}
    base = {"model": target.model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, **target.full_length(max_tokens)}
    refused: dict[str, str] = {}
    for _ in range(runs):
        for name, extra in FEATURES.items():
            if name in refused:
                continue
            try:
                result = stream_completion(target.url, {**base, **extra}, path="/v1/chat/completions")
            except requests.HTTPError as exc:  # another server may not offer every feature
                refused[name] = f"HTTP {getattr(exc.response, 'status_code', '?')}"
                continue
            if result.decode_rate:
                samples[name].append(result.decode_rate)
    plain = median(samples["plain"])
    return {name: ({"refused": refused[name]} if name in refused else
                   {"decode_tokens_per_s": median(rates), "ratio_to_plain": median(rates) / plain})
            for name, rates in samples.items()}


def measure_memory(model_path: str, model_id: str, log_dir: Path, **settings: Any) -> dict[str, Any]:
    """Proportional set size of the whole server (with ``settings``) with one worker, then with two."""
    sizes = {}
    for workers in (1, 2):
        with Server(log_dir, MODEL_PATH=model_path, MODEL_ID=model_id, WEB_CONCURRENCY=workers,
                    MAX_CONCURRENT_REQUESTS=8, **settings) as server:
            body: dict[str, Any] = {"model": model_id, "prompt": SHORT_PROMPT, "max_tokens": 8}
            for session in server.sessions().values():  # every worker runs the model once
                session.post(server.url + "/v1/completions", json=body, timeout=600).raise_for_status()
            time.sleep(0.5)
            sizes[workers] = server.pss_bytes()
    return {"pss_1_worker_mb": sizes[1] / 2**20, "pss_2_workers_mb": sizes[2] / 2**20,
            "ratio": sizes[2] / sizes[1]}
