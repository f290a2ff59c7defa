"""``python -m phi_api bench spec``: speculative decoding from the prompt, on against off, in one run.

Two servers on one model, one worker each: one with speculation on (the
default), one with ``SPECULATIVE_DRAFT_MAX=0``. Every request goes to both,
the same body, in alternating order, one server idle while the other works.

- A copying workload (a paragraph to rewrite with its typos fixed, a block
  of code to edit) and a free-chat one, greedy, one stream at a time: the
  paired decode-rate ratios (on / off), and how many answers are the same.
- Eight concurrent streams of the copying workload: the paired ratio of
  completion tokens over the batch's wall time.
- Acceptance, from the on server's ``/metrics``: draft tokens kept per
  check, tokens gained per checking step.
- In this process, after the servers stop: what a step that feeds the
  pending token and ``k`` draft tokens of one row costs against a one-token
  step (k = 0..max), at 512 tokens of context, on the model and, with
  ``--shape-model-path``, on the production-shaped one.
- A projection: the copying answers replayed through the engine's own
  drafter give the sequence of steps (plain, or a check of ``k`` tokens that
  kept ``a``); with the step costs, the speed-up is
  ``tokens / sum(cost(k) for each step)`` (a plain step costs 1). Checked
  against the measured speed-up on the model, then given for the shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import requests
from prometheus_client.parser import text_string_to_metric_families

from phi_api.bench.client import LoadResult, StreamResult, concurrent_streams, stream_completion, unique
from phi_api.bench.server import Server

MODEL_ID = "bench-model"
CHAT_PATH = "/v1/chat/completions"
COPY_TOKENS = 256
CHAT_TOKENS = 128
STREAMS = 8
CONTEXT = 512  # tokens of context under the measured steps

COPYING = {
    "typos": (
        "Rewrite the following paragraph with its spelling mistakes fixed. Change nothing else.\n\n"
        "The old lighthouse stood on the edge of the cliff for more then two hundred years. Every night its "
        "keeper climbed the narow stairs, lit the lamp, and watched the ships pass safely beetween the rocks. "
        "In winter the storms were so strong that the windows shook and the sea sprayed the top of the tower. "
        "The keeper wrote everything in a large book: the wether, the ships he saw, and the names of the "
        "sailors who waved to him. When the light was finally replaced by an automatic beacon, the town "
        "turned the tower into a small musuem, and the book is still there for anyone who wants to read it."
    ),
    "code": (
        "In this Python function, rename the variable `total` to `subtotal` everywhere. Reply with the whole "
        "function and nothing else.\n\n"
        "def order_summary(items, tax_rate):\n"
        "    total = 0\n"
        "    for item in items:\n"
        "        price = item['price'] * item['quantity']\n"
        "        if item.get('discount'):\n"
        "            price = price * (1 - item['discount'])\n"
        "        total = total + price\n"
        "    tax = total * tax_rate\n"
        "    lines = [f\"{item['name']}: {item['quantity']}\" for item in items]\n"
        "    lines.append(f'Subtotal: {total:.2f}')\n"
        "    lines.append(f'Tax: {tax:.2f}')\n"
        "    lines.append(f'Total: {total + tax:.2f}')\n"
        "    return '\\n'.join(lines)\n"
    ),
}
CHAT = {
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "explain": "Explain how a refrigerator keeps food cold, for a ten-year-old.",
}
DRAFT_METRICS = ("phi_api_draft_tokens_total", "phi_api_draft_accepted_tokens_total", "phi_api_draft_checks_total")


def say(message: str) -> None:
    print(f"[bench-spec {time.strftime('%H:%M:%S')}] {message}", flush=True)


def chat_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}


def by_source(server: Server) -> dict[str, float]:
    """Draft tokens checked and kept by source, as the server counts them."""
    text = requests.get(server.url + "/metrics", timeout=30).text
    return {f"{sample.labels['source']}_{sample.labels['outcome']}": sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "phi_api_draft_source_tokens_total"}


def draft_counts(server: Server) -> dict[str, float]:
    """The draft counters of ``server``'s ``/metrics``, summed over their labels."""
    counts = dict.fromkeys(DRAFT_METRICS, 0.0)
    for line in requests.get(server.url + "/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in counts:
            counts[name] += float(line.rsplit(" ", 1)[1])
    return counts


def ratio(on: float | None, off: float | None) -> float | None:
    return on / off if on and off else None


def median(values: Sequence[float | None]) -> float | None:
    kept = [value for value in values if value is not None]
    return statistics.median(kept) if kept else None


def single_streams(servers: dict[str, Server], runs: int) -> dict[str, Any]:
    """Each prompt to both servers in alternating order, ``runs`` times: ratios, rates, answers, acceptance."""
    report: dict[str, Any] = {}
    for kind, prompts, max_tokens in (("copying", COPYING, COPY_TOKENS), ("chat", CHAT, CHAT_TOKENS)):
        pairs: list[dict[str, StreamResult]] = []
        before, sources_before = draft_counts(servers["on"]), by_source(servers["on"])
        for run in range(runs):
            for prompt in prompts.values():
                body = unique(chat_body(prompt, max_tokens))
                order = ("on", "off") if (run + len(pairs)) % 2 == 0 else ("off", "on")
                pairs.append({side: stream_completion(servers[side].url, body, path=CHAT_PATH) for side in order})
            say(f"{kind}, run {run + 1}/{runs}: on/off decode {pairs[-1]['on'].decode_rate or 0:.1f}/"
                f"{pairs[-1]['off'].decode_rate or 0:.1f} tok/s")
        after, sources_after = draft_counts(servers["on"]), by_source(servers["on"])
        drafted, accepted, checks = (after[name] - before[name] for name in DRAFT_METRICS)
        sources = {key: value - sources_before.get(key, 0.0) for key, value in sources_after.items()}
        report[kind] = {
            "decode_ratio": median([ratio(pair["on"].decode_rate, pair["off"].decode_rate) for pair in pairs]),
            "decode_on": median([pair["on"].decode_rate for pair in pairs]),
            "decode_off": median([pair["off"].decode_rate for pair in pairs]),
            "same_answers": sum(pair["on"].text == pair["off"].text for pair in pairs),
            "same_start": median([shared_start(pair["on"].text, pair["off"].text) for pair in pairs]),
            "answers": len(pairs),
            "tokens_on": median([float(pair["on"].tokens) for pair in pairs]),
            "example": {side: pairs[0][side].text for side in ("on", "off")},
            "drafted": drafted, "accepted": accepted, "checks": checks,
            "accepted_per_check": accepted / checks if checks else 0.0,
            "tokens_per_check": (accepted + checks) / checks if checks else 0.0,
            "by_source": {key: value for key, value in sources.items() if value},  # "<source>_checked", "_kept"
        }
    return report


def shared_start(one: str, other: str) -> float:
    """The share of ``other`` that ``one`` begins with (greedy answers part at a near-tie the kernels flip)."""
    same = next((index for index, (a, b) in enumerate(zip(one, other, strict=False)) if a != b),
                min(len(one), len(other)))
    return same / max(1, len(other))


def concurrent(servers: dict[str, Server], runs: int) -> dict[str, Any]:
    """Eight concurrent copying streams on each server, alternating: the paired aggregate ratio."""
    body = chat_body(COPYING["typos"], COPY_TOKENS)
    results: list[dict[str, LoadResult]] = []
    for run in range(runs):
        order = ("on", "off") if run % 2 == 0 else ("off", "on")
        results.append({side: concurrent_streams(servers[side].url, body, STREAMS, CHAT_PATH) for side in order})
        say(f"{STREAMS} copying streams, run {run + 1}/{runs}: on/off {results[-1]['on'].aggregate_rate:.1f}/"
            f"{results[-1]['off'].aggregate_rate:.1f} tok/s")
    return {
        "streams": STREAMS,
        "aggregate_ratio": median([ratio(pair["on"].aggregate_rate, pair["off"].aggregate_rate) for pair in results]),
        "aggregate_on": median([pair["on"].aggregate_rate for pair in results]),
        "aggregate_off": median([pair["off"].aggregate_rate for pair in results]),
    }


def copying_traces(server: Server, draft_max: int) -> list[list[tuple[int, int]]]:
    """Each copying prompt's greedy answer (speculation off), replayed through the drafter."""
    traces = []
    for prompt in COPYING.values():
        body = unique(chat_body(prompt, COPY_TOKENS))
        answer = stream_completion(server.url, body, path=CHAT_PATH).text
        prompt_ids = tokenize(server, {"messages": body["messages"]})
        traces.append(replay(prompt_ids, tokenize(server, {"prompt": answer}), draft_max))
    return traces


def tokenize(server: Server, body: dict[str, Any]) -> list[int]:
    answer = requests.post(server.url + "/tokenize", json={"model": MODEL_ID, **body}, timeout=60)
    answer.raise_for_status()
    return answer.json()["tokens"]


def replay(prompt: list[int], answer: list[int], draft_max: int) -> list[tuple[int, int]]:
    """The engine's steps for a greedy ``answer`` to ``prompt`` with drafts of at most ``draft_max`` tokens:
    per step, the draft's length (0: a plain step) and how many of it were kept. The first answer token comes
    from the prompt's step and is not counted; every step gives its kept tokens and one more."""
    from phi_api.engine.sampling.draft import Drafter

    drafter = Drafter(prompt, draft_max)
    drafter.extend(answer[:1])
    steps, done = [], 1
    while done < len(answer):
        draft = drafter.propose(len(answer) - done - 1)
        kept = 0
        while kept < len(draft) and draft[kept] == answer[done + kept]:
            kept += 1
        if draft:
            drafter.record(len(draft), kept)
        steps.append((len(draft), kept))
        drafter.extend(answer[done:done + kept + 1])
        done += kept + 1
    return steps


def projected_speedup(steps: list[tuple[int, int]], cost: Sequence[float]) -> float:
    """Tokens over time, against one token a plain step: ``sum(kept + 1) / sum(cost[k])``."""
    return sum(kept + 1 for _, kept in steps) / sum(cost[k] for k, _ in steps)


def step_costs(model_path: str, max_k: int, reps: int = 7) -> tuple[dict[str, list[float]], float]:
    """Step costs over ``CONTEXT`` tokens of context, for k = 0..max_k (medians of interleaved repetitions; keys
    and values as the server keeps them), and the seconds of the one-token step they are relative to:

    - ``one row``: a step of one row feeding ``k + 1`` tokens, over the one-token step's;
    - ``8 rows, one step``: what a step checking ``k`` draft tokens of each of 8 rows at once would cost, over a
      batched one-token step of 8 rows. ONNX Runtime's attention refuses several new tokens on past context for
      more than one row, so it is stood in for by one row taking ``8 (k + 1)`` tokens: the same matrix products
      (attention, a small part at this context, differs).
    """
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.pool import KVPool
    from phi_api.settings import cache_root

    model = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="auto")
    decoder = model.new_decoder(os.cpu_count() or 1)
    wide = STREAMS * (max_k + 1)
    pool = KVPool(decoder.spec, STREAMS, CONTEXT + wide + 1)
    ids = np.arange(100, 100 + CONTEXT + wide, dtype=np.int64)[None, :] % decoder.spec.vocab_size
    shapes = [("one", k + 1) for k in range(max_k + 1)] + [("rows", 1)] + [("wide", STREAMS * (k + 1))
                                                                            for k in range(1, max_k + 1)]
    times: dict[tuple[str, int], list[float]] = {shape: [] for shape in shapes}
    try:
        for start in range(0, CONTEXT, 64):  # one row's prompt, in the engine's chunk size (the other rows'
            decoder.step(pool, 0, ids[:, start:start + 64], np.array([start]), True)  # contents do not matter)
        for rep in range(reps + 1):
            for shape in shapes:
                kind, new = shape
                rows = STREAMS if kind == "rows" else 1
                started = time.perf_counter()
                decoder.step(pool, 0, np.repeat(ids[:, CONTEXT:CONTEXT + new], rows, axis=0),
                             np.full(rows, CONTEXT), False, every_position=new > 1)
                if rep:  # the first round warms each shape up
                    times[shape].append(time.perf_counter() - started)
    finally:
        decoder.unbind()
        pool.close()
    cost = {shape: statistics.median(series) for shape, series in times.items()}
    say(f"{Path(model_path).name}: one-token step {cost['one', 1] * 1000:.1f} ms, "
        f"{STREAMS} rows {cost['rows', 1] * 1000:.1f} ms")
    return {"one row": [cost["one", k + 1] / cost["one", 1] for k in range(max_k + 1)],
            f"{STREAMS} rows, one step": [1.0] + [cost["wide", STREAMS * (k + 1)] / cost["rows", 1]
                                                  for k in range(1, max_k + 1)]}, cost["one", 1]


def draft_projection(chat: dict[str, Any], one_row: Sequence[float], draft_step: float) -> dict[str, float]:
    """What the chat's checks with a draft model give per checking step on a model whose one-row check of k draft
    tokens costs ``one_row[k]`` steps and the draft model's token ``draft_step`` of its step: (kept + 1) tokens
    per check over its cost, the draft's included (the acceptance measured on the served pair)."""
    checks = chat["checks"] or 1
    k = min(len(one_row) - 1, max(1, round(chat["drafted"] / checks)))
    return {"draft_tokens": chat["drafted"] / checks, "tokens_per_check": chat["tokens_per_check"],
            "draft_step": draft_step, "speedup": chat["tokens_per_check"] / (one_row[k] + k * draft_step)}


def project(traces: list[list[tuple[int, int]]], costs: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """The replayed steps, and the speed-up each model's step costs give at their acceptance: one row checking
    its drafts, and 8 rows in lockstep checking theirs in one step (as phi-api's attention allows;
    GroupQueryAttention does not)."""
    steps = [step for trace in traces for step in trace]
    checks = [(k, kept) for k, kept in steps if k]
    tokens = sum(kept + 1 for _, kept in steps)
    speedup, arithmetic = {}, {}
    for name, model_costs in costs.items():
        for case, cost in model_costs.items():
            speedup[f"{name}, {case}"] = projected_speedup(steps, cost)
            arithmetic[f"{name}, {case}"] = (
                f"{tokens} tokens / ({len(steps) - len(checks)} plain steps + "
                f"{sum(cost[k] for k, _ in checks):.1f} step-equivalents of {len(checks)} checks); step cost for "
                f"k = 0..{len(cost) - 1}: " + ", ".join(f"{value:.2f}" for value in cost))
    return {
        "tokens": tokens, "steps": len(steps), "plain_steps": len(steps) - len(checks), "checks": len(checks),
        "checked_tokens": {k: sum(1 for drafted, _ in checks if drafted == k) for k in sorted({k for k, _ in checks})},
        "accepted_per_check": sum(kept for _, kept in checks) / len(checks) if checks else 0.0,
        "costs": costs, "speedup": speedup, "arithmetic": arithmetic,
    }


def measure_servers(model_path: str, runs: int, draft_max: int,
                    draft_model: str = "") -> tuple[dict[str, Any], list[Any]]:
    """Speculation on (with ``draft_model`` as its draft model, if any) and off, side by side."""
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as logs:
        common: dict[str, Any] = {"MODEL_PATH": model_path, "MODEL_ID": MODEL_ID, "WEB_CONCURRENCY": 1,
                  "MAX_CONCURRENT_REQUESTS": 2 * STREAMS}
        with Server(Path(logs), **common, SPECULATIVE_DRAFT_MODEL=draft_model) as on, \
                Server(Path(logs), **common, SPECULATIVE_DRAFT_MAX=0) as off:
            servers = {"on": on, "off": off}
            for server in servers.values():  # the first request of a worker pays for warm-up
                stream_completion(server.url, unique(chat_body(CHAT["story"], 8)), path=CHAT_PATH)
            report["single"] = single_streams(servers, runs)
            report["concurrent"] = concurrent(servers, runs)
            traces = copying_traces(off, draft_max)
    return report, traces


def run(args: Any) -> dict[str, Any]:
    from phi_api.settings import load_settings

    draft_max = load_settings({}).SPECULATIVE_DRAFT_MAX
    say(f"servers on {args.model_path}: speculation on (draft max {draft_max}) and off, {args.runs} runs")
    report, traces = measure_servers(args.model_path, args.runs, draft_max, args.draft_model_path or "")
    report["draft_model_path"] = args.draft_model_path
    measured = {"model": step_costs(args.model_path, draft_max)}
    if args.shape_model_path:
        measured["shape"] = step_costs(args.shape_model_path, draft_max)
    costs = {name: cost for name, (cost, _) in measured.items()}
    report["projection"] = project(traces, costs)
    if args.draft_model_path:  # a draft model's time against each model's step: its chat checks projected
        _, draft_seconds = step_costs(args.draft_model_path, 1)
        report["projection"]["with_draft"] = {
            name: draft_projection(report["single"]["chat"], cost["one row"], draft_seconds / seconds)
            for name, (cost, seconds) in measured.items()}
    report["model_path"], report["shape_model_path"] = args.model_path, args.shape_model_path
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-spec.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(table(report))
    return report


def kept_by_source(case: dict[str, Any]) -> str:
    """The draft tokens each source had checked and kept, as "; kept of checked: model 90/100, prompt 3/8"."""
    counts = case.get("by_source", {})
    names = sorted({key.rsplit("_", 1)[0] for key in counts})
    return ("; kept of checked: " + ", ".join(f"{name} {counts.get(name + '_kept', 0):.0f}/"
                                               f"{counts.get(name + '_checked', 0):.0f}" for name in names)
            if names else "")


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "n/a"


def table(report: dict[str, Any]) -> str:
    """The report as a Markdown table (what docs/benchmarks.md shows)."""
    single, many, projection = report["single"], report["concurrent"], report["projection"]
    rows = ["| Case | Speculation on / off | Detail |", "|---|---|---|"]
    for kind, goal in (("copying", ">= 1.8x"), ("chat", ">= 0.97x")):
        case = single[kind]
        rows.append(f"| {kind}, one stream, decode | {_x(case['decode_ratio'])} (goal {goal}) | "
                    f"{case['decode_on']:.1f} / {case['decode_off']:.1f} tok/s; {case['same_answers']} of "
                    f"{case['answers']} answers identical (median {case['same_start']:.0%} the same from the "
                    f"start); {case['accepted_per_check']:.2f} draft tokens kept "
                    f"per check, {case['tokens_per_check']:.2f} tokens per checking step{kept_by_source(case)} |")
    rows.append(f"| copying, {many['streams']} streams, aggregate | {_x(many['aggregate_ratio'])} (goal >= 1.3x) | "
                f"{many['aggregate_on']:.1f} / {many['aggregate_off']:.1f} tok/s |")
    for name, speedup in projection["speedup"].items():
        rows.append(f"| copying, projected ({name}) | {_x(speedup)} | {projection['arithmetic'][name]} |")
    for name, case in projection.get("with_draft", {}).items():
        rows.append(f"| chat with the draft model, projected ({name}, per checking step) | {_x(case['speedup'])} | "
                    f"{case['tokens_per_check']:.2f} tokens per check of {case['draft_tokens']:.1f} draft tokens; "
                    f"a draft token {case['draft_step']:.2f} of a step |")
    return "\n".join(rows)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder the two servers serve")
    parser.add_argument("--shape-model-path", help="also measure step costs on this (production-shaped) model")
    parser.add_argument("--draft-model-path", help="a draft model (same vocabulary) for the server with speculation")
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians are reported)")
    parser.add_argument("--out", default="bench/results", help="folder for bench-spec.json")


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
