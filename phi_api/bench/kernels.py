"""``phi-api bench kernels``: ONNX Runtime's 4-bit matrix kernel (MatMulNBits, MLAS) at 1 to 16 rows.

Two measurements, medians of interleaved repetitions, on the machine's cores (intra-op threads = cores):

- **alone**: one MatMulNBits node (4-bit, blocks of 128, accuracy level 4, no zero points: the recipe of
  Phi-3.5-mini's CPU folder) at each of Phi-3.5-mini's weight shapes, random weights, ``M`` rows of input.
  The weights of one node stay in the caches between calls, so one row is faster here than in the model.
- **in the model** (``--model-path``): a decode step of ``M`` rows, each holding ``--context`` tokens, on a
  model folder (the random-weight one of Phi-3.5-mini's shape: ``prepare-model --shape phi-3.5-mini``).

What it is for (docs/kernels.md): from two rows on MLAS walks each tile of weights once per pair of rows, so a
step's time grows with its rows; the ratios ``t(M) / t(1)`` show how far batched decode is from one pass.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from phi_api.bench.common import say

# Phi-3.5-mini's matrices, (name, K, N): K inputs, N outputs
SHAPES = (("qkv", 3072, 9216), ("o", 3072, 3072), ("gate-up", 3072, 16384), ("down", 8192, 3072))
LAYERS = 32
BLOCK = 128


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", default="1,2,4,8,16", help="row counts (default 1,2,4,8,16)")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions of each case (median)")
    parser.add_argument("--model-path", help="also time decode steps of this model folder at each row count")
    parser.add_argument("--context", type=int, default=512, help="tokens each row holds in the model's steps")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--memory", action="store_true",
                        help="with --model-path and --ours: the server's PSS with 1 and 2 workers, each kernel")
    parser.add_argument("--streamed", action="store_true",
                        help="also the 4-bit matrices of a whole step, 32 layers' weights streamed from memory "
                             "(about 7 GB of memory)")
    parser.add_argument("--ours", action="store_true",
                        help="also phi-api's own kernel (AVX-512 VNNI; built with g++), side by side")


def weights(k: int, n: int, copy: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random 4-bit weights in MatMulNBits' layout (``[N, K / 128, 64]`` bytes) and one scale per block."""
    rng = np.random.default_rng((k * 7 + n) * 64 + copy)
    packed = rng.integers(0, 256, size=(n, k // BLOCK, BLOCK // 2), dtype=np.uint8)
    return packed, (rng.random((n, k // BLOCK), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)


def node_model(k: int, n: int) -> bytes:
    """A graph of one MatMulNBits node, ``[M, K] x [K, N]``, with :func:`weights`."""
    from onnx import TensorProto, helper, numpy_helper

    weight, scales = weights(k, n)
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=BLOCK, accuracy_level=4)
    graph = helper.make_graph([node], "matmulnbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scales, "s")])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def phase_medians(call: Callable[[Any], Any], arguments: dict[int, Any], reps: int, warmups: int) -> dict[int, float]:
    """Milliseconds of ``call(arguments[m])`` for each row count ``m``: medians of ``reps`` rounds after ``warmups``.
    One kernel's phase at a time: a kernel's idle threads spin a while after it and slow another one down."""
    times: dict[int, list[float]] = {m: [] for m in arguments}
    for rep in range(warmups + reps):
        for m, argument in arguments.items():
            started = time.perf_counter()
            call(argument)
            if rep >= warmups:
                times[m].append(time.perf_counter() - started)
    return {m: statistics.median(series) * 1000 for m, series in times.items()}


def run_node(session: Any, x: np.ndarray) -> np.ndarray:
    return session.run(None, {"x": x})[0]


def time_alone(rows: list[int], reps: int, threads: int, ours: Any = None) -> dict[str, dict[int, float]]:
    """Milliseconds per call of each shape's node at each row count; with ``ours`` (the built kernel), its own
    times too (``NAME ours``), side by side, and how far its outputs are from MLAS's."""
    import onnxruntime as ort

    from phi_api.engine.kernels.reference import repack

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    found: dict[str, dict[int, float]] = {}
    for name, k, n in SHAPES:
        session = ort.InferenceSession(node_model(k, n), options, providers=["CPUExecutionProvider"])
        inputs = {m: np.random.default_rng(m).standard_normal((m, k), dtype=np.float32) for m in rows}
        calls: dict[str, Callable[[np.ndarray], np.ndarray]] = {"mlas": functools.partial(run_node, session)}
        if ours is not None:
            tiles, scales = repack(*weights(k, n))
            calls["ours"] = functools.partial(ours.matmul, tiles, scales, n=n, threads=threads)
            mlas, mine = calls["mlas"](inputs[max(rows)]), calls["ours"](inputs[max(rows)])
            gap = np.abs(mlas - mine).max() / np.abs(mlas).max()
            say(f"{name}: ours against MLAS, largest difference {gap:.1e} of the largest output")
        for kind, call in calls.items():
            label = name if kind == "mlas" else f"{name} ours"
            found[label] = phase_medians(call, inputs, reps, warmups=2)
            say(f"{label} {k}x{n}: " + ", ".join(f"{m} rows {found[label][m]:.2f} ms" for m in rows))
    return found


def step_model(folder: Path) -> Path:
    """A graph of a step's 4-bit matrices in the model's order (each layer's qkv, o, gate-up and down, 32 layers,
    each with weights of its own: 2.2 GB, saved beside it), reading ``x3072`` and ``x8192``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, outputs, initializers = [], [], []
    for layer in range(LAYERS):
        for name, k, n in SHAPES:
            weight, scales = weights(k, n, layer)
            tag = f"{name}{layer}"
            nodes.append(helper.make_node("MatMulNBits", [f"x{k}", f"w_{tag}", f"s_{tag}"], [f"y_{tag}"],
                                          domain="com.microsoft", K=k, N=n, bits=4, block_size=BLOCK,
                                          accuracy_level=4))
            outputs.append(helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, ["M", n]))
            initializers += [numpy_helper.from_array(weight, f"w_{tag}"), numpy_helper.from_array(scales, f"s_{tag}")]
    widths = sorted({k for _, k, _ in SHAPES})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["M", k]) for k in widths]
    graph = helper.make_graph(nodes, "step", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    target = folder / "step.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(target), save_as_external_data=True,
              location="step.onnx.data")
    return target


def time_streamed(rows: list[int], reps: int, threads: int, ours: Any = None) -> dict[str, dict[int, float]]:
    """Milliseconds for the 4-bit matrices of a whole step of Phi-3.5-mini's shape, in the model's order with
    weights of their own (2.2 GB read from memory, as in the model; one session, one thread pool), at each row
    count; with ``ours``, its own too, called in the same order."""
    import tempfile

    import onnxruntime as ort

    from phi_api.engine.kernels.reference import repack

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="phi-api-kernels-") as folder:
        session = ort.InferenceSession(str(step_model(Path(folder))), options, providers=["CPUExecutionProvider"])
    widths = sorted({k for _, k, _ in SHAPES})
    inputs = {m: {f"x{k}": np.random.default_rng(m + k).standard_normal((m, k), dtype=np.float32) for k in widths}
              for m in rows}

    def mlas(m: int) -> None:
        session.run(None, inputs[m])

    calls: dict[str, Callable[[int], None]] = {"MLAS": mlas}
    if ours is not None:
        layers = [[(k, n, *repack(*weights(k, n, layer))) for _, k, n in SHAPES] for layer in range(LAYERS)]

        def own(m: int) -> None:
            for layer in layers:
                for k, n, tiles, scales in layer:
                    ours.matmul(tiles, scales, inputs[m][f"x{k}"], n, threads)

        calls["ours"] = own
    found = {f"{kind}, streamed": phase_medians(call, {m: m for m in rows}, reps, warmups=1)
             for kind, call in calls.items()}
    for label, series in found.items():
        say(f"{label}: " + ", ".join(f"{m} rows {series[m]:.1f} ms" for m in rows))
    return found


def time_steps(model_path: str, rows: list[int], reps: int, context: int, threads: int,
               int4_kernel: str) -> tuple[dict[int | str, float], dict[int, np.ndarray]]:
    """Milliseconds per decode step of each row count, every row holding ``context`` tokens, with the 4-bit kernel
    ``int4_kernel`` (INT4_KERNEL's values); and under "prompt", ms per token of the rows' prompts, in chunks of 64.
    Also the first row's logits in a step of each row count (every step computes the same position)."""
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.pool import KVPool
    from phi_api.settings import cache_root

    model = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="auto", int4_kernel=int4_kernel)
    decoder = model.new_decoder(threads)
    most = max(rows)
    pool = KVPool(decoder.spec, most, context + 2)
    ids = (np.arange(context + 1, dtype=np.int64)[None, :] * 31 + 7) % decoder.spec.vocab_size
    times: dict[int | str, list[float]] = {m: [] for m in rows}
    first_rows: dict[int, np.ndarray] = {}
    try:
        started = time.perf_counter()
        for row in range(most):  # each row's context, in the engine's chunk size
            for start in range(0, context, 64):
                decoder.step(pool, row, ids[:, start:min(context, start + 64)], np.array([start]), True)
        times["prompt"] = [(time.perf_counter() - started) / (most * context)]
        for rep in range(reps + 1):
            for m in rows:
                started = time.perf_counter()
                logits = decoder.step(pool, 0, np.repeat(ids[:, context:context + 1], m, axis=0),
                                      np.full(m, context), False)
                if rep:
                    times[m].append(time.perf_counter() - started)
                first_rows[m] = logits[0].copy()
    finally:
        decoder.unbind()
        pool.close()
    found = {m: statistics.median(series) * 1000 for m, series in times.items()}
    say(f"{Path(model_path).name}, INT4_KERNEL={int4_kernel}: " + ", ".join(f"{m} rows {found[m]:.1f} ms" for m in rows)
        + f"; prompt {found['prompt']:.2f} ms a token")
    return found, first_rows


def memory(model_path: str) -> dict[str, dict[str, float]]:
    """The whole server's PSS with 1 and 2 workers, with each kernel (INT4_KERNEL mlas, then phi-api)."""
    import tempfile

    from phi_api.bench.probes import measure_memory

    found = {}
    with tempfile.TemporaryDirectory(prefix="phi-api-kernels-") as logs:
        for kernel in ("mlas", "phi-api"):
            found[kernel] = measure_memory(model_path, "bench-model", Path(logs), INT4_KERNEL=kernel)
            say(f"INT4_KERNEL={kernel}: PSS {found[kernel]['pss_1_worker_mb']:.0f} MB with 1 worker, "
                f"{found[kernel]['pss_2_workers_mb']:.0f} MB with 2")
    return found


def closeness(logits: dict[str, dict[int, np.ndarray]]) -> dict[str, float]:
    """How far each kernel's first row moves between a lone row and the most rows, and how far the kernels' lone
    rows are apart (largest absolute difference of logits; the largest logit for scale; top-1 agreement)."""
    found: dict[str, float] = {}
    for kind, series in logits.items():
        most = max(series)
        found[f"{kind}: 1 row against {most} rows"] = float(np.abs(series[1] - series[most]).max())
    if len(logits) == 2:
        (_, first), (_, second) = logits.items()
        found["between the kernels, 1 row"] = float(np.abs(first[1] - second[1]).max())
        found["largest logit"] = float(np.abs(first[1]).max())
        found["top-1 the same"] = float(first[1].argmax() == second[1].argmax())
    return found


def table(title: str, series: dict[str, dict[Any, float]], rows: list[Any]) -> str:
    heads = [f"{m} rows" if isinstance(m, int) else str(m) for m in rows]
    lines = [title, "| | " + " | ".join(heads) + " | 8 rows / 1 | 8 rows / 2 |",
             "|---|" + "---|" * (len(rows) + 2)]
    for name, found in series.items():
        lone = found[8] / found[1] if 8 in found and 1 in found else float("nan")
        pair = found[8] / found[2] if 8 in found and 2 in found else float("nan")
        lines.append(f"| {name} | " + " | ".join(f"{found[m]:.2f}" for m in rows) + f" | {lone:.2f}x | {pair:.2f}x |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    rows = sorted({int(part) for part in args.rows.split(",") if part.strip()})
    threads = os.cpu_count() or 1
    say(f"MatMulNBits alone, {threads} threads, {args.reps} repetitions")
    ours = None
    if args.ours:
        from phi_api.engine.kernels.native import Q4Kernel
        from phi_api.settings import cache_root

        ours = Q4Kernel(cache_root() / "runtime" / "kernels")
    alone = time_alone(rows, args.reps, threads, ours)
    alone["a layer x 32"] = {m: LAYERS * sum(alone[name][m] for name, _, _ in SHAPES) for m in rows}
    if ours is not None:
        alone["a layer x 32, ours"] = {m: LAYERS * sum(alone[f"{name} ours"][m] for name, _, _ in SHAPES)
                                       for m in rows}
        alone["ours / MLAS"] = {m: alone["a layer x 32, ours"][m] / alone["a layer x 32"][m] for m in rows}
    report: dict[str, Any] = {"threads": threads, "rows": rows, "alone_ms": alone}
    print(table("MatMulNBits alone, ms a call", alone, rows))
    if args.streamed:
        streamed = time_streamed(rows, args.reps, threads, ours)
        if ours is not None:
            streamed["ours / MLAS"] = {m: streamed["ours, streamed"][m] / streamed["MLAS, streamed"][m] for m in rows}
        report["streamed_ms"] = streamed
        print(table("\nThe 4-bit matrices of a step (32 layers, weights from memory), ms", streamed, rows))
    if args.model_path:
        # one kernel's phase at a time (a session's idle threads spin a while after it)
        columns: list[int | str] = [*rows, "prompt"]
        series, logits = {}, {}
        series["step, MLAS"], logits["MLAS"] = time_steps(args.model_path, rows, args.reps, args.context, threads,
                                                          "mlas")
        if args.ours:
            series["step, ours"], logits["ours"] = time_steps(args.model_path, rows, args.reps, args.context,
                                                              threads, "phi-api")
            series["ours / MLAS"] = {m: series["step, ours"][m] / series["step, MLAS"][m] for m in columns}
        report["step_ms"] = series
        if 1 in rows:
            report["logits"] = closeness(logits)
            say("logits: " + ", ".join(f"{name} {value:.3g}" for name, value in report["logits"].items()))
        print(table(f"\nDecode steps of {Path(args.model_path).name}, {args.context} tokens a row, ms a step (prompt: "
                    "ms a token, in chunks of 64)", series, columns))
    if args.memory and args.model_path and args.ours:
        report["memory"] = memory(args.model_path)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0
