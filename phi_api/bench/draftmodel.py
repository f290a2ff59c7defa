"""``python -m phi_api bench draft``: a draft model's own effect, against the same server without it.

Two servers of one worker each serve the model with speculation, the key's history off on both
(``SPECULATIVE_HISTORY_TOKENS=0``: the chat prompts repeat across runs, and what the history drafts would hide
the draft model's part), one of them with ``SPECULATIVE_DRAFT_MODEL``. Each of ``bench spec``'s chat and copying
prompts goes to both, in alternating order, with a prompt of its own each time; a case's figure is the median of
the paired decode rates' ratios (with the draft model over without: above 1, it helps), and the draft tokens
each source had checked and kept on the server with it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from phi_api.bench.client import stream_completion, unique
from phi_api.bench.common import emit, median, say
from phi_api.bench.server import Server
from phi_api.bench.speculative import CHAT, CHAT_PATH, CHAT_TOKENS, COPY_TOKENS, COPYING, MODEL_ID, by_source, chat_body

CASES = {"chat": (CHAT, CHAT_TOKENS), "copying": (COPYING, COPY_TOKENS)}


def measure(model_path: str, draft_path: str, runs: int) -> dict[str, Any]:
    report: dict[str, Any] = {"model_path": model_path, "draft_model_path": draft_path, "cases": {}}
    common: dict[str, Any] = {"MODEL_PATH": model_path, "MODEL_ID": MODEL_ID, "WEB_CONCURRENCY": 1,
                              "SPECULATIVE_HISTORY_TOKENS": 0}
    with tempfile.TemporaryDirectory() as logs, \
            Server(Path(logs), **common, SPECULATIVE_DRAFT_MODEL=draft_path) as with_draft, \
            Server(Path(logs), **common) as without:
        servers = {"draft": with_draft, "plain": without}
        for server in servers.values():  # the first request of a worker pays for warm-up
            stream_completion(server.url, unique(chat_body(CHAT["story"], 8)), path=CHAT_PATH)
        for case, (prompts, max_tokens) in CASES.items():
            before, ratios = by_source(with_draft), []
            for run in range(runs):
                for index, prompt in enumerate(prompts.values()):
                    body = unique(chat_body(prompt, max_tokens))
                    order = ("draft", "plain") if (run + index) % 2 == 0 else ("plain", "draft")
                    rates = {side: stream_completion(servers[side].url, body, path=CHAT_PATH).decode_rate
                             for side in order}
                    ratios.append((rates["draft"] or 0.0) / (rates["plain"] or 1.0))
                say(f"{case}, run {run + 1}/{runs}: with the draft model / without {ratios[-1]:.2f}x")
            after = by_source(with_draft)
            report["cases"][case] = {"ratio": median(ratios), "pairs": len(ratios),
                                     "by_source": {key: value - before.get(key, 0.0) for key, value in after.items()
                                                   if value - before.get(key, 0.0)}}
    return report


def table(report: dict[str, Any]) -> str:
    rows = ["| Case | With the draft model / without | Draft tokens kept of checked, by source |", "|---|---|---|"]
    for case, result in report["cases"].items():
        counts = result["by_source"]
        names = sorted({key.rsplit("_", 1)[0] for key in counts})
        kept = ", ".join(f"{name} {counts.get(name + '_kept', 0):.0f}/{counts.get(name + '_checked', 0):.0f}"
                         for name in names)
        rows.append(f"| {case} | {result['ratio']:.2f}x ({result['pairs']} pairs) | {kept or 'none'} |")
    return "\n".join(rows)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder both servers serve")
    parser.add_argument("--draft-model-path", required=True, help="its draft model (the same vocabulary)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians are reported)")
    parser.add_argument("--out", default="bench/results/bench-draft.json", help="the JSON report")


def main(args: argparse.Namespace) -> int:
    say(f"servers on {args.model_path}, with speculation, with and without {args.draft_model_path} as draft model")
    report = measure(args.model_path, args.draft_model_path, args.runs)
    emit(report, args.out)
    print(table(report))
    return 0
