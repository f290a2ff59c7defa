"""The server's one memory budget (``MEMORY_LIMIT_MB``): weights, processes, and keys and values, added up.

What the server's processes take, as the kernel counts a process tree (PSS):

- the weights of every loaded model, once: the workers map the same files
  (the size of each model's files);
- the gunicorn master's private memory (measured after it loaded the declared
  models: Python, tokenizers, grammars);
- each worker's private memory beyond its keys and values (measured once its
  engines have made their sessions: ONNX Runtime's arenas, the small tensors
  it copies, Python; until then the master's figure stands for it), measured
  again as it serves: what it holds beyond what its key/value books hold, the
  largest such figure kept (ONNX Runtime's arenas grow with the largest step
  they have run, and keep that size);
- each worker's keys and values: what is left, split evenly between the
  workers. That share is the worker's :class:`~phi_api.engine.kv.budget.SharedBudget`,
  which every model's engine in the worker books from.

Private memory is read as ``RssAnon`` (``/proc/PID/status``): anonymous pages,
including those a worker still shares with the master after the fork, so the
figure errs on the side of less room, never more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from phi_api.engine.kv.budget import SharedBudget
from phi_api.errors import InsufficientMemoryError

MIN_REQUEST_TOKENS = 2048  # a model fits when each worker has room for one request this long beside its weights


def anonymous_bytes(pid: int | str = "self") -> int:
    """A process's resident anonymous memory (0 where ``/proc`` cannot tell)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class ServerMemory:
    """The budget, what is known of its parts, and this worker's share for keys and values."""

    limit: int
    workers: int
    master_private: int = 0
    worker_private: int | None = None  # measured in this process (a worker) once its engines are ready
    measured_with: int = -1  # the loaded models' weights when worker_private was measured
    shared: SharedBudget = field(default_factory=lambda: SharedBudget(0))

    def fixed(self, weights: int) -> int:
        """Everything but keys and values: the weights, the master, and every worker's own memory."""
        per_worker = self.worker_private if self.worker_private is not None else self.master_private
        return weights + self.master_private + self.workers * per_worker

    def kv_share(self, weights: int) -> int:
        """Each worker's keys and values: what is left of the limit, split between the workers."""
        return max(0, (self.limit - self.fixed(weights)) // self.workers)

    def observe(self, loaded: bool, ready: bool, weights: int) -> None:
        """In a worker: measure its own memory once its engines (``loaded`` and ``ready``) are, and again at each
        call after (the largest figure stands while the same models are loaded; a model loaded or unloaded starts
        it again), and set its key/value share for the models' ``weights`` now loaded. Its own memory is what it
        holds beyond its key/value books: a running request's reservation may not be written yet, so the figure
        errs low, and the largest one seen keeps the worker from counting on memory its arenas once took."""
        if loaded and ready:
            own = measured_here() - self.shared.held()
            if self.worker_private is None or own > self.worker_private or weights != self.measured_with:
                self.worker_private, self.measured_with = own, weights
        self.refresh(weights)

    def refresh(self, weights: int) -> None:
        """Set this worker's key/value budget for the models now loaded (``weights``: their files' sizes)."""
        self.shared.resize(self.kv_share(weights))

    def check_fits(self, weights: int, needed_kv: int, what: str) -> None:
        """Raise :class:`InsufficientMemoryError` unless ``weights`` and ``needed_kv`` bytes of keys and values per
        worker fit the limit."""
        needed = self.fixed(weights) + self.workers * needed_kv
        if needed > self.limit:
            free = max(0, self.limit - self.fixed(0))
            raise InsufficientMemoryError(
                f"{what}: {needed / 2**20:.0f} MB needed ({weights / 2**20:.0f} MB of weights, "
                f"{self.workers} x {needed_kv / 2**20:.0f} MB of keys and values for one {MIN_REQUEST_TOKENS:,}-token "
                f"request, {self.fixed(0) / 2**20:.0f} MB for the server's processes) but MEMORY_LIMIT_MB is "
                f"{self.limit / 2**20:.0f} MB ({free / 2**20:.0f} MB free of the processes' own memory).")

    def usage(self) -> dict[str, int]:
        return {"limit": self.limit, "master_private": self.master_private,
                "worker_private": self.worker_private or 0, "kv_share": self.shared.budget}


def measured_here() -> int:
    """This process's private memory now (for the master after loading, a worker once its engines are ready)."""
    return anonymous_bytes(os.getpid())
