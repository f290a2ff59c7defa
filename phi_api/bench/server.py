"""A real gunicorn process on loopback, started the way `make serve` starts it.

Used by the benchmark (which starts its own servers); the integration tests build on it
(``tests/support/server.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import requests

from phi_api.errors import ServerError
from phi_api.settings import load_settings

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]  # gunicorn.conf.py and wsgi.py live here
GUNICORN = Path(sys.executable).with_name("gunicorn")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def poll(condition: Callable[[], Any], timeout: float, message: str = "condition", interval: float = 0.05,
         error: type[Exception] = ServerError) -> Any:
    """Poll ``condition`` until it returns something truthy; raise ``error`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class Server:
    """gunicorn -c gunicorn.conf.py wsgi:app, with the given environment; ``repo``: the checkout whose code serves
    (another one's, to compare two builds side by side)."""

    def __init__(self, log_dir: Path, *, app: str = "wsgi:app", args: tuple[str, ...] = (), repo: Path = REPO,
                 **env: Any) -> None:
        self.app = app
        self.args = args
        self.repo = repo
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"gunicorn-{self.port}.log"
        self.env = {
            **os.environ,
            "SERVER_HOST": "127.0.0.1",
            "SERVER_PORT": str(self.port),
            "PYTHONUNBUFFERED": "1",
            # A folder of its own for prompts stored on disk: no server finds another's (pass one to share it).
            "PREFIX_CACHE_DIR": str(log_dir / f"prefixes-{self.port}"),
            "DATA_DIR": str(log_dir / f"data-{self.port}"),  # and for what lasts: keys' usage, responses, batches
            **({"PYTHONPATH": str(repo)} if repo != REPO else {}),
            **{key: str(value) for key, value in env.items()},
        }
        self.process: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> Server:
        """Launch gunicorn; with ``wait``, return once ``GET /health`` says a worker is ready."""
        with open(self.log_path, "wb") as log:  # the child writes to its own copy of the descriptor
            self.process = subprocess.Popen(
                [str(GUNICORN), "-c", "gunicorn.conf.py", *self.args, self.app],
                cwd=self.repo, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        if wait:
            poll(self._ready, timeout=90, message=f"gunicorn on {self.url} (log: {self.log_path})")
        return self

    @property
    def master(self) -> subprocess.Popen:
        """The gunicorn master process (of a started server)."""
        assert self.process is not None, "start() the server first"
        return self.process

    def _ready(self) -> bool:
        if self.master.poll() is not None:
            raise ServerError(f"gunicorn exited with {self.master.returncode}:\n{self.log()}")
        try:
            healthy = requests.get(self.url + "/health", timeout=1).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not listening yet, or a worker still loading
            return False
        # One ready worker answers /health while gunicorn may not have forked the next: whoever picks a worker
        # by pid (worker_pids, connected_to) needs them all.
        return healthy and len(self.worker_pids()) >= load_settings(environ=self.env).workers

    def log(self) -> str:
        """Everything the server wrote so far (also after it stopped): gunicorn writes to the file itself."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def worker_pids(self) -> list[int]:
        """The pids of gunicorn's workers (children of the master)."""
        children = Path(f"/proc/{self.master.pid}/task/{self.master.pid}/children").read_text().split()
        return [int(pid) for pid in children]

    def session_to(self, pid: int, timeout: float = 10) -> requests.Session:
        """A keep-alive connection that worker ``pid`` accepted (see :meth:`connected_to`)."""

        def connect() -> requests.Session:
            session = requests.Session()
            session.get(self.url + "/health", timeout=timeout)  # any answer (503 while it loads a model) will do
            return session

        return self.connected_to(pid, connect, timeout)

    def connected_to(self, pid: int, connect: Callable[[], T], timeout: float = 10) -> T:
        """What ``connect()`` returns, made while only worker ``pid`` can accept, whichever way the kernel would
        spread connections: ``connect`` opens a client's keep-alive connection (by a request on it).

        The other workers are stopped (SIGSTOP) until ``connect`` returns: a stopped process cannot accept, so
        only ``pid`` can. gunicorn closes a connection after ``keepalive`` seconds (5) without a request: use it
        at once. The request counts toward gunicorn's ``--max-requests``.
        """
        others = [other for other in self.worker_pids() if other != pid]
        for other in others:
            os.kill(other, signal.SIGSTOP)
        try:
            poll(lambda: all(_state(other) in "Tt" for other in others), timeout, "the other workers to stop")
            return connect()
        finally:
            for other in others:
                os.kill(other, signal.SIGCONT)

    def sessions(self) -> dict[int, requests.Session]:
        """A connection to each worker (see :meth:`session_to`), by pid."""
        return {pid: self.session_to(pid) for pid in self.worker_pids()}

    def engine_threads(self) -> list[int]:
        """How many threads each worker runs under the engine's name: an engine thread per model being
        served or finishing, and the ONNX Runtime pool threads it started (they inherit its name)."""
        from phi_api.engine.threads.native import ENGINE_THREAD_NAME

        name = ENGINE_THREAD_NAME.decode()
        return [sum(1 for thread, _ in threads(pid) if thread == name) for pid in self.worker_pids()]

    def pss_bytes(self) -> int:
        """Proportional set size of the master and its workers together (shared pages split fairly)."""
        return pss_bytes([self.master.pid, *self.worker_pids()])

    def stop(self, timeout: float = 40) -> int:
        """SIGTERM the master and wait for it; returns its exit status."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.master.pid, signal.SIGKILL)
            self.process.wait()
            raise ServerError(f"gunicorn did not stop within {timeout}s:\n{self.log()}") from None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def pss_bytes(pids: list[int]) -> int:
    """Proportional set size of these processes together (a process that has gone counts nothing)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def children(pid: int) -> list[int]:
    """``pid``'s child processes (gunicorn's workers)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def threads(pid: int) -> list[tuple[str, float]]:
    """``pid``'s threads, from ``/proc``: each one's name and CPU seconds (user and system) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        found.append((name, (int(fields[11]) + int(fields[12])) / tick))
    return found


def _state(pid: int) -> str:
    """``pid``'s scheduling state, from ``/proc`` (``T``: stopped); ``X`` when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"
