"""``python -m phi_api bench database``: what PostgreSQL (``DATABASE_URL``) adds to a request with a key, against
SQLite in the data folder.

Two servers side by side, one on each, the same keys file (a key with limits: its admission reads and writes its
counts, its tokens are recorded when it ends); the same small completions sent to each in turn, one at a time, so
that both see the same machine at the same moment. PostgreSQL is a throwaway cluster on this machine (loopback).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.common import median, percentile, say
from phi_api.bench.postgres import Postgres
from phi_api.bench.server import Server

KEY = {"name": "bench", "key": "sk-bench-database", "requests_per_minute": 1_000_000, "tokens_per_day": 10**12}


def _latencies(servers: dict[str, Server], requests_each: int) -> dict[str, list[float]]:
    taken: dict[str, list[float]] = {name: [] for name in servers}
    body: dict[str, Any] = {"model": "bench-model", "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {KEY['key']}"}
    for _ in range(requests_each):
        for name, server in servers.items():
            start = time.perf_counter()
            answer = requests.post(server.url + "/v1/completions", json=body, headers=headers, timeout=60)
            taken[name].append(time.perf_counter() - start)
            answer.raise_for_status()
    return taken


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="phi-api-bench-database-"))
    keys = folder / "keys.json"
    keys.write_text(json.dumps({"keys": [KEY]}))
    common = {"MODEL_PATH": args.model_path, "MODEL_ID": "bench-model", "WEB_CONCURRENCY": 1, "API_KEYS_FILE": keys}
    with Postgres() as postgres, Server(folder, **common) as sqlite, \
            Server(folder, DATABASE_URL=postgres.url, **common) as shared:
        servers = {"sqlite": sqlite, "postgresql": shared}
        _latencies(servers, 10)  # warm: connections made, tables created, the model's first steps done
        say(f"{args.requests} requests with a key to each, in turn")
        taken = _latencies(servers, args.requests)
    report: dict[str, Any] = {name: {"p50_ms": median(values) * 1000, "p95_ms": percentile(values, 0.95) * 1000}
                              for name, values in taken.items()}
    report["added_ms"] = {figure: report["postgresql"][figure] - report["sqlite"][figure]
                          for figure in ("p50_ms", "p95_ms")}
    print(json.dumps(report, indent=1))
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder the servers serve")
    parser.add_argument("--requests", type=int, default=200, help="requests sent to each server")


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
