"""``python -m phi_api bench loops``: how often open prompts run to the token limit in a repeating loop.

A weak model at a plain temperature can fall into a loop ("A moment to not know," again and again) until
``max_tokens``. Over a fixed set of 20 varied open prompts (``tests/data/open-prompts.json``: stories, poems,
lists, explanations), each with the same seeds, every configuration is served by its own real server, the
requests naming no sampling field but the seed: what a user of the server's defaults gets. A configuration is
``before`` (``GENERATION_CONFIG=off``: the server's own defaults), ``folder`` (the model folder's
``generation_config.json``), or a JSON object of sampling defaults (``SAMPLING_DEFAULTS``).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.common import emit, say
from phi_api.bench.server import Server

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "open-prompts.json"
CONFIGS: dict[str, dict[str, Any]] = {"before": {"GENERATION_CONFIG": "off"}, "folder": {}}
TAIL_CHARS = 600  # a loop is judged on the answer's end
MIN_PERIOD, MAX_PERIOD = 2, 200  # characters of the repeated piece


def looping(text: str, finish_reason: str) -> bool:
    """Whether an answer ran to its limit in a loop: it ended on ``length`` and its end repeats itself (the last
    piece of some length three times over, or its last 12 lines, digits aside, made of at most 3 distinct ones)."""
    if finish_reason != "length":
        return False
    tail = text[-TAIL_CHARS:]
    for period in range(MIN_PERIOD, min(MAX_PERIOD, len(tail) // 3) + 1):
        piece = tail[-period:]
        if tail.endswith(piece * 3):
            return True
    lines = [re.sub(r"\d+", "#", line.strip()) for line in text.splitlines() if line.strip()][-12:]
    return len(lines) == 12 and len(set(lines)) <= 3


def answer(url: str, model: str, prompt: str, seed: int, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}], "seed": seed,
            "max_tokens": max_tokens}
    reply = requests.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    text = choice["message"]["content"] or ""
    return {"prompt": prompt, "seed": seed, "finish_reason": choice["finish_reason"],
            "tokens": reply.json()["usage"]["completion_tokens"], "looping": looping(text, choice["finish_reason"]),
            "end": text[-120:]}


def measure(model_path: str, env: dict[str, Any], prompts: list[str], seeds: list[int], max_tokens: int,
            concurrency: int, log_dir: Path) -> dict[str, Any]:
    """One configuration's answers, on a server of its own."""
    server = Server(log_dir, **{"MODEL_PATH": model_path, "MODEL_ID": "bench", **env}).start()
    try:
        jobs = [(prompt, seed) for prompt in prompts for seed in seeds]
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(lambda job: answer(server.url, "bench", job[0], job[1], max_tokens), jobs))
        shown = requests.get(f"{server.url}/v1/models/bench", timeout=10).json().get("sampling_defaults")
    finally:
        server.stop()
    loops = sum(item["looping"] for item in answers)
    at_limit = sum(item["finish_reason"] == "length" for item in answers)
    return {"sampling_defaults": shown, "answers": len(answers), "looping": loops, "at_limit": at_limit,
            "looping_share": loops / len(answers), "mean_tokens": sum(a["tokens"] for a in answers) / len(answers),
            "detail": answers}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="the model folder")
    parser.add_argument("--config", action="append", default=[],
                        help="before, folder, or NAME=JSON (sampling defaults); repeatable (default: before, folder)")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="a JSON list of prompts")
    parser.add_argument("--seeds", default="1,2", help="the seeds every prompt is asked with")
    parser.add_argument("--max-tokens", type=int, default=1024, help="the limit (the server's DEFAULT_MAX_TOKENS)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once (answers do not depend on it)")
    parser.add_argument("--out", default="bench/results/bench-loops.json", help="the JSON report")


def configurations(named: list[str]) -> dict[str, dict[str, Any]]:
    chosen = {}
    for item in named or list(CONFIGS):
        name, _, defaults = item.partition("=")
        chosen[name] = CONFIGS[name] if not defaults else {"GENERATION_CONFIG": "off", "SAMPLING_DEFAULTS": defaults}
    return chosen


def main(args: argparse.Namespace) -> int:
    prompts = json.loads(args.prompts.read_text(encoding="utf-8"))
    seeds = [int(seed) for seed in args.seeds.split(",")]
    report: dict[str, Any] = {"prompts": len(prompts), "seeds": seeds, "max_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory() as log_dir:
        for name, env in configurations(args.config).items():
            result = measure(args.model_path, env, prompts, seeds, args.max_tokens, args.concurrency, Path(log_dir))
            report[name] = result
            say(f"{name}: {result['looping']} of {result['answers']} answers loop to the limit "
                f"({result['looping_share']:.0%}), {result['at_limit']} at the limit, "
                f"{result['mean_tokens']:.0f} tokens on average; defaults {result['sampling_defaults']}")
    emit(report, args.out)
    return 0
