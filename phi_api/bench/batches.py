"""``python -m phi_api bench batch``: a live request's first token while a batch runs, in one run.

One server, one worker (so that every request meets the same engine), ``BATCH_CONCURRENCY`` 2. A short chat
request's first-token time (medians over ``--runs``):

- on an idle server;
- while a batch runs (lines of a ~300-token prompt and a long answer: prompts to prefill and answers to decode
  all the time);
- while two live requests of the same kind run instead (what the same load costs without priorities: the
  head-of-line figure of ``make bench``).

Also the batch's own throughput: its lines per minute with nobody else asking.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.client import stream_completion, unique
from phi_api.bench.common import LONG_PROMPT, SHORT_PROMPT, median, say
from phi_api.bench.server import Server

MODEL_ID = "bench-model"
CHAT = "/v1/chat/completions"


def _short() -> dict[str, Any]:
    return unique({"model": MODEL_ID, "max_tokens": 4, "temperature": 0,
                   "messages": [{"role": "user", "content": SHORT_PROMPT}]})


def _long(index: int, answer: int) -> dict[str, Any]:
    return {"model": MODEL_ID, "max_tokens": answer, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{index}. {LONG_PROMPT}"}]}


def _start_batch(url: str, lines: int, answer: int) -> str:
    data = "".join(json.dumps({"custom_id": f"l{index}", "method": "POST", "url": CHAT,
                               "body": _long(index, answer)}) + "\n" for index in range(lines))
    uploaded = requests.post(url + "/v1/files", data={"purpose": "batch"},
                             files={"file": ("lines.jsonl", io.BytesIO(data.encode()))}, timeout=60).json()
    batch = requests.post(url + "/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": CHAT,
                                                     "completion_window": "24h"}, timeout=60).json()
    return str(batch["id"])


def _batch(url: str, batch_id: str) -> dict[str, Any]:
    return dict(requests.get(f"{url}/v1/batches/{batch_id}", timeout=60).json())


def _while_live_requests(url: str, runs: int, answer: int) -> list[float]:
    """Short requests' first tokens while two live long requests run all the time."""
    stop = threading.Event()

    def keep_busy(worker: int) -> None:
        index = 0
        while not stop.is_set():
            stream_completion(url, _long(1000 * worker + index, answer), path=CHAT)
            index += 1

    threads = [threading.Thread(target=keep_busy, args=(worker,)) for worker in (1, 2)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)  # both are prefilling or decoding by now
    try:
        return [stream_completion(url, _short(), path=CHAT).ttft for _ in range(runs)]
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def run(options: Any) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="phi-api-bench-batch-"))
    report: dict[str, Any] = {"settings": {"runs": options.runs, "lines": options.lines,
                                           "answer_tokens": options.answer_tokens},
                              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    with Server(log_dir, MODEL_PATH=options.model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, BATCH_CONCURRENCY=2,
                BATCH_DIR=log_dir / "batches") as server:
        say("idle")
        idle = [stream_completion(server.url, _short(), path=CHAT).ttft for _ in range(options.runs)]
        say(f"while a batch of {options.lines} lines runs")
        batch_id = _start_batch(server.url, options.lines, options.answer_tokens)
        started = time.monotonic()
        while _batch(server.url, batch_id)["status"] != "in_progress":
            time.sleep(0.1)
        time.sleep(2.0)
        during = []
        for _ in range(options.runs):
            if _batch(server.url, batch_id)["status"] != "in_progress":
                break
            during.append(stream_completion(server.url, _short(), path=CHAT).ttft)
            time.sleep(0.5)
        while _batch(server.url, batch_id)["status"] == "in_progress":
            time.sleep(0.5)
        done = _batch(server.url, batch_id)
        lines_per_minute = done["request_counts"]["completed"] / ((time.monotonic() - started) / 60)
        say("while two live requests of the same kind run")
        live = _while_live_requests(server.url, options.runs, options.answer_tokens)
    report.update({
        "idle_ttft_s": median(idle), "batch_ttft_s": median(during), "live_ttft_s": median(live),
        "batch_ratio": median(during) / median(idle), "live_ratio": median(live) / median(idle),
        "measured_during_batch": len(during), "batch_status": done["status"],
        "batch_lines_per_minute": lines_per_minute,
    })
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-batch.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder the server serves")
    parser.add_argument("--runs", type=int, default=5, help="short requests per measurement (medians are reported)")
    parser.add_argument("--lines", type=int, default=40, help="lines of the batch")
    parser.add_argument("--answer-tokens", type=int, default=64, help="each line's answer length")
    parser.add_argument("--out", default="bench/results", help="folder for bench-batch.json")


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
