"""Real gunicorn processes for the integration tests (the benchmark's launcher), and a polling helper."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.server import Server, free_port, poll
from phi_api.errors import ServerError

__all__ = ["Server", "ServerError", "answers_health", "failed_start", "free_port", "wait_until"]


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    return poll(condition, timeout, message, interval, error=AssertionError)


def answers_health(process: Any, url: str, log: Any) -> Callable[[], bool]:
    """A :func:`wait_until` condition: the server ``process`` started answers ``GET /health`` at ``url``; the test
    fails at once, with the log file ``log``, if the process has ended."""

    def healthy() -> bool:
        assert process.poll() is None, Path(log).read_text()
        try:
            return requests.get(url + "/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    return healthy


def failed_start(logs_dir: Any, **env: Any) -> tuple[int, str]:
    """Start a server that is expected to stop by itself; its exit status and its log."""
    server = Server(logs_dir, **env).start(wait=False)
    code = server.process.wait(timeout=60)
    return code, server.log()
