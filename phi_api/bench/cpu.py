"""``python -m phi_api bench cpu``: where the CPU goes while concurrent streams run.

Starts phi-api (one worker, default settings) and, for each run of ``--streams`` concurrent streaming
completions, reads every thread's CPU time from ``/proc`` before and after: the worker's engine threads
(named ``phi-api engine``; ONNX Runtime's pool threads inherit the name), the worker's other threads
(the gevent hub), the master, and this client process. Linux only.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from phi_api.bench.client import concurrent_streams
from phi_api.bench.common import add_stream_args
from phi_api.bench.server import Server, threads
from phi_api.engine.threads.native import ENGINE_THREAD_NAME

MODEL_ID = "bench-model"
PROMPT = "Write a long story about a robot who learns to paint, with many characters and places."


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user and system) of ``pid``'s threads, summed per thread name."""
    totals: dict[str, float] = {}
    for name, seconds in threads(pid):
        totals[name] = totals.get(name, 0.0) + seconds
    return totals


def _client_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(server: Server, streams: int, max_tokens: int) -> dict[str, Any]:
    """One run: the decode rate, and each part's CPU seconds per wall second."""
    worker, master = server.worker_pids()[0], server.master.pid
    before = (thread_seconds(worker), thread_seconds(master), _client_seconds(), time.monotonic())
    body = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
    result = concurrent_streams(server.url, body, streams)
    after = (thread_seconds(worker), thread_seconds(master), _client_seconds(), time.monotonic())
    wall = after[3] - before[3]
    engine = sum(seconds - before[0].get(name, 0.0) for name, seconds in after[0].items()
                 if name == ENGINE_THREAD_NAME.decode())
    worker_total = sum(after[0].values()) - sum(before[0].values())
    return {"decode_tokens_per_s": result.decode_rate, "engine_threads": engine / wall,
            "worker_other_threads": (worker_total - engine) / wall,
            "master": (sum(after[1].values()) - sum(before[1].values())) / wall,
            "client": (after[2] - before[2]) / wall}


def run(args: Any) -> dict[str, Any]:
    """Warm up, then ``args.runs`` measured runs; prints each and the medians."""
    with tempfile.TemporaryDirectory(prefix="phi-api-bench-cpu-") as logs, \
            Server(Path(logs), MODEL_PATH=args.model_path, MODEL_ID=MODEL_ID) as server:
        measure(server, args.streams, args.max_tokens)
        runs = []
        for index in range(args.runs):
            runs.append(measure(server, args.streams, args.max_tokens))
            print(f"run {index + 1}: " + ", ".join(f"{key} {value:.2f}" for key, value in runs[-1].items()),
                  flush=True)
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"medians ({args.streams} streams; CPU as cores busy): "
          + ", ".join(f"{key} {value:.2f}" for key, value in medians.items()))
    return medians


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_stream_args(parser)


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
