"""``python -m phi_api bench quality``: what a model build keeps of its source's quality, and its decode speed.

A fixed English text (``tests/data/quality-text.txt``: the GNU GPL version 3,
which may be copied verbatim) is fed to each build in prompt chunks, and at
every position the log-probability of the text's next token is read. Reported
per build: the perplexity over those tokens, its ratio to the float32
reference build of the same source, the share of positions whose most likely
token is the reference's (top-1 agreement), the share of a dozen simple chat
questions whose greedy answer (its first tokens) is the reference's, and the
decode speed of one row
(our own decoder, one token a step). Builds are measured side by side in one
run: speeds are medians of ``--runs`` alternating runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "quality-text.txt"
CHUNK = 256  # prompt tokens per step: the positions' logits come from prefill, as a prompt's do
DECODE_STEPS = 64
ANSWER_TOKENS = 24
# Simple questions whose greedy answers a build should give as the float32 build does (the answers are not read).
QUESTIONS = (
    "What is the capital of France?", "What are the primary colors?", "At what temperature does water boil?",
    "How many days are in a leap year?", "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?", "Translate 'good morning' into Spanish.", "What is 12 times 12?",
    "Name a mammal that can fly.",
    "What gas do plants absorb from the air?", "Write a haiku about autumn.", "What does a thermometer measure?",
)


@dataclass(frozen=True)
class Quality:
    """One build's figures against the reference."""

    perplexity: float
    perplexity_ratio: float
    top1_agreement: float

    def within(self, ratio: float, agreement: float) -> bool:
        return self.perplexity_ratio <= ratio and self.top1_agreement >= agreement


def read_ids(model: Any, text_file: Path, tokens: int) -> np.ndarray:
    """The first ``tokens`` token ids of the text."""
    return np.asarray(model.encode(text_file.read_text(encoding="utf-8")), dtype=np.int64)[:tokens]


def position_logprobs(model: Any, ids: np.ndarray, threads: int) -> np.ndarray:
    """Log-probabilities of the vocabulary after each token of ``ids`` but the last: ``[len - 1, vocab]``."""
    from phi_api.engine.runtime.pool import KVPool

    decoder = model.new_decoder(threads)
    pool = KVPool(decoder.spec, 1, len(ids))
    pieces = []
    try:
        for start in range(0, len(ids) - 1, CHUNK):
            end = min(start + CHUNK, len(ids) - 1)
            chunk = ids[None, start:end]
            logits = decoder.step(pool, 0, chunk, np.array([start]), True, every_position=True)[0]
            pieces.append(_log_softmax(np.asarray(logits[:end - start], dtype=np.float64)))
    finally:
        decoder.unbind()
        pool.close()
    return np.concatenate(pieces)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def perplexity(logprobs: np.ndarray, ids: np.ndarray) -> float:
    """exp of the mean negative log-probability of each next token."""
    targets = ids[1:len(logprobs) + 1]
    return math.exp(-float(logprobs[np.arange(len(targets)), targets].mean()))


def compare(reference: np.ndarray, build: np.ndarray, ids: np.ndarray) -> Quality:
    """``build``'s quality against ``reference``'s (log-probabilities of the same positions)."""
    base, own = perplexity(reference, ids), perplexity(build, ids)
    agreement = float((reference.argmax(axis=1) == build.argmax(axis=1)).mean())
    return Quality(round(own, 3), round(own / base, 4), round(agreement, 4))


def greedy_answer(model: Any, question: str, threads: int, tokens: int = ANSWER_TOKENS) -> list[int]:
    """The first ``tokens`` token ids of the greedy answer to ``question`` (a one-message chat)."""
    from phi_api.engine.runtime.pool import KVPool

    prompt = np.asarray(model.encode(model.render_chat([{"role": "user", "content": question}])), dtype=np.int64)
    decoder = model.new_decoder(threads)
    pool = KVPool(decoder.spec, 1, len(prompt) + tokens + 1)
    answer: list[int] = []
    try:
        logits = decoder.step(pool, 0, prompt[None, :], np.array([0]), True)
        for position in range(len(prompt), len(prompt) + tokens):
            answer.append(int(np.argmax(logits[0])))
            if answer[-1] in model.info.eos_token_ids:
                break
            logits = decoder.step(pool, 0, np.array([[answer[-1]]]), np.array([position]), False)
        return answer
    finally:
        decoder.unbind()
        pool.close()


def answer_agreement(reference: list[list[int]], build: list[list[int]]) -> float:
    """The share of the questions whose greedy answer is the reference's, token for token."""
    return sum(ours == theirs for ours, theirs in zip(build, reference, strict=True)) / len(reference)


def decode_rate(model: Any, ids: np.ndarray, threads: int, steps: int = DECODE_STEPS) -> float:
    """Tokens per second of one row decoding ``steps`` tokens (teacher-forced from ``ids``) after a short prompt."""
    from phi_api.engine.runtime.pool import KVPool

    decoder = model.new_decoder(threads)
    prompt = 16
    pool = KVPool(decoder.spec, 1, prompt + steps + 1)
    try:
        decoder.step(pool, 0, ids[None, :prompt], np.array([0]), True)
        started = time.perf_counter()
        for position in range(prompt, prompt + steps):
            decoder.step(pool, 0, ids[None, position:position + 1], np.array([position]), False)
        return steps / (time.perf_counter() - started)
    finally:
        decoder.unbind()
        pool.close()


def measure(builds: dict[str, Any], reference: str, ids: np.ndarray, threads: int, runs: int) -> dict[str, Any]:
    """Every build's quality against ``reference``'s, and every build's decode speed (medians of ``runs``)."""
    logprobs = {name: position_logprobs(model, ids, threads) for name, model in builds.items()}
    answers = {name: [greedy_answer(model, question, threads) for question in QUESTIONS]
               for name, model in builds.items()}
    rates: dict[str, list[float]] = {name: [] for name in builds}
    for _ in range(runs):  # alternating, so that a busy moment of the machine touches every build alike
        for name, model in builds.items():
            rates[name].append(decode_rate(model, ids, threads))
    report: dict[str, Any] = {}
    for name in builds:
        quality = compare(logprobs[reference], logprobs[name], ids)
        report[name] = {**quality.__dict__,
                        "greedy_answers_as_float32": round(answer_agreement(answers[reference], answers[name]), 3),
                        "decode_tokens_per_second": round(statistics.median(rates[name]), 1)}
    return report


def run(args: Any) -> dict[str, Any]:
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.settings import cache_root

    threads = args.threads or os.cpu_count() or 1
    paths = {"served": args.model_path, "float32": args.reference_path}
    for item in args.compare or []:
        name, _, path = item.partition("=")
        paths[name] = path
    cache = cache_root() / "runtime"
    builds = {name: LanguageModel(path, cache_dir=cache, kv_dtype="float32") for name, path in paths.items()}
    if args.int4_kernels:  # the served build computed by each 4-bit kernel
        del builds["served"]
        for kernel in ("mlas", "phi-api"):
            builds[f"served, INT4_KERNEL={kernel}"] = LanguageModel(args.model_path, cache_dir=cache,
                                                                    kv_dtype="float32", int4_kernel=kernel)
    ids = read_ids(builds["float32"], Path(args.text), args.tokens)
    print(f"[bench-quality] {len(ids)} tokens of {args.text}, {threads} threads, {args.runs} decode runs",
          flush=True)
    report = {"tokens": len(ids), "threads": threads, "builds": measure(builds, "float32", ids, threads,
                                                                             args.runs)}
    print(render(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def render(report: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    lines = ["| build | perplexity | x float32 | top-1 agreement with float32 | greedy answers as float32's "
             f"(first {ANSWER_TOKENS} tokens, {len(QUESTIONS)} questions) | decode, one row (tok/s) |",
             "|---|---|---|---|---|---|"]
    for name, row in report["builds"].items():
        lines.append(f"| {name} | {row['perplexity']:.1f} | {row['perplexity_ratio']:.2f}x | "
                     f"{row['top1_agreement']:.2f} | {row['greedy_answers_as_float32']:.2f} | "
                     f"{row['decode_tokens_per_second']:.0f} |")
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="the served model folder")
    parser.add_argument("--reference-path", required=True, help="the float32 build (prepare-model --reference)")
    parser.add_argument("--compare", action="append", metavar="NAME=PATH", help="another build (repeatable)")
    parser.add_argument("--text", default=None, help="the fixed text (default: tests/data/quality-text.txt)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens of the text (default 1024)")
    parser.add_argument("--runs", type=int, default=5, help="alternating decode runs (medians are reported)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    parser.add_argument("--int4-kernels", action="store_true",
                        help="the served build with ONNX Runtime's 4-bit kernel and with phi-api's, side by side")
    parser.add_argument("--out", default="bench/results/bench-quality.json", help="the JSON report")


def main(args: argparse.Namespace) -> int:
    args.text = args.text or str(DEFAULT_TEXT)
    run(args)
    return 0
