"""``python -m phi_api bench replicas``: phi-api replicas behind nginx (deploy/nginx/phi-api.conf, as
shipped, ports substituted) against one replica alone, and what cache affinity buys a conversation."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.client import concurrent_streams, stream_completion
from phi_api.bench.common import add_stream_args
from phi_api.bench.server import REPO, Server, free_port, poll
from phi_api.errors import ServerError

SHIPPED_SITE = REPO / "deploy" / "nginx" / "phi-api.conf"
SHIPPED_REPLICA_PORTS = ("8001", "8002")


def nginx_binary() -> str | None:
    """nginx, if it is installed."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


class Nginx:
    """``nginx -p PREFIX`` serving the shipped site, its upstream pointing at ``replicas``."""

    def __init__(self, prefix: Path, replicas: list[Server]) -> None:
        binary = nginx_binary()
        if binary is None:
            raise ServerError("nginx is not installed (Debian: apt-get install nginx)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.prefix = prefix
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "phi-api.conf").write_text(self.site(replicas))
        user = "user root;\n" if os.geteuid() == 0 else ""  # as root, workers would run as nobody
        temp = "\n".join(f"    {kind}_temp_path {prefix / kind};" for kind in
                         ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (prefix / "nginx.conf").write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {prefix / 'nginx.pid'};\n"
            f"error_log {prefix / 'error.log'} info;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n    access_log {prefix / 'access.log'};\n{temp}\n    include {prefix / 'phi-api.conf'};\n}}\n")
        self.process = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"),
                                         "-e", str(prefix / "error.log")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        poll(self._listening, timeout=20, message=f"nginx on {self.url}")

    def site(self, replicas: list[Server]) -> str:
        """The shipped site, with these replicas and this port (exactly two replicas, as shipped)."""
        site = SHIPPED_SITE.read_text()
        for shipped, replica in zip(SHIPPED_REPLICA_PORTS, replicas, strict=True):
            site = site.replace(f"127.0.0.1:{shipped}", f"127.0.0.1:{replica.port}")
        return site.replace("listen 8080;", f"listen 127.0.0.1:{self.port};")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            raise ServerError(f"nginx exited: {(self.prefix / 'error.log').read_text()}")
        try:
            return requests.get(self.url + "/health", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self) -> None:
        """Stop gracefully (SIGQUIT), or kill after 15 s."""
        self.process.send_signal(signal.SIGQUIT)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _conversation_turns(url: str, model: str, session: str | None) -> tuple[float, int]:
    """A long conversation's second turn through ``url``: its time to first token and reused tokens."""
    tag = uuid.uuid4().hex[:8]
    notes = " ".join(f"Note {tag}.{i}: item {i} costs {i * 7} coins." for i in range(50))
    messages = [{"role": "system", "content": "You are a careful bookkeeper. " + notes},
                {"role": "user", "content": "What does item 12 cost?"}]
    http = requests.Session()
    if session:
        http.headers["X-Session-Id"] = session
    body = {"model": model, "max_tokens": 16, "temperature": 0}
    first = stream_completion(url, {**body, "messages": messages}, http, "/v1/chat/completions")
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And item 40?"}]
    second = stream_completion(url, {**body, "messages": messages}, http, "/v1/chat/completions")
    return second.ttft, second.cached_tokens or 0


def run(options: Any) -> dict[str, Any]:
    """Measure and print: aggregate decode rate through nginx and two replicas against one replica alone, and
    a conversation's second turn with and without cache affinity."""
    model, runs = "bench-model", options.runs
    log_dir = Path(tempfile.mkdtemp(prefix="phi-api-replicas-"))
    cores = os.cpu_count() or 1
    common = dict(MODEL_PATH=options.model_path, MODEL_ID=model, WEB_CONCURRENCY=1, MAX_CONCURRENT_REQUESTS=32)
    body = {"model": model, "prompt": "Write a long essay about the history of computing.",
            "max_tokens": options.max_tokens, "temperature": 0, "ignore_eos": True}
    report: dict[str, Any] = {"cores": cores, "streams": options.streams, "runs": runs}
    with Server(log_dir, **common, INTRA_OP_THREADS=max(1, cores // 2)) as first, \
            Server(log_dir, **common, INTRA_OP_THREADS=max(1, cores // 2)) as second, \
            Server(log_dir, **common, INTRA_OP_THREADS=cores) as alone:
        proxy = Nginx(log_dir / "nginx", [first, second])
        try:
            through, single = [], []
            for _ in range(runs):  # side by side, alternating
                through.append(concurrent_streams(proxy.url, body, options.streams).decode_rate)
                single.append(concurrent_streams(alone.url, body, options.streams).decode_rate)
            report["nginx_two_replicas_tokens_per_s"] = statistics.median(through)
            report["one_replica_tokens_per_s"] = statistics.median(single)
            keyed = [_conversation_turns(proxy.url, model, uuid.uuid4().hex) for _ in range(runs)]
            free = [_conversation_turns(proxy.url, model, None) for _ in range(2 * runs)]
        finally:
            proxy.stop()
    missed = [ttft for ttft, cached in free if cached == 0]
    report.update({
        "second_turn_ttft_with_affinity_s": statistics.median(ttft for ttft, _ in keyed),
        "second_turn_cached_with_affinity": statistics.median(cached for _, cached in keyed),
        "second_turn_ttft_without_affinity_s": statistics.median(ttft for ttft, _ in free),
        "second_turn_ttft_on_the_other_replica_s": statistics.median(missed) if missed else None,
        "second_turns_without_affinity_that_missed_the_cache": f"{len(missed)} of {len(free)}",
    })
    for key, value in report.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    add_stream_args(parser)


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
