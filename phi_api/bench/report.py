"""Benchmark output: a table on stdout, a JSON file, a PNG chart."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def write_json(report: dict[str, Any], path: Path) -> None:
    """The whole report, as measured."""
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _known(value: float | None) -> bool:
    return value is not None and not math.isnan(value)  # NaN: no sample


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if _known(value) else "-"


def _share(value: float | None) -> str:
    return f"{value:.0%}" if _known(value) else "-"


def _rate(value: float | None) -> str:
    return f"{value:.1f}" if _known(value) else "-"


def print_report(report: dict[str, Any]) -> None:
    """A readable summary, with the ratios the performance goals are stated in."""
    for name, results in report["targets"].items():
        if "failed" in results:
            print(f"\n== {name}\nfailed: {results['failed']}")
            continue
        print(f"\n== {name}")
        _print_single(results["single_stream"])
        _print_concurrency(results["concurrency"]["levels"])
        _print_probes(results)
    batch = report.get("raw_static_batch")
    if batch:
        print(f"\nstatic batch of {batch['batch']} ({batch['threads']} threads, in this process), against ONNX Runtime "
              f"GenAI's single stream ({batch['single_tokens_per_s']:.1f} tok/s): ONNX Runtime GenAI "
              f"{batch['aggregate_tokens_per_s']:.1f} tok/s ({batch['ratio']:.2f}x); phi-api's engine session "
              f"{batch['engine_aggregate_tokens_per_s']:.1f} tok/s ({batch['engine_ratio']:.2f}x): the ceilings")
    memory = report.get("memory")
    if memory:
        print(f"\nmemory (PSS, whole server): 1 worker {memory['pss_1_worker_mb']:.0f} MB, "
              f"2 workers {memory['pss_2_workers_mb']:.0f} MB ({memory['ratio']:.2f}x)")
    print_goals(report)


def _print_single(single: dict[str, Any]) -> None:
    """One stream, against the raw engine."""
    raw = single.get("raw_engine", {})
    best = max((key for key in raw if key.endswith("_threads")), key=lambda key: int(key.split("_")[0]),
               default=None)
    for key in sorted((key for key in raw if key.endswith("_threads")), reverse=True):
        print(f"raw engine, {key.replace('_', ' ')} ({raw['prompt_tokens']}-token prompt, alternating with "
              f"this server): ttft {_ms(raw[key]['ttft_s'])}, decode {raw[key]['decode_tokens_per_s']:.1f} tok/s")
    line = f"one stream: ttft {_ms(single['ttft_s'])}, decode {single['decode_tokens_per_s']:.1f} tok/s"
    if best:
        reference = raw[best]
        line += (f" ({single['decode_tokens_per_s'] / reference['decode_tokens_per_s']:.2f}x raw decode, "
                 f"{best.replace('_', ' ')}; ttft = raw + {_ms(single['ttft_s'] - reference['ttft_s'])})")
    print(line)
    paired = single.get("paired")
    if paired:
        print("one stream, paired with the raw run before it (median of runs): decode "
              f"{paired['decode_ratio']:.2f}x "
              f"raw, ttft = raw + {_ms(paired['ttft_delta_s'])}")


def _print_concurrency(levels: dict[Any, dict[str, Any]]) -> None:
    """Concurrent streams, each level a row."""
    print("concurrent streams (each with a prompt of its own): 'wall' counts every token over the whole run,\n"
          "prompts included; 'decode' sums the streams' decode rates (each stream's includes the time spent on\n"
          "the prompts of the streams after it); 'steady' is the rate while every stream decodes (from the last\n"
          "first token to the first last token: no prompt left). Each run is paired with the raw engine's single\n"
          "stream just before it and with phi-api's engine session alone running a static batch of as many rows\n"
          "just after it (the ceiling of batching here, its own ratio to the raw single stream in 'ceiling');\n"
          "medians of those ratios")
    print(f"{'streams':>8} {'wall tok/s':>11} {'decode tok/s':>13} {'x raw single':>13} {'of ceiling':>11} "
          f"{'steady tok/s':>13} {'x raw single':>13} {'of ceiling':>11} {'ceiling':>8} {'ttft p50':>9} "
          f"{'ttft p95':>9}")
    for level, row in levels.items():
        decode = row.get("aggregate_decode_tokens_per_s", row["aggregate_tokens_per_s"])
        print(f"{level:>8} {row['aggregate_tokens_per_s']:>11.1f} {decode:>13.1f} "
              f"{_ratio(row.get('decode_to_raw_single_paired')):>13} "
              f"{_share(row.get('decode_to_engine_ceiling_paired')):>11} "
              f"{_rate(row.get('steady_decode_tokens_per_s')):>13} "
              f"{_ratio(row.get('steady_to_raw_single_paired')):>13} "
              f"{_share(row.get('steady_to_engine_ceiling_paired')):>11} "
              f"{_ratio(row.get('engine_ceiling_to_raw_single_paired')):>8} "
              f"{_ms(row['ttft_p50_s']):>9} {_ms(row['ttft_p95_s']):>9}")


def _print_probes(results: dict[str, Any]) -> None:
    """Head-of-line waits, long prompts, key/value capacity, prompt reuse, feature costs, /v1/models latency."""
    hol = results["head_of_line"]
    print(f"head-of-line: short request ttft idle {_ms(hol['idle_ttft_s'])}, during a 400-token generation "
          f"{_ms(hol['busy_ttft_s'])} ({hol['ratio']:.2f}x)" + (
              f", while a ~900-token prompt is prefilled {_ms(hol['prefilling_ttft_s'])} "
              f"({hol['prefilling_ratio']:.2f}x)" if "prefilling_ttft_s" in hol else ""))
    prompt = results.get("prompt_ttft")
    if prompt:
        print(f"first token of a {prompt['prompt_tokens']:.0f}-token prompt: {_ms(prompt['ttft_s'])}"
              + (f" ({prompt['ratio_to_raw_paired']:.2f}x raw, paired)" if "ratio_to_raw_paired" in prompt else ""))
    capacity = results.get("kv_capacity")
    if capacity:
        print(f"keys and values: {capacity['kv_cache_dtype']}, {capacity['kv_bytes_per_token'] / 1024:.0f} KB a "
              f"token, {capacity['tokens_per_gb']} tokens per GB")
    reuse = results.get("prompt_reuse")
    if reuse:
        print(f"prompt reuse: next turn of a {reuse['prompt_tokens']:.0f}-token conversation: ttft "
              f"{_ms(reuse['next_turn_ttft_s'])} vs cold {_ms(reuse['cold_ttft_s'])} ({reuse['ratio']:.2f}x; "
              f"{reuse['cached_tokens']:.0f} tokens reused)")
    costs = results.get("feature_costs")
    if costs:
        print("feature costs (one stream, decode tok/s): " + ", ".join(
            f"{name} refused ({row['refused']})" if "refused" in row else
            f"{name} {row['decode_tokens_per_s']:.0f} ({row['ratio_to_plain']:.2f}x)"
            for name, row in costs.items()))
    concurrency = results["concurrency"]
    print(f"GET /v1/models at full load: p50 {_ms(concurrency['models_latency_under_load_p50_s'])}, "
          f"p95 {_ms(concurrency['models_latency_under_load_p95_s'])} "
          f"({concurrency['models_latency_samples']} samples, "
          f"{concurrency.get('models_latency_failures', 0)} failed or timed out)")


def goals(report: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The engine issue's goals for phi-api (the first target), each as (goal, measured, met)."""
    rows: list[tuple[str, str, bool]] = []
    results = report["targets"].get("phi-api")
    if not results or "failed" in results:
        return rows
    reuse = results.get("prompt_reuse")
    if reuse:
        rows.append((f"next turn of a {reuse['prompt_tokens']:.0f}-token conversation: first token <= 0.15x cold",
                     f"{reuse['ratio']:.2f}x", reuse["ratio"] <= 0.15))
    hol = results["head_of_line"]
    rows.append(("a short request's first token while another decodes <= 2x idle", f"{hol['ratio']:.2f}x",
                 hol["ratio"] <= 2))
    if "prefilling_ratio" in hol:
        rows.append(("a short request's first token while another prefills <= 2x idle",
                     f"{hol['prefilling_ratio']:.2f}x", hol["prefilling_ratio"] <= 2))
    paired = results["single_stream"].get("paired")
    if paired:
        rows.append(("one stream: decode >= 0.95x raw (all cores)", f"{paired['decode_ratio']:.2f}x",
                     paired["decode_ratio"] >= 0.95))
    prompt = results.get("prompt_ttft", {})
    if "ratio_to_raw_paired" in prompt:
        rows.append((f"first token of a {prompt['prompt_tokens']:.0f}-token prompt <= 1.05x raw",
                     f"{prompt['ratio_to_raw_paired']:.2f}x", prompt["ratio_to_raw_paired"] <= 1.05))
    row = results["concurrency"]["levels"].get(8) or results["concurrency"]["levels"].get("8")
    if row and _known(row.get("steady_to_engine_ceiling_paired")):
        share = row["steady_to_engine_ceiling_paired"]
        rows.append(("8 streams while all decode >= 90% of the engine's own static batch of 8",
                     f"{share:.0%} ({_ratio(row.get('steady_to_raw_single_paired'))} raw single; ceiling "
                     f"{_ratio(row.get('engine_ceiling_to_raw_single_paired'))})", share >= 0.9))
    memory = report.get("memory")
    if memory:
        rows.append(("2 workers' PSS <= 1.15x one worker's", f"{memory['ratio']:.2f}x", memory["ratio"] <= 1.15))
    capacity = results.get("kv_capacity")
    if capacity:
        rows.append(("key/value tokens held per GB >= 2x float32 Phi-3.5-mini's 1,333", str(capacity["tokens_per_gb"]),
                     capacity["tokens_per_gb"] >= 2 * 1333))
    p95 = results["concurrency"]["models_latency_under_load_p95_s"]
    rows.append(("GET /v1/models p95 under full load < 50 ms", _ms(p95), p95 < 0.050))
    return rows


def print_goals(report: dict[str, Any]) -> None:
    """The goals, met or not, from this run."""
    rows = goals(report)
    if rows:
        print("\ngoals (this run):")
        for goal, measured, met in rows:
            print(f"  [{'met' if met else 'NOT met':>7}] {goal}: {measured}")


def write_chart(report: dict[str, Any], path: Path) -> None:
    """Aggregate throughput and median first-token time against concurrency, one line per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, results in report["targets"].items():
        if "failed" in results:
            continue
        levels = results["concurrency"]["levels"]
        xs = [int(level) for level in levels]
        throughput.plot(xs, [row.get("aggregate_decode_tokens_per_s", row["aggregate_tokens_per_s"])
                             for row in levels.values()], marker="o", label=f"{name} (decode)")
        throughput.plot(xs, [row["aggregate_tokens_per_s"] for row in levels.values()], marker=".", linestyle=":",
                        label=f"{name} (wall, prompts included)")
        latency.plot(xs, [row["ttft_p50_s"] * 1000 for row in levels.values()], marker="o", label=name)

    first = next(iter(report["targets"].values())).get("single_stream", {}).get("raw_engine", {})
    for key, style in (("2_threads", "--"), ("1_threads", ":")):
        if key in first:
            throughput.axhline(first[key]["decode_tokens_per_s"], linestyle=style, color="grey",
                               label=f"raw engine, 1 stream, {key.replace('_', ' ')}")
    for axis, title, unit in ((throughput, "Aggregate decode throughput", "tokens/s"),
                              (latency, "Time to first token (p50)", "ms")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
