"""``python -m phi_api bench tenants``: how long the gevent hub stalls while several keys share the server.

Three keys (one admin) send streamed chats and chains of stored Responses API responses, while a batch of the third
key runs; the workers measure how late their hub runs a timer due every 50 ms (``phi_api_hub_stall_seconds``). Its
SQLite work (keys' usage, stored responses, batches) runs off the hub: this is the figure that shows it.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.common import say
from phi_api.bench.server import Server

KEYS = {"team-a": "sk-bench-team-a", "team-b": "sk-bench-team-b", "ops": "sk-bench-ops-admin"}


def _keys_file(folder: Path) -> Path:
    path = folder / "keys.json"
    path.write_text(json.dumps({"keys": [{"name": name, "key": key, "admin": name == "ops"}
                                         for name, key in KEYS.items()]}))
    return path


def _as(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def _chats(url: str, model: str, name: str, until: float, done: list[int]) -> None:
    count = 0
    while time.monotonic() < until:
        body: dict[str, Any] = {"model": model, "max_tokens": 16, "stream": True, "temperature": 0,
                "messages": [{"role": "user", "content": f"Count to ten, {name}, round {count}."}]}
        with requests.post(url + "/v1/chat/completions", json=body, headers=_as(name), stream=True,
                           timeout=300) as answer:
            for _ in answer.iter_lines():
                pass
        count += 1
    done.append(count)


def _responses(url: str, model: str, name: str, until: float, done: list[int]) -> None:
    count, previous = 0, None
    while time.monotonic() < until:
        body: dict[str, Any] = {"model": model, "input": f"Say one word, {count}.", "max_output_tokens": 8}
        if previous is not None and count % 4:
            body["previous_response_id"] = previous
        answer = requests.post(url + "/v1/responses", json=body, headers=_as(name), timeout=300).json()
        previous = answer.get("id", previous)
        count += 1
    done.append(count)


def _batch(url: str, model: str, lines: int) -> None:
    data = b"".join(json.dumps({"custom_id": f"l{index}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": model, "max_tokens": 16, "temperature": 0,
                                         "messages": [{"role": "user", "content": f"Name a number above {index}."}]}
                                }).encode() + b"\n" for index in range(lines))
    uploaded = requests.post(url + "/v1/files", files={"file": ("lines.jsonl", io.BytesIO(data))},
                             data={"purpose": "batch"}, headers=_as("ops"), timeout=60).json()
    requests.post(url + "/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}, headers=_as("ops"), timeout=60)


def _stalls(url: str) -> dict[str, float]:
    text = requests.get(url + "/metrics", headers=_as("ops"), timeout=30).text
    longest = re.findall(r"^phi_api_hub_longest_stall_seconds(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    count = re.findall(r"^phi_api_hub_stall_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    over = re.findall(r'^phi_api_hub_stall_seconds_bucket\{le="0.01"\} (\S+)$', text, re.MULTILINE)
    total = sum(float(value) for value in count)
    return {"longest_s": max((float(value) for value in longest), default=0.0), "ticks": total,
            "share_over_10ms": 1 - sum(float(value) for value in over) / total if total else 0.0}


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="phi-api-bench-tenants-"))
    with Server(folder, MODEL_PATH=args.model_path, MODEL_ID="bench-model", WEB_CONCURRENCY=2,
                API_KEYS_FILE=_keys_file(folder), BATCH_CONCURRENCY=2, MAX_CONCURRENT_REQUESTS=16) as server:
        say("idle")
        time.sleep(args.seconds / 3)  # the baseline: what an idle worker's hub does
        idle = _stalls(server.url)
        say(f"{args.seconds} s of mixed load: streamed chats, chained stored responses, a batch")
        until = time.monotonic() + args.seconds
        done: dict[str, list[int]] = {"chats": [], "responses": []}
        workers = [threading.Thread(target=_chats, args=(server.url, "bench-model", name, until, done["chats"]))
                   for name in ("team-a", "team-b")]
        workers += [threading.Thread(target=_responses, args=(server.url, "bench-model", name, until,
                                                              done["responses"])) for name in ("team-a", "team-b")]
        _batch(server.url, "bench-model", args.lines)
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        loaded = _stalls(server.url)
    report = {"idle": idle, "loaded": loaded, "chats": sum(done["chats"]), "responses": sum(done["responses"])}
    print(json.dumps(report, indent=1))
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder the server serves")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the mixed load runs")
    parser.add_argument("--lines", type=int, default=20, help="lines of the batch that runs meanwhile")


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
