"""``python -m phi_api bench serving``: phi-api against the raw engine (and other servers), in one run.

Every figure is a median over ``--runs`` repetitions, measured side by side
in the same invocation, because this kind of machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.client import (
    LatencyProbe,
    LoadResult,
    StreamResult,
    concurrent_streams,
    stream_completion,
    unique,
)
from phi_api.bench.common import (
    PROMPT,
    Target,
    completion_body,
    first_model,
    median,
    needs_server,
    percentile,
    say,
)
from phi_api.bench.probes import (
    kv_capacity,
    measure_feature_costs,
    measure_head_of_line,
    measure_memory,
    measure_prompt_reuse,
    measure_prompt_ttft,
)
from phi_api.bench.raw import RawReference, summarize_raw
from phi_api.bench.server import Server


def measure_single(target: Target, max_tokens: int, runs: int, raw: RawReference | None) -> dict[str, Any]:
    """One stream at a time: time to first token and decode rate, alternating with the raw engine.

    Taking the raw samples between the server's, in the same loop, lets both
    see the same machine: on a shared host the speed drifts within minutes.
    """
    stream_completion(target.url, unique(completion_body(target, PROMPT, 4)))  # warm-up
    results, raw_samples = [], []
    for _ in range(runs):
        # The same fresh prompt for both, which no prompt cache holds.
        body = unique(completion_body(target, PROMPT, max_tokens))
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
    body = completion_body(target, PROMPT, max_tokens)
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
    from phi_api.bench.report import print_report, write_chart, write_json

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


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="an already running phi-api (default: start one on --model-path)")
    parser.add_argument("--model-path", help="model folder for the raw-engine reference and the server it starts")
    parser.add_argument("--compare", action="append", metavar="NAME=URL",
                        help="another OpenAI-compatible server to measure side by side (repeatable)")
    parser.add_argument("--server", action="append", metavar="NAME:KEY=VALUE,...",
                        help="also start and measure phi-api with these settings, e.g. "
                             "per-worker:PRELOAD_MODEL=false,WEB_CONCURRENCY=1 (repeatable)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions per measurement (medians are reported)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per streamed completion")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated concurrency levels")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the 1-worker/2-worker memory measurement")
    parser.add_argument("--out", default="bench/results", help="folder for bench.json and bench.png")


def main(args: argparse.Namespace) -> int:
    if not needs_server(args, "bench serving"):
        return 2
    run(args)
    return 0
