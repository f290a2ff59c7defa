"""Each worker's background runner: it claims queued background responses, one per free place of
``BACKGROUND_CONCURRENCY``, and runs each (:mod:`phi_api.background.job`) as a request of its key.

Claims are leases in the store (:mod:`phi_api.storage.background`), so each response runs once however many
workers and replicas there are. Every few seconds the runner also marks failed the responses whose worker is gone
(a dead neighbour on this machine at once, any replica's once its lease ran out: :func:`phi_api.batches.runner.alive`
tells) and drops what is kept past its time.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import gevent
from gevent.pool import Pool

from phi_api.background.job import Outcome, run_job
from phi_api.batches.runner import alive, owner_id
from phi_api.protocols.response_objects import failed
from phi_api.storage.background import BackgroundStore, Job
from phi_api.storage.database import DatabaseError
from phi_api.web.resources import Resources

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2  # how soon a queued response is taken when a place is free
RECOVER_SECONDS = 5.0  # how often responses of dead workers are looked for
RETRY_SECONDS = 5.0  # how soon a database that could not be reached is tried again
GONE = "The server running this background response stopped before it ended."


class BackgroundRunner:
    """Runs queued background responses with ``run``, ``concurrency`` at a time."""

    def __init__(self, store: BackgroundStore, run: Callable[[Job], Outcome], concurrency: int,
                 closed: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.run = run
        self.pool = Pool(concurrency)
        self.owner = owner_id()
        self.closed = closed  # true once the worker shuts down: it claims nothing more (another worker will)

    def run_forever(self) -> None:
        recovered_at = 0.0
        while True:
            job = None
            try:
                if time.monotonic() - recovered_at > RECOVER_SECONDS:
                    recovered = self.store.recover(alive, failed(GONE))
                    if recovered.requeued:
                        log.info("%d background responses of a worker that stopped before running them: queued "
                                 "again", recovered.requeued)
                    if recovered.failed:
                        log.warning("%d background responses of a worker that stopped while running them: marked "
                                    "failed", recovered.failed)
                    self.store.expire()
                    recovered_at = time.monotonic()
                job = self.next_job()
            except DatabaseError as error:  # down or busy: logged, and tried again a little later
                log.warning("the background runner could not look at its queue: %s", type(error).__name__)
                gevent.sleep(RETRY_SECONDS)
            except Exception:  # a bug of ours: logged; the runner must outlive it, or nothing would run here again
                log.exception("the background runner could not look at its queue")
            if job is None:
                gevent.sleep(POLL_SECONDS)
                continue
            self.pool.spawn(self._run, job)

    def next_job(self) -> Job | None:
        """The next response to run: none while every place is taken, or once the worker shuts down."""
        return self.store.claim(self.owner) if self.pool.free_count() and not self.closed() else None

    def _run(self, job: Job) -> None:
        try:
            self.run(job)
        except Exception:  # a bug of ours: logged; its claim runs out and it is marked failed
            log.exception("background response %s failed", job.id)


def background_runner_of(resources: Resources) -> BackgroundRunner:
    """The background runner of an app's resources (a worker runs its ``run_forever`` in a greenlet)."""
    return BackgroundRunner(resources.background, functools.partial(run_job, resources),
                            resources.settings.BACKGROUND_CONCURRENCY, closed=resources.draining)
