"""``python -m phi_api bench``: phi-api against the raw engine (and other servers), in one run.

Every figure is a median over ``--runs`` repetitions, measured side by side
in the same invocation, because this kind of machine is shared and noisy.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

from phi_api.tools.bench.client import (
    LatencyProbe,
    LoadResult,
    StreamResult,
    concurrent_streams,
    stream_completion,
    unique,
)
from phi_api.tools.bench.raw import EngineBatch, RawEngine
from phi_api.tools.bench.server import Server

PROMPT = (
    "The history of computing is a story of people trying to make machines that think faster than they do. "
    "From the abacus to the mechanical calculators of the seventeenth century, from punched cards to vacuum "
    "tubes and transistors, each step made calculation cheaper and more widely available. Write a long essay "
    "about this history, with one paragraph for each major era, and explain why each change mattered."
)
SHORT_PROMPT = "Hello! How are you today?"
LONG_PROMPT = " ".join([PROMPT] * 4)  # about 300 tokens
PREFILLING_PROMPT = " ".join([PROMPT] * 12)  # about 900 tokens: seconds of prefill at Phi-3.5-mini's size


def say(message: str) -> None:
    """Progress, on stderr, as the run goes (a whole run takes many minutes)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@dataclass
class Target:
    """A server under test."""

    name: str
    url: str
    model: str
    other: bool = False  # another server, which may not know phi-api's ``ignore_eos``
    results: dict[str, Any] = field(default_factory=dict)

    def full_length(self, max_tokens: int) -> dict[str, Any]:
        """Body fields that make a completion run to ``max_tokens`` whatever the model would say.

        vLLM and phi-api know ``ignore_eos``; llama-cpp-python knows ``min_tokens``
        instead (and ignores fields it does not know).
        """
        return {"ignore_eos": True, "min_tokens": max_tokens} if self.other else {"ignore_eos": True}


def first_model(url: str) -> str:
    """The first model id a server lists."""
    return requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


class RawReference:
    """ONNX Runtime GenAI itself, in this process: with every core (set explicitly: its default computed on
    one core here), and with one thread; and phi-api's own engine session, for its static-batch ceiling."""

    def __init__(self, model_path: str) -> None:
        self.engines = {os.cpu_count() or 1: RawEngine(model_path), 1: RawEngine(model_path, 1)}
        self.prompt_tokens = len(self.engines[1].encode(PROMPT))
        for engine in self.engines.values():
            engine.generate(PROMPT, 8)  # warm-up
        self.own = EngineBatch(model_path)

    def static_batch(self, batch: int, max_tokens: int, runs: int) -> dict[str, Any]:
        """Static batches of ``batch`` copies of the prompt with every core, interleaved with single streams:
        ONNX Runtime GenAI's own batching, and phi-api's engine session without the server around it."""
        threads = max(self.engines)
        engine = self.engines[threads]
        prompt = np.asarray(engine.encode(PROMPT))
        raw, own, single = [], [], []
        for _ in range(runs):
            single.append(engine.generate(PROMPT, max_tokens).decode_rate)
            raw.append(engine.generate_batch(PROMPT, max_tokens, batch))
            own.append(self.own.aggregate_rate(prompt, max_tokens, batch))
        return {"batch": batch, "threads": threads, "aggregate_tokens_per_s": median(raw),
                "engine_aggregate_tokens_per_s": median(own), "single_tokens_per_s": median(single),
                "ratio": median(raw) / median(single), "engine_ratio": median(own) / median(single)}

    def sample(self, prompt: str, max_tokens: int) -> dict[int, Any]:
        """One generation per thread setting."""
        return {threads: engine.generate(prompt, max_tokens) for threads, engine in self.engines.items()}

    def engine_batch(self, rows: int, max_tokens: int) -> float:
        """phi-api's engine session alone (no server), a static batch of ``rows``: the ceiling of batching."""
        return self.own.aggregate_rate(np.asarray(self.engines[1].encode(PROMPT)), max_tokens, rows)


def summarize_raw(samples: list[dict[int, Any]]) -> dict[str, Any]:
    """Medians of raw-engine samples, per thread setting."""
    return {
        f"{threads}_threads": {
            "ttft_s": median([sample[threads].prefill_seconds for sample in samples]),
            "decode_tokens_per_s": median([sample[threads].decode_rate for sample in samples]),
        }
        for threads in samples[0]
    }


def _body(target: Target, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": target.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **target.full_length(max_tokens)}


def measure_single(target: Target, max_tokens: int, runs: int, raw: RawReference | None) -> dict[str, Any]:
    """One stream at a time: time to first token and decode rate, alternating with the raw engine.

    Taking the raw samples between the server's, in the same loop, lets both
    see the same machine: on a shared host the speed drifts within minutes.
    """
    stream_completion(target.url, unique(_body(target, PROMPT, 4)))  # warm-up
    results, raw_samples = [], []
    for _ in range(runs):
        # The same fresh prompt for both, which no prompt cache holds.
        body = unique(_body(target, PROMPT, max_tokens))
        if raw is not None:
            raw_samples.append(raw.sample(body["prompt"], max_tokens))
        results.append(stream_completion(target.url, body))
    single: dict[str, Any] = {
        "ttft_s": median([r.ttft for r in results]),
        "decode_tokens_per_s": median([r.decode_rate for r in results if r.decode_rate]),
    }
    if raw is not None and raw_samples:
        single["raw_engine"] = summarize_raw(raw_samples) | {"prompt_tokens": raw.prompt_tokens}
        single["paired"] = paired_ratios(results, raw_samples)
    return single


def paired_ratios(results: list[StreamResult], raw_samples: list[dict[int, Any]]) -> dict[str, float]:
    """Each server run against the raw run (all threads) taken just before it, then the median.

    On a machine whose speed drifts, the ratio of neighbours is steadier than
    the ratio of two medians.
    """
    pairs = [(result, sample[max(sample)]) for result, sample in zip(results, raw_samples, strict=True)
             if result.decode_rate]
    return {"decode_ratio": median([result.decode_rate / reference.decode_rate for result, reference in pairs]),
            "ttft_delta_s": median([result.ttft - reference.prefill_seconds for result, reference in pairs])}


_RATIOS = ("decode_to_raw_single_paired", "decode_to_engine_ceiling_paired", "steady_to_raw_single_paired",
           "steady_to_engine_ceiling_paired", "engine_ceiling_to_raw_single_paired")


def _ratios(batch: LoadResult, reference: float, ceiling: float) -> dict[str, float]:
    """One run's ratios (see :data:`_RATIOS`): the batch's summed and steady rates against the raw single stream
    run before it and the engine's static batch run after it, and that ceiling against the raw stream."""
    ratios = {"decode_to_raw_single_paired": batch.decode_rate / reference,
              "decode_to_engine_ceiling_paired": batch.decode_rate / ceiling,
              "engine_ceiling_to_raw_single_paired": ceiling / reference}
    if batch.steady_rate:
        ratios.update({"steady_to_raw_single_paired": batch.steady_rate / reference,
                       "steady_to_engine_ceiling_paired": batch.steady_rate / ceiling})
    return ratios


def measure_concurrency(target: Target, levels: list[int], max_tokens: int, runs: int,
                        raw: RawReference | None) -> dict[str, Any]:
    """Aggregate throughput and first-token times at each concurrency level; /v1/models latency at the top level.

    Each run is paired, on a machine whose speed drifts: the raw engine's single stream (all cores) just
    before the server's batch, and phi-api's engine session alone running a static batch of as many rows
    just after it; the ratios are taken run by run, then their median.

    The /v1/models latency is measured during one more batch at the top level, not during the paired ones:
    polled every 20 ms, the probe takes a tenth of two cores from the engine (at Phi-3.5-mini's shape, 8
    streams reached 97% of the ceiling without it and 87% with it), and the ceiling runs without it.
    """
    body = _body(target, PROMPT, max_tokens)
    sweep = {}
    for level in levels:
        batches, paired = [], []
        for _ in range(runs):
            reference = raw.sample(PROMPT, max_tokens)[max(raw.engines)].decode_rate if raw is not None else 0.0
            batch = concurrent_streams(target.url, body, level)
            batches.append(batch)
            if raw is not None:
                paired.append(_ratios(batch, reference, raw.engine_batch(level, max_tokens)))
        ttfts = [stream.ttft for batch in batches for stream in batch.streams]
        sweep[level] = {
            "aggregate_tokens_per_s": median([batch.aggregate_rate for batch in batches]),
            "aggregate_decode_tokens_per_s": median([batch.decode_rate for batch in batches]),
            "steady_decode_tokens_per_s": median([batch.steady_rate for batch in batches if batch.steady_rate]),
            "per_stream_decode_tokens_per_s": median([s.decode_rate for b in batches for s in b.streams
                                                      if s.decode_rate]),
            "ttft_p50_s": percentile(ttfts, 0.5),
            "ttft_p95_s": percentile(ttfts, 0.95),
        }
        if raw is not None:
            sweep[level].update({key: median([ratios[key] for ratios in paired if key in ratios])
                                 for key in _RATIOS})
    with LatencyProbe(target.url) as probe:
        concurrent_streams(target.url, body, max(levels))
    return {
        "levels": sweep,
        "models_latency_under_load_p50_s": percentile(probe.latencies, 0.5),
        "models_latency_under_load_p95_s": percentile(probe.latencies, 0.95),
        "models_latency_samples": len(probe.latencies),
        "models_latency_failures": probe.failures,
    }


def measure_prompt_ttft(target: Target, runs: int, raw: RawReference | None) -> dict[str, Any]:
    """First-token time of a fresh ~300-token prompt, each run paired with the raw engine's just before it."""
    results, ratios = [], []
    for _ in range(runs):
        body = unique(_body(target, LONG_PROMPT, 2))
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
    short = _body(target, SHORT_PROMPT, 4)
    idle = [stream_completion(target.url, unique(short)).ttft for _ in range(runs)]
    decoding, prefilling = [], []
    for _ in range(runs):
        long_body = {**unique(_body(target, PROMPT, long_tokens)), "stream": True}
        with requests.post(target.url + "/v1/completions", json=long_body, stream=True, timeout=600) as long_stream:
            lines = long_stream.iter_lines()
            next(line for line in lines if line.startswith(b"data: {"))  # the long one is generating
            decoding.append(stream_completion(target.url, unique(short)).ttft)
        if target.other:
            continue
        with _Background(lambda: stream_completion(target.url, unique(_body(target, PREFILLING_PROMPT, 2)))):
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


def measure_memory(model_path: str, model_id: str, log_dir: Path) -> dict[str, Any]:
    """Proportional set size of the whole server with one worker, then with two."""
    sizes = {}
    for workers in (1, 2):
        with Server(log_dir, MODEL_PATH=model_path, MODEL_ID=model_id, WEB_CONCURRENCY=workers,
                    MAX_CONCURRENT_REQUESTS=8) as server:
            body: dict[str, Any] = {"model": model_id, "prompt": SHORT_PROMPT, "max_tokens": 8}
            for session in server.sessions().values():  # every worker runs the model once
                session.post(server.url + "/v1/completions", json=body, timeout=600).raise_for_status()
            time.sleep(0.5)
            sizes[workers] = server.pss_bytes()
    return {"pss_1_worker_mb": sizes[1] / 2**20, "pss_2_workers_mb": sizes[2] / 2**20,
            "ratio": sizes[2] / sizes[1]}


def _server_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` -> (NAME, environment)."""
    name, _, assignments = spec.partition(":")
    env = dict(item.split("=", 1) for item in assignments.split(",") if item)
    return name, env


def measure_target(target: Target, options: Any, levels: list[int], raw: RawReference | None) -> dict[str, Any]:
    """Every per-server measurement."""
    results: dict[str, Any] = {}
    say(f"{target.name}: one stream, {options.runs} runs alternating with the raw engine")
    results["single_stream"] = measure_single(target, options.max_tokens, options.runs, raw)
    if not target.other:
        say(f"{target.name}: first token of a ~300-token prompt, paired with the raw engine")
        results["prompt_ttft"] = measure_prompt_ttft(target, options.runs, raw)
        results["kv_capacity"] = kv_capacity(target.url)
    say(f"{target.name}: head-of-line latency")
    results["head_of_line"] = measure_head_of_line(target, options.runs)
    say(f"{target.name}: concurrent streams {levels}, then GET /v1/models probes during one more batch of "
        f"{max(levels)}")
    results["concurrency"] = measure_concurrency(target, levels, options.max_tokens, options.runs,
                                                 None if target.other else raw)
    say(f"{target.name}: prompt reuse")
    results["prompt_reuse"] = measure_prompt_reuse(target, options.runs)
    say(f"{target.name}: feature costs")
    results["feature_costs"] = measure_feature_costs(target, options.max_tokens, options.runs)
    return results


def run(options: Any) -> dict[str, Any]:
    """Run every measurement the options ask for; returns the report (also printed and written)."""
    from phi_api.tools.bench.report import print_report, write_chart, write_json

    levels = [int(level) for level in options.concurrency.split(",")]
    log_dir = Path(tempfile.mkdtemp(prefix="phi-api-bench-"))
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S")},
        "settings": {"runs": options.runs, "max_tokens": options.max_tokens, "concurrency": levels},
        "targets": {},
    }
    say("loading the raw references (ONNX Runtime GenAI, all cores and one thread; phi-api's engine session)")
    raw = RawReference(options.model_path) if options.model_path else None
    servers: list[tuple[str, dict[str, Any]]] = [("phi-api", {})] if not options.url else []
    servers += [_server_spec(spec) for spec in options.server or []]
    for name, env in servers:
        say(f"starting {name} {env or ''}".rstrip())
        with Server(log_dir, MODEL_PATH=options.model_path, MODEL_ID="bench-model",
                    MAX_CONCURRENT_REQUESTS=max(levels) * 2, **env) as own:
            report["targets"][name] = measure_target(Target(name, own.url, "bench-model"), options, levels, raw)
    if options.url:
        url = options.url.rstrip("/")
        report["targets"]["phi-api"] = measure_target(Target("phi-api", url, first_model(url)), options, levels, raw)
    for spec in options.compare or []:
        name, _, url = spec.partition("=")
        url = url.rstrip("/")
        try:
            report["targets"][name] = measure_target(Target(name, url, first_model(url), other=True), options,
                                                     levels, raw)
        except (requests.RequestException, RuntimeError) as exc:  # keep what was measured of the others
            report["targets"][name] = {"failed": f"{type(exc).__name__}: {exc}"}
    if raw is not None:
        batch = max(level for level in levels if level <= 8)
        say(f"static batches of {batch}: ONNX Runtime GenAI's and phi-api's engine session, in this process")
        report["raw_static_batch"] = raw.static_batch(batch, options.max_tokens, options.runs)

    if options.model_path and options.memory:
        # This process's own sessions map the host's prepacked file too: held, they would take a share of its
        # pages from the server's PSS (more with one worker than with two).
        import gc

        raw = None
        gc.collect()
        say("memory: the whole server's PSS with 1 worker, then 2")
        report["memory"] = measure_memory(options.model_path, "bench-model", log_dir)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(report, out / "bench.json")
    write_chart(report, out / "bench.png")
    print_report(report)
    print(f"\nWrote {out / 'bench.json'} and {out / 'bench.png'}")
    return report
