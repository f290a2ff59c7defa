"""``phi-api bench attention``: one attention layer of Phi-3.5-mini's shape on its own, phi-api's operator beside ONNX
Runtime's GroupQueryAttention (int8 keys and values, and float32 ones: ``ours_float32`` is phi-api's over float32
ones, against ``float32``; ``ours_int4`` phi-api's over int4 ones, which only it computes) in the same run:
decode steps of 1 and 8 rows at contexts of 1k to 8k tokens, and prompt chunks on pasts of 0 to 8k tokens. Each
figure is the median of several calls; ours is also given as a share of the machine's limits measured in the same
run (``bench roofline``): a decode step's bytes of keys and values over the read bandwidth, a prompt chunk's
multiply-adds over the int8 peak.

With ``--baseline LIBRARY`` (another build of phi-api's operator library, such as one built from an earlier commit),
each figure also times that build against this tree's, their calls alternating in one process over the same caches:
on a machine whose speed drifts from minute to minute, the median of the pairs' ratios tells a change of a few
percent that separate runs cannot.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from phi_api.bench.common import emit, say
from phi_api.engine.kernels.attention_graph import PHI35, SMOLLM2, Shape, gqa_model

SHAPES = {"phi-3.5-mini": PHI35, "smollm2": SMOLLM2}
KINDS = ("ours", "int8", "float32", "ours_float32", "ours_int4")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", choices=sorted(SHAPES), default="phi-3.5-mini")
    parser.add_argument("--contexts", default="1024,4096,8192", help="decode contexts and prompt pasts, in tokens")
    parser.add_argument("--rows", default="1,8", help="rows of a decode step")
    parser.add_argument("--chunk", type=int, default=64, help="tokens of a prompt chunk (PREFILL_CHUNK_TOKENS)")
    parser.add_argument("--reps", type=int, default=7, help="calls timed per figure (medians are reported)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (default: every core)")
    parser.add_argument("--baseline", default="", metavar="LIBRARY",
                        help="another build of the operator's library (.so), timed against this tree's alternately")
    parser.add_argument("--out", default="", help="also write the report (JSON) here")


class Layer:
    """Sessions of one layer's attention, ours and ONNX Runtime's, over caches of ``tokens`` tokens."""

    def __init__(self, shape: Shape, tokens: int, threads: int, baseline: str = "") -> None:
        import onnxruntime as ort

        from phi_api.engine.kernels.op import build_library
        from phi_api.engine.runtime.attention import swap
        from phi_api.settings import cache_root

        self.shape, self.tokens = shape, tokens
        library = build_library(cache_root() / "runtime")
        self.positions = tokens
        graphs = {"int8": gqa_model(shape, tokens, tokens), "float32": gqa_model(shape, tokens, tokens, int8=False)}
        graphs["ours"], graphs["ours_float32"] = gqa_model(shape, tokens, tokens), gqa_model(shape, tokens, tokens,
                                                                                             int8=False)
        graphs["ours_int4"] = gqa_model(shape, tokens, tokens)
        swap(graphs["ours"])
        swap(graphs["ours_float32"])
        swap(graphs["ours_int4"], int4=True)
        libraries = dict.fromkeys(graphs, str(library))
        if baseline:  # a pair of its own: their pools' threads must not spin while the other one's run
            graphs["versus"] = graphs["baseline"] = graphs["ours"]
            libraries["versus"], libraries["baseline"] = str(library), baseline
        self.sessions = {}
        for kind, graph in graphs.items():
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            if kind in ("versus", "baseline"):
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.register_custom_ops_library(libraries[kind])
            self.sessions[kind] = ort.InferenceSession(graph.SerializeToString(), options,
                                                       providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        angles = np.arange(tokens)[:, None] / 10000 ** (np.arange(shape.rot_half) / shape.rot_half)
        self.cos, self.sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        self.scales = (rng.uniform(0.01, 0.05, (1, shape.kv_heads, 1, shape.head_size)).astype(np.float32),
                       rng.uniform(0.01, 0.05, (1, shape.kv_heads, 1, shape.head_size)).astype(np.float32))
        self.rng = rng

    def caches(self, rows: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        size = (rows, self.shape.kv_heads, self.tokens, self.shape.head_size)
        if kind in ("float32", "ours_float32"):
            return (self.rng.standard_normal(size, dtype=np.float32), self.rng.standard_normal(size, dtype=np.float32))
        if kind == "ours_int4":  # nibbles at random, each tile's 16 token scales (its last 64 bytes) sane floats
            width = self.shape.head_size // 2 + 4
            caches = []
            for _ in range(2):
                cache = self.rng.integers(-128, 128, (*size[:3], width), dtype=np.int8)
                tiles = cache.reshape(*size[:2], -1, 16 * width)
                tiles[..., 16 * width - 64:] = self.rng.uniform(0.5, 2, (*tiles.shape[:3], 16)).astype(
                    np.float32).view(np.int8)
                caches.append(cache)
            return caches[0], caches[1]
        return (self.rng.integers(-127, 128, size, dtype=np.int8), self.rng.integers(-127, 128, size, dtype=np.int8))

    def timed(self, kind: str, rows: int, new: int, past: int, reps: int) -> float:
        """Median seconds of one step of ``rows`` rows of ``new`` tokens on ``past`` tokens each."""
        call = self.bound(kind, rows, new, past, self.caches(rows, kind))
        call()  # warm-up
        return statistics.median(_seconds(call) for _ in range(reps))

    def against_baseline(self, rows: int, new: int, past: int, reps: int) -> dict[str, float]:
        """The baseline build's step against ours, called alternately (which goes first swaps each time) over the
        same caches, by sessions whose threads do not spin: each one's median, and the median of the pairs' ratios
        (ours over the baseline's)."""
        caches = self.caches(rows, "ours")
        calls = {kind: self.bound(kind, rows, new, past, caches) for kind in ("versus", "baseline")}
        times: dict[str, list[float]] = {"versus": [], "baseline": []}
        for rep in range(reps + 1):
            for kind in (("versus", "baseline") if rep % 2 else ("baseline", "versus")):
                seconds = _seconds(calls[kind])
                if rep:  # the first pair warms up
                    times[kind].append(seconds)
        return {"versus_ours_ms": statistics.median(times["versus"]) * 1e3,
                "baseline_ms": statistics.median(times["baseline"]) * 1e3,
                "ours_over_baseline": statistics.median(
                    ours / base for ours, base in zip(times["versus"], times["baseline"], strict=True))}

    def bound(self, kind: str, rows: int, new: int, past: int,
              caches: tuple[np.ndarray, np.ndarray]) -> Callable[[], Any]:
        """One call of ``kind``'s session on a step of ``rows`` rows of ``new`` tokens on ``past`` tokens each,
        its inputs bound (the caches as its past and present keys and values); the call returns the binding, whose
        outputs hold the step's result."""
        import onnxruntime as ort

        session = self.sessions[kind]
        keys, values = caches
        binding = session.io_binding()
        feeds = {"qkv": self.rng.standard_normal((rows, new, self.shape.width), dtype=np.float32),
                 "seqlens_k": np.full(rows, past + new - 1, dtype=np.int32),
                 "total_sequence_length": np.array(past + new, dtype=np.int32), "cos": self.cos, "sin": self.sin}
        if kind not in ("float32", "ours_float32"):
            feeds["key_scale"], feeds["value_scale"] = self.scales
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for past_name, present_name, cache in (("past_key", "present_key", keys), ("past_value", "present_value",
                                                                                    values)):
            shared = ort.OrtValue.ortvalue_from_numpy(cache)
            binding.bind_ortvalue_input(past_name, shared)
            binding.bind_ortvalue_output(present_name, shared)
        binding.bind_output("output")

        def call() -> Any:
            session.run_with_iobinding(binding)
            return binding

        return call


def _seconds(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    from phi_api.bench.roofline import measure

    shape = SHAPES[args.shape]
    contexts = [int(value) for value in args.contexts.split(",")]
    say("the machine's limits")
    limits = measure(args.threads or None)
    layer = Layer(shape, max(contexts) + args.chunk + 16, args.threads, args.baseline)
    head_bytes = shape.kv_heads * shape.head_size  # int8 keys (and as many values) of one token
    report: dict[str, Any] = {"shape": args.shape, "limits": limits.__dict__, "decode": [], "prompt": []}
    for context in contexts:
        for rows in [int(value) for value in args.rows.split(",")]:
            say(f"decode: {rows} rows at {context} tokens")
            times = {kind: layer.timed(kind, rows, 1, context - 1, args.reps) for kind in KINDS}
            read = 2 * rows * context * head_bytes
            versus = layer.against_baseline(rows, 1, context - 1, args.reps) if args.baseline else {}
            read4 = read * (shape.head_size // 2 + 4) // shape.head_size
            report["decode"].append({"context": context, "rows": rows, **_ms(times), **versus,
                                     "ours_gbs": read / times["ours"] / 1e9,
                                     "share_of_bandwidth": read / times["ours"] / 1e9 / limits.read_gbs,
                                     "int4_share_of_bandwidth": read4 / times["ours_int4"] / 1e9 / limits.read_gbs})
    for past in [0, *contexts]:
        say(f"prompt: a chunk of {args.chunk} tokens on {past}")
        times = {kind: layer.timed(kind, 1, args.chunk, past, args.reps) for kind in KINDS}
        macs = 2 * args.chunk * (past + (args.chunk + 1) / 2) * shape.heads * shape.head_size
        versus = layer.against_baseline(1, args.chunk, past, args.reps) if args.baseline else {}
        report["prompt"].append({"past": past, "chunk": args.chunk, **_ms(times), **versus,
                                 "ours_gmacs": macs / times["ours"] / 1e9,
                                 "share_of_int8_peak": macs / times["ours"] / 1e9 / limits.int8_gmacs})
    return report


def _ms(times: dict[str, float]) -> dict[str, float]:
    return {f"{kind}_ms": seconds * 1e3 for kind, seconds in times.items()} | {
        "int8_over_ours": times["int8"] / times["ours"], "float32_over_ours": times["float32"] / times["ours"],
        "float32_over_ours_float32": times["float32"] / times["ours_float32"],
        "ours_int4_over_ours": times["ours_int4"] / times["ours"]}


def main(args: argparse.Namespace) -> int:
    emit(run(args), args.out)
    return 0
