"""``python -m phi_api bench kv``: what int8 and int4 keys and values cost in accuracy and give in memory, against
float32.

The same held-out text (not the calibration text) is fed to each build of the
model (float32 keys and values; int8 ones with ONNX Runtime's attention; int8
and int4 ones with phi-api's attention operator, where it runs), token by token and
then in prompt chunks, and at every position the next token's
log-probability under each is compared with float32's: the model's own text,
teacher-forced, so every build sees the same inputs throughout.
Reported: the mean, 95th percentile and largest absolute difference of the
log-probability of the actual next token, the mean KL divergence of the
other distribution from the float32 one, how often both pick the same most
likely token, the perplexity of each, and the tokens each holds per GB.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from phi_api.bench.common import emit

HELD_OUT = (
    "The museum reopened on a rainy Tuesday. Visitors queued under umbrellas while the curator, a tall woman with "
    "a grey scarf, explained that the new wing held maps from the sixteenth century, a collection of ship models, "
    "and a room of instruments once used to measure the stars. Children pressed their faces to the glass; a "
    "retired sailor told anyone who would listen how he had crossed the Atlantic in nineteen days.\n\n"
    "To install the package, create a virtual environment, activate it, and run the installer with the "
    "requirements file. If the build fails, check that the compiler is on your PATH and that the headers match "
    "your Python version. Errors about missing symbols usually mean an old cached wheel: clear the cache and "
    "try again.\n\n"
    "for (let i = 0; i < rows.length; i++) {\n  const total = rows[i].price * rows[i].quantity;\n"
    "  if (total > limit) { flagged.push(rows[i].id); }\n}\nconsole.log(`${flagged.length} orders over the limit`);\n\n"
    "Question: A train leaves at 9:40 and arrives at 13:05. How long is the journey? Answer: 3 hours and 25 "
    "minutes. Question: What is 17 times 23? Answer: 391. Question: Name three prime numbers above 50. Answer: "
    "53, 59 and 61.\n\n"
    "Die Bibliothek schließt heute früher. La réunion est reportée à jeudi. Il concerto inizia alle nove.\n\n"
    "In summary, the committee recommends three changes: publish the budget every quarter, invite residents to "
    "the planning meetings, and review the transport contract before it is renewed next spring."
)


def builds(model_path: str) -> dict[str, Any]:
    """The builds compared: float32 keys and values, int8 ones with ONNX Runtime's attention, and int8 and int4 ones
    with phi-api's attention operator where it runs here."""
    from phi_api.engine.kernels.op import find_library
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.settings import cache_root

    cache = cache_root() / "runtime"
    found = {"float32": LanguageModel(model_path, cache_dir=cache, kv_dtype="float32"),
             "int8": LanguageModel(model_path, cache_dir=cache, kv_dtype="int8", attention_kernel="onnxruntime")}
    if find_library(cache)[0] is not None:
        for kind in ("int8", "int4"):
            found[f"{kind}, phi-api attention"] = LanguageModel(model_path, cache_dir=cache, kv_dtype=kind,
                                                                attention_kernel="phi-api")
    return found


def run(args: Any) -> dict[str, Any]:
    models = builds(args.model_path)
    ids = np.asarray(models["float32"].encode(HELD_OUT), dtype=np.int64)[:args.tokens]
    report: dict[str, Any] = {"tokens": len(ids)}
    for chunk, mode in ((1, "decode steps"), (args.chunk, f"prompt chunks of {args.chunk}")):
        print(f"[bench-kv] {len(ids)} held-out tokens, teacher-forced in {mode}", flush=True)
        logprobs = {}
        for name, model in models.items():
            started = time.perf_counter()
            logprobs[name] = teacher_forced(model, ids, args.threads, chunk)
            print(f"[bench-kv] {name}: {time.perf_counter() - started:.1f} s", flush=True)
        report[mode] = {name: compare(logprobs["float32"], found, ids[1:]) for name, found in logprobs.items()
                        if name != "float32"}
    report["tokens_per_gb"] = {name: int(2**30 // model.spec.kv_bytes_per_token) for name, model in models.items()}
    emit(report, args.out)
    return report


def teacher_forced(model: Any, ids: np.ndarray, threads: int, chunk: int = 1) -> np.ndarray:
    """Log-probabilities of the whole vocabulary before each token of ``ids`` after the first: ``[len - 1, vocab]``;
    the tokens go in one at a time (``chunk`` 1: decode steps) or as prompt chunks of ``chunk``."""
    from phi_api.engine.runtime.pool import KVPool

    decoder = model.new_decoder(threads)
    pool = KVPool(decoder.spec, 1, len(ids))
    rows = []
    try:
        for start in range(0, len(ids) - 1, chunk):
            piece = ids[None, start:min(start + chunk, len(ids) - 1)]
            if piece.shape[1] == 1:
                logits = decoder.step(pool, 0, piece, np.array([start]), False)
            else:
                logits = decoder.step(pool, 0, piece, np.array([start]), True, every_position=True)[0]
            for row in np.atleast_2d(logits).astype(np.float64):
                shifted = row - row.max()
                rows.append(shifted - np.log(np.exp(shifted).sum()))
    finally:
        decoder.unbind()
        pool.close()
    return np.array(rows)


def compare(reference: np.ndarray, other: np.ndarray, targets: np.ndarray) -> dict[str, Any]:
    """Differences of ``other``'s log-probabilities from ``reference``'s (``[positions, vocab]`` each)."""
    picked = np.arange(len(targets))
    delta = np.abs(reference[picked, targets] - other[picked, targets])
    kl = (np.exp(reference) * (reference - other)).sum(axis=1)
    return {
        "mean_abs_logprob_difference": round(float(delta.mean()), 4),
        "p95_abs_logprob_difference": round(float(np.percentile(delta, 95)), 4),
        "max_abs_logprob_difference": round(float(delta.max()), 4),
        "mean_kl_divergence": round(float(kl.mean()), 5),
        "top1_agreement": round(float((reference.argmax(axis=1) == other.argmax(axis=1)).mean()), 4),
        "mean_logprob": round(float(other[picked, targets].mean()), 4),
        "float32_mean_logprob": round(float(reference[picked, targets].mean()), 4),
        "perplexity": round(float(np.exp(-other[picked, targets].mean())), 3),
        "float32_perplexity": round(float(np.exp(-reference[picked, targets].mean())), 3),
    }


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder")
    parser.add_argument("--tokens", type=int, default=1024, help="held-out tokens to teacher-force (at most)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    parser.add_argument("--chunk", type=int, default=64, help="tokens of a prompt chunk (the second pass)")
    parser.add_argument("--out", help="also write the report to this JSON file")


def main(args: argparse.Namespace) -> int:
    args.threads = args.threads or os.cpu_count() or 1
    run(args)
    return 0
