"""Each worker's batch runner: it takes the queued lines of batches, one at a time per free place, and runs each
as a request of its batch's key (:mod:`phi_api.batches.lines`: the endpoint's reading of its body, the one
generation path, the answer's rendering), at the lowest priority and outside ``MAX_CONCURRENT_REQUESTS``.

So a live request never gets 429 because of batch work, and the engine admits and prefills every live request
before any batch line (:mod:`engine.sched.scheduler`); a batch line holds at most one place of ``BATCH_CONCURRENCY``
per worker. The lines are claimed in the store (:mod:`phi_api.storage.batches`), so each runs once however many
workers and replicas there are; a claim is a lease, renewed while the line runs: the lines of a worker that died
are queued again by its neighbours on the same machine at once, by any replica once the lease runs out.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import gevent
from gevent.pool import Pool

from phi_api.batches.lines import Answer, answer_line
from phi_api.storage.batches import BatchStore, Line
from phi_api.storage.database import DatabaseError
from phi_api.telemetry.watch import OperatorMetrics
from phi_api.web.resources import Resources

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how soon a new batch's first line is taken
RECOVER_SECONDS = 10.0  # how often lines of dead workers are looked for
RETRY_SECONDS = 5.0  # how soon a database that could not be reached is tried again
Dispatch = Callable[[Line], Answer]  # a line -> its answer


def owner_id(pid: int | None = None) -> str:
    """This process as the owner of claimed lines: its machine, pid and start time (a pid alone may be reused)."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def alive(owner: str) -> bool:
    """Whether the process that claimed lines as ``owner`` still runs; a process of another machine is taken to
    (its lines come back when their lease runs out)."""
    host, _, process = owner.partition(":")
    if host != socket.gethostname():
        return True
    pid, _, started = process.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == started


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class BatchRunner:
    """Runs queued batch lines with ``dispatch``, ``concurrency`` at a time."""

    def __init__(self, store: BatchStore, dispatch: Dispatch, concurrency: int,
                 metrics: OperatorMetrics | None = None, closed: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.dispatch = dispatch
        self.pool = Pool(concurrency)
        self.owner = owner_id()
        self.metrics = metrics  # the lines' outcomes and the queue's length, for /metrics
        self.closed = closed  # true once the worker shuts down: it claims nothing more (another worker will)

    def run_forever(self) -> None:
        recovered_at = 0.0
        while True:
            try:
                if time.monotonic() - recovered_at > RECOVER_SECONDS:
                    self.store.recover(alive)
                    self.store.expire(time.time())
                    if self.metrics is not None:
                        self.metrics.observe_batch_queue(self.store.queued_lines())
                    recovered_at = time.monotonic()
                line = self.next_line()
            except DatabaseError as error:  # down or busy: logged, and tried again a little later
                log.warning("the batch runner could not look at its queue: %s", type(error).__name__)
                gevent.sleep(RETRY_SECONDS)
                line = None
            except Exception:  # a bug of ours: logged; the runner must outlive it, or no batch would run here again
                log.exception("the batch runner could not look at its queue")
                line = None
            if line is None:
                gevent.sleep(POLL_SECONDS)
                continue
            self.pool.spawn(self.run_line, line)

    def next_line(self) -> Line | None:
        """The next line to run: none while every place is taken, or once the worker shuts down."""
        return self.store.claim(self.owner) if self.pool.free_count() and not self.closed() else None

    def run_line(self, line: Line) -> None:
        """Run one line and record its answer (an answer that cannot be had is recorded as an error); a line the
        server could not take now goes back to the queue: 503 (shutting down, or its model not ready) for a moment,
        429 (its key's limits used up for now) with its key resting until its window opens, without holding a
        place of the runner meanwhile."""
        renewer = gevent.spawn(self._renew, line)
        try:
            answer = self.dispatch(line)
        except Exception as error:  # a bug of ours: the line fails, the runner goes on
            log.exception("batch %s line %d failed", line.batch_id, line.line)
            self.store.finish(line, None, None, None, {"code": "server_error", "message": type(error).__name__})
            self._count("failed")
            return
        finally:
            renewer.kill()
        if answer.wait is not None:  # its key's limits: the key rests until its window opens; the others go on
            self.store.rest(line, time.time() + max(answer.wait, POLL_SECONDS))
            self._count("rate_limited")
            return
        if answer.unavailable:  # shutting down, or its model not ready: back in the queue, a moment
            self.store.release(line)
            self._count("requeued")
            gevent.sleep(POLL_SECONDS)
            return
        if not self.store.finish(line, answer.status, answer.body, answer.request_id):
            log.warning("batch %s line %d: its lease ran out while it ran; another worker's answer counts",
                        line.batch_id, line.line)
            self._count("lease_lost")
            return
        self._count("succeeded" if answer.status < 400 else "failed")

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.batch_lines.labels(outcome).inc()

    def _renew(self, line: Line) -> None:
        """Renew the line's lease a few times per lease, while it runs (a database that is down: tried again)."""
        while True:
            gevent.sleep(self.store.lease / 3)
            try:
                if not self.store.renew(line):
                    return
            except DatabaseError:  # for now: the next renewal may reach it before the lease ends
                log.warning("batch %s line %d: its lease could not be renewed", line.batch_id, line.line)


def runner_of(resources: Resources) -> BatchRunner:
    """The batch runner of an app's resources (a worker runs its ``run_forever`` in a greenlet)."""
    return BatchRunner(resources.batches, functools.partial(answer_line, resources),
                       resources.settings.BATCH_CONCURRENCY, resources.metrics.ops,
                       closed=resources.draining)
