"""``phi-api bench profile``: where a step's time goes, operator by operator (ONNX Runtime's profiler).

The graph the server computes with (the graph phi-api writes: its 4-bit and attention operators where the machine
runs them, int8 keys and values where ``auto`` picks them), in this process, on ``--threads`` intra-op threads:

- decode steps of each row count of ``--rows``, every row holding ``--context`` tokens;
- with ``--prompt``, a prompt chunk of that many tokens on a row of its own (its last position's logits only, as
  the server computes it), after ``--past`` tokens of that row (a long prompt's later chunks: their attention grows
  with the keys before them).

For each, over ``--steps`` repetitions: the median step's wall time, ONNX Runtime's own time for a step (its
``model_run``), and each operator's time per step, the vocabulary product (the logits) apart from the other
matrices. The breakdowns in docs/kernels.md and docs/attention.md come from it.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from phi_api.bench.common import emit, say

VOCABULARY = "vocabulary product"  # the operator key of the node that computes the logits


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="the model folder (as MODEL_PATH)")
    parser.add_argument("--rows", default="1,8", help="row counts of the decode steps (default 1,8)")
    parser.add_argument("--context", type=int, default=256, help="tokens each row holds (default 256)")
    parser.add_argument("--prompt", type=int, default=0, help="also a prompt chunk of this many tokens (0: none)")
    parser.add_argument("--past", type=int, default=0, help="tokens of the prompt chunk's row before it (default 0)")
    parser.add_argument("--steps", type=int, default=10, help="profiled repetitions of each (default 10)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads (default: cores)")
    parser.add_argument("--out", default="", help="also write the report (JSON) here")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Profile the steps; the report by phase (``"8 rows"``, ``"prompt of 170"``, ``"prompt of 64 after 3968"``)."""
    import onnx

    from phi_api.engine.runtime.logits import vocabulary_product
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.session import Decoder
    from phi_api.settings import cache_root

    model = LanguageModel(args.model_path, cache_dir=cache_root() / "runtime", kv_dtype="auto")
    graph = onnx.load(str(model.decoder_file), load_external_data=False).graph
    product = vocabulary_product(graph, model.spec.logits)
    rows = [int(part) for part in args.rows.split(",") if part]
    with tempfile.TemporaryDirectory() as folder:
        decoder = Decoder(model.decoder_file, model.spec, args.threads, profile=Path(folder) / "steps")
        try:
            labels, walls = profiled_steps(decoder, rows, args.context, (args.prompt, args.past), args.steps)
        finally:
            events = json.loads(decoder.end_profiling().read_text(encoding="utf-8"))
            decoder.unbind()
    phases = breakdown(events, labels, walls, product.name if product is not None else "")
    for label, phase in phases.items():
        say(f"{label}: {phase['wall_ms']:.1f} ms a step (ONNX Runtime {phase['ort_ms']:.1f}); " + ", ".join(
            f"{op} {ms:.1f}" for op, ms in list(phase["operators"].items())[:6]))
    return {"model_path": args.model_path, "graph": str(model.decoder_file), "threads": args.threads,
            "context": args.context, "past": args.past, "phases": phases}


def profiled_steps(decoder: Any, rows: list[int], context: int, chunk: tuple[int, int],
                   steps: int) -> tuple[list[str | None], dict[str, list[float]]]:
    """Run the steps: each run's label, in the order run (None: filling the rows' context), and each label's wall
    times (seconds). ``chunk``: the prompt chunk's tokens (0: none) and the tokens of its row before it."""
    from phi_api.engine.runtime.pool import KVPool

    prompt, past = chunk
    most = max(rows)
    pool = KVPool(decoder.spec, most + 1, max(context + 2, past + prompt))
    ids = (np.arange(max(context + 1, past + prompt), dtype=np.int64)[None, :] * 31 + 7) % decoder.spec.vocab_size
    labels: list[str | None] = []
    walls: dict[str, list[float]] = {}
    label = f"prompt of {prompt}" + (f" after {past}" if past else "")

    def timed(label: str | None, *step: Any) -> None:
        started = time.perf_counter()
        decoder.step(pool, *step)
        labels.append(label)
        if label is not None:
            walls.setdefault(label, []).append(time.perf_counter() - started)

    def fill(row: int, length: int) -> None:  # a row's first tokens, in the engine's default chunks
        for start in range(0, length, 64):
            timed(None, row, ids[:, start:min(length, start + 64)], np.array([start]), True)

    try:
        for row in range(most):
            fill(row, context)
        if prompt:
            fill(most, past)
        for _ in range(steps):
            for m in rows:
                timed(f"{m} rows", 0, np.repeat(ids[:, context:context + 1], m, axis=0), np.full(m, context), False)
            if prompt:
                timed(label, most, ids[:, past:past + prompt], np.array([past]), True)
    finally:
        pool.close()
    return labels, walls


def breakdown(events: list[dict[str, Any]], labels: list[str | None], walls: dict[str, list[float]],
              product: str) -> dict[str, dict[str, Any]]:
    """Each label's steps: median wall time, ONNX Runtime's mean time and each operator's mean time (ms a step,
    largest first), the node ``product`` counted as :data:`VOCABULARY`."""
    runs = sorted((event for event in events if event.get("cat") == "Session" and event["name"] == "model_run"),
                  key=lambda event: event["ts"])
    if len(runs) != len(labels):
        raise RuntimeError(f"the profiler saw {len(runs)} runs, {len(labels)} were made")
    starts = [run["ts"] for run in runs]
    operators: dict[str, Counter[str]] = {label: Counter() for label in walls}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        label = labels[bisect.bisect_right(starts, event["ts"]) - 1]
        if label is not None:
            node = event["name"][:-len("_kernel_time")]
            operators[label][VOCABULARY if node == product else event["args"]["op_name"]] += event["dur"]
    phases = {}
    for label, times in walls.items():
        count = len(times)
        ort = [run["dur"] for run, run_label in zip(runs, labels, strict=True) if run_label == label]
        phases[label] = {
            "steps": count, "wall_ms": statistics.median(times) * 1000, "ort_ms": statistics.fmean(ort) / 1000,
            "operators": {op: total / count / 1000 for op, total in operators[label].most_common()},
        }
    return phases


def main(args: argparse.Namespace) -> int:
    emit(run(args), args.out)
    return 0
