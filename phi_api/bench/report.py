"""Benchmark output: a table on stdout, a JSON file, a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(report: dict[str, Any], path: Path) -> None:
    """The whole report, as measured."""
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def print_report(report: dict[str, Any]) -> None:
    """A readable summary, with the ratios the performance goals are stated in."""
    for name, results in report["targets"].items():
        if "failed" in results:
            print(f"\n== {name}\nfailed: {results['failed']}")
            continue
        single = results["single_stream"]
        raw = single.get("raw_engine", {})
        best = max((key for key in raw if key.endswith("_threads")), key=lambda key: int(key.split("_")[0]),
                   default=None)
        print(f"\n== {name}")
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
            print(f"one stream, paired with the raw run before it (median of runs): decode {paired['decode_ratio']:.2f}x "
                  f"raw, ttft = raw + {_ms(paired['ttft_delta_s'])}")
        print(f"{'streams':>8} {'aggregate tok/s':>16} {'per-stream tok/s':>17} {'ttft p50':>10} {'ttft p95':>10}"
              + ("  x raw single" if best else ""))
        for level, row in results["concurrency"]["levels"].items():
            ratio = (f"  {row['aggregate_tokens_per_s'] / raw[best]['decode_tokens_per_s']:.2f}x" if best else "")
            print(f"{level:>8} {row['aggregate_tokens_per_s']:>16.1f} {row['per_stream_decode_tokens_per_s']:>17.1f} "
                  f"{_ms(row['ttft_p50_s']):>10} {_ms(row['ttft_p95_s']):>10}{ratio}")
        hol = results["head_of_line"]
        print(f"head-of-line: short request ttft idle {_ms(hol['idle_ttft_s'])}, during a 400-token generation "
              f"{_ms(hol['busy_ttft_s'])} ({hol['ratio']:.2f}x)")
        reuse = results.get("prompt_reuse")
        if reuse:
            print(f"prompt reuse: next turn of a {reuse['prompt_tokens']:.0f}-token conversation: ttft "
                  f"{_ms(reuse['next_turn_ttft_s'])} vs cold {_ms(reuse['cold_ttft_s'])} ({reuse['ratio']:.2f}x; "
                  f"{reuse['cached_tokens']:.0f} tokens reused)")
        costs = results.get("feature_costs")
        if costs:
            print("feature costs (one stream, decode tok/s): " + ", ".join(
                f"{name} refused ({row['refused']})" if "refused" in row else
                f"{name} {row['decode_tokens_per_s']:.0f} ({row['ratio_to_plain']:.2f}x)" for name, row in costs.items()))
        concurrency = results["concurrency"]
        print(f"GET /v1/models at full load: p50 {_ms(concurrency['models_latency_under_load_p50_s'])}, "
              f"p95 {_ms(concurrency['models_latency_under_load_p95_s'])} "
              f"({concurrency['models_latency_samples']} samples, "
              f"{concurrency.get('models_latency_failures', 0)} failed or timed out)")
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
        throughput.plot(xs, [row["aggregate_tokens_per_s"] for row in levels.values()], marker="o", label=name)
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
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
