"""``python -m phi_api bench turns``: what a request resumed from a kept prefix waits for its first token, this
tree's server beside another checkout's (``--baseline-repo``), in one run.

Each run, on each server in turn (the order alternating), as a key of its own (``cache_salt``): a document of about
``--words`` words and a question, cold; the same request again (its prompt is kept: the first token waits for what
the server computes again of it); then the conversation's next turn (the answer and a new question appended).
Greedy, 8 tokens, streamed, one worker each. Medians over the runs, and the cached tokens each request reported.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from phi_api.bench.client import StreamResult, stream_completion
from phi_api.bench.common import emit, median, say
from phi_api.bench.server import REPO, Server

MODEL_ID = "bench-model"
CASES = ("cold", "again", "next_turn")
SENTENCE = ("The committee reviewed the quarterly figures for the northern depots, noting that freight volumes rose "
            "while handling costs fell slightly after the new scheduling rules. ")


def conversation(server: Server, run: int, words: int) -> dict[str, Any]:
    """One key's three requests: first-token seconds and cached tokens of each."""
    salt = uuid.uuid4().hex
    document = SENTENCE * max(1, words // 25) + f"(Ledger {run}.)"
    messages: list[dict[str, Any]] = [{"role": "user", "content": document + " Summarise this in one line."}]
    results: dict[str, StreamResult] = {}
    for case in CASES:
        if case == "next_turn":
            messages = [*messages, {"role": "assistant", "content": results["cold"].text},
                        {"role": "user", "content": "Now name the depots, please, in a list."}]
        results[case] = stream_completion(server.url, {"model": MODEL_ID, "messages": messages, "max_tokens": 8,
                                                       "temperature": 0, "cache_salt": salt},
                                          path="/v1/chat/completions")
    return {case: {"ttft": result.ttft, "cached_tokens": result.cached_tokens, "prompt_tokens": result.prompt_tokens}
            for case, result in results.items()}


def measure(model_path: str, baseline: Path, runs: int, words: int) -> dict[str, Any]:
    # the baseline's own kernel library (its sources may differ from this tree's)
    subprocess.run([sys.executable, "-m", "phi_api", "build-kernel"], cwd=baseline, check=True,
                   env={**os.environ, "PYTHONPATH": str(baseline)})
    seen: dict[str, list[dict[str, Any]]] = {"ours": [], "baseline": []}
    with tempfile.TemporaryDirectory() as logs:
        common: dict[str, Any] = {"MODEL_PATH": model_path, "MODEL_ID": MODEL_ID, "WEB_CONCURRENCY": 1}
        servers = {"ours": Server(Path(logs), **common).start(),
                   "baseline": Server(Path(logs), repo=baseline, **common).start()}
        try:
            for server in servers.values():
                conversation(server, -1, words)  # warm-up
            for run in range(runs):
                for name in (("ours", "baseline") if run % 2 == 0 else ("baseline", "ours")):
                    seen[name].append(conversation(servers[name], run, words))
                say(f"run {run + 1}/{runs}: " + ", ".join(
                    f"{name} " + " ".join(f"{case} {seen[name][-1][case]['ttft']:.3f}s" for case in CASES)
                    for name in seen))
        finally:
            for server in servers.values():
                server.stop()
    return {"words": words, "runs": runs, "baseline_repo": str(baseline),
            **{name: {case: {"ttft_s": median([one[case]["ttft"] for one in results]),
                             "cached_tokens": [one[case]["cached_tokens"] for one in results],
                             "prompt_tokens": [one[case]["prompt_tokens"] for one in results]} for case in CASES}
               for name, results in seen.items()}}


def table(report: dict[str, Any]) -> str:
    rows = ["| request | ours: first token | baseline | ours / baseline | cached tokens (ours / baseline) |",
            "|---|---|---|---|---|"]
    for case in CASES:
        ours, base = report["ours"][case], report["baseline"][case]
        rows.append(f"| {case} | {ours['ttft_s']:.3f} s | {base['ttft_s']:.3f} s | "
                    f"{ours['ttft_s'] / base['ttft_s']:.2f}x | {ours['cached_tokens'][0]} / {base['cached_tokens'][0]}"
                    f" of {ours['prompt_tokens'][0]} |")
    return "\n".join(rows)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="the model folder both servers serve")
    parser.add_argument("--baseline-repo", type=Path, required=True,
                        help="another checkout of phi-api (a clone at an earlier commit) whose server is compared")
    parser.add_argument("--runs", type=int, default=4, help="conversations per server (medians are reported)")
    parser.add_argument("--words", type=int, default=220, help="words of each conversation's document")
    parser.add_argument("--out", default="bench/results/bench-turns.json", help="the JSON report")


def main(args: argparse.Namespace) -> int:
    baseline = args.baseline_repo.resolve()
    if baseline == REPO:
        raise SystemExit("--baseline-repo is this checkout: give another one (git clone, then git checkout)")
    report = measure(args.model_path, baseline, args.runs, args.words)
    emit(report, args.out)
    print(table(report))
    return 0
