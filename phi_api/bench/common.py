"""What the benchmarks share: their prompts, progress lines, medians, and the servers they measure."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import requests

PROMPT = (
    "The history of computing is a story of people trying to make machines that think faster than they do. "
    "From the abacus to the mechanical calculators of the seventeenth century, from punched cards to vacuum "
    "tubes and transistors, each step made calculation cheaper and more widely available. Write a long essay "
    "about this history, with one paragraph for each major era, and explain why each change mattered."
)
SHORT_PROMPT = "Hello! How are you today?"
LONG_PROMPT = " ".join([PROMPT] * 4)  # about 300 tokens
PREFILLING_PROMPT = " ".join([PROMPT] * 12)  # about 900 tokens: seconds of prefill at Phi-3.5-mini's size


def emit(report: dict[str, Any], out: str = "") -> None:
    """Print a report as JSON, and write it to ``out`` too when given."""
    import json
    from pathlib import Path

    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")


def say(message: str) -> None:
    """Progress, on stderr, as the run goes (a whole run takes many minutes)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@dataclass
class Target:
    """A server under test."""

    name: str
    url: str
    model: str
    other: bool = False  # another server, which may not know phi-api's ``ignore_eos``
    results: dict[str, Any] = field(default_factory=dict)

    def full_length(self, max_tokens: int) -> dict[str, Any]:
        """Body fields that make a completion run to ``max_tokens`` whatever the model would say.

        vLLM and phi-api know ``ignore_eos``; llama-cpp-python knows ``min_tokens``
        instead (and ignores fields it does not know).
        """
        return {"ignore_eos": True, "min_tokens": max_tokens} if self.other else {"ignore_eos": True}


def first_model(url: str) -> str:
    """The first model id a server lists."""
    return requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def completion_body(target: Target, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": target.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **target.full_length(max_tokens)}


def needs_server(args: argparse.Namespace, command: str) -> bool:
    """Whether ``command`` was given a server to measure (``--url``) or a model folder to start one on."""
    if not args.url and not args.model_path:
        print(f"{command} needs --url or --model-path", file=sys.stderr)
        return False
    return True


def add_stream_args(parser: argparse.ArgumentParser) -> None:
    """What the benchmarks of concurrent streams take (bench-replicas, bench-cpu)."""
    parser.add_argument("--model-path", required=True, help="model folder the servers serve")
    parser.add_argument("--runs", type=int, default=3, help="measured runs (medians are reported)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per streamed completion")
