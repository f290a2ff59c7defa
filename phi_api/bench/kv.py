"""``python -m phi_api bench kv``: what int8 keys and values cost in accuracy and give in memory, against float32.

The same held-out text (not the calibration text) is fed token by token to
the model twice, with float32 keys and values and with int8 ones, and at
every position the next token's log-probability under each is compared: the
model's own text, teacher-forced, so both see the same inputs throughout.
Reported: the mean, 95th percentile and largest absolute difference of the
log-probability of the actual next token, the mean KL divergence of the
int8 distribution from the float32 one, how often both pick the same most
likely token, and the tokens each holds per GB.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

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


def run(args: Any) -> dict[str, Any]:
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.settings import cache_root

    cache = cache_root() / "runtime"
    models = {dtype: LanguageModel(args.model_path, cache_dir=cache, kv_dtype=dtype) for dtype in ("float32", "int8")}
    ids = np.asarray(models["float32"].encode(HELD_OUT), dtype=np.int64)[:args.tokens]
    print(f"[bench-kv] {len(ids)} held-out tokens, teacher-forced, float32 then int8 keys and values", flush=True)
    logprobs = {}
    for dtype, model in models.items():
        started = time.perf_counter()
        logprobs[dtype] = teacher_forced(model, ids, args.threads)
        print(f"[bench-kv] {dtype}: {time.perf_counter() - started:.1f} s", flush=True)
    report = compare(logprobs["float32"], logprobs["int8"], ids[1:])
    report["tokens"] = len(ids)
    report["tokens_per_gb"] = {dtype: int(2**30 // model.spec.kv_bytes_per_token) for dtype, model in models.items()}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def teacher_forced(model: Any, ids: np.ndarray, threads: int) -> np.ndarray:
    """Log-probabilities of the whole vocabulary before each token of ``ids`` after the first: ``[len - 1, vocab]``."""
    from phi_api.engine.runtime.pool import KVPool

    decoder = model.new_decoder(threads)
    pool = KVPool(decoder.spec, 1, len(ids))
    rows = []
    try:
        for position in range(len(ids) - 1):
            logits = decoder.step(pool, 0, ids[None, position:position + 1], np.array([position]), False)
            row = logits[0].astype(np.float64)
            row -= row.max()
            rows.append(row - np.log(np.exp(row).sum()))
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
        "mean_logprob": {"float32": round(float(reference[picked, targets].mean()), 4),
                         "int8": round(float(other[picked, targets].mean()), 4)},
    }


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder")
    parser.add_argument("--tokens", type=int, default=1024, help="held-out tokens to teacher-force (at most)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    parser.add_argument("--out", help="also write the report to this JSON file")


def main(args: argparse.Namespace) -> int:
    args.threads = args.threads or os.cpu_count() or 1
    run(args)
    return 0
