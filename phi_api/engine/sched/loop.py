"""The per-worker engine thread: it owns the decoder session, the key/value pool and the batch.

One native OS thread per worker owns the decoder session (made in that
thread, after the fork, so it computes with every core the worker is given),
the key/value pool (:mod:`engine.runtime.pool`) and the continuous batch
(:mod:`engine.sched.continuous`), and runs the batch's iterations while there is work.
Requests come in through a thread-safe inbox; finished generations go back
to the hub's thread through a relay, because the engine thread never logs
(under gevent a logging handler's lock is a gevent lock, unsafe from another
OS thread).

Model steps go through ONNX Runtime with the GIL released, so the worker's
gevent hub keeps serving while the thread computes.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phi_api.engine.choice import Choice, Finished
from phi_api.engine.config import EngineConfig
from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.kv.disk import BlockLayout, DiskStats, PrefixStore, store_key
from phi_api.engine.kv.ledger import Ledger
from phi_api.engine.kv.reuse import ReusePolicy
from phi_api.engine.kv.sequence import Request
from phi_api.engine.runtime.model import Model
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.prepack import cpu_features
from phi_api.engine.runtime.session import Decoder
from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.engine.sched.continuous import ContinuousBatch
from phi_api.engine.sched.drafts import DraftModel
from phi_api.engine.sched.prefill import ChunkPlanner
from phi_api.engine.sched.stepcost import StepCosts
from phi_api.engine.threads.native import give_back_memory
from phi_api.engine.threads.owner import ThreadOwner
from phi_api.errors import CapacityError, RetiredError

__all__ = ["CapacityError", "EngineLoad", "EngineLoop", "RetiredError"]

log = logging.getLogger(__name__)  # used on the hub's thread only
_THREAD_ENDED = object()  # the engine thread's last message to the hub (see HubRelay.close)
Report = Callable[[Choice, Finished], None]


@dataclass(frozen=True)
class EngineLoad:
    """What the engine holds now (read on the hub while the engine thread works): requests waiting to start,
    sequences prefilling or running, and the key/value memory they have booked, of the budget."""

    waiting: int = 0
    running: int = 0
    kv_reserved: int = 0
    kv_budget: int = 0


def _discard(choice: Choice, finished: Finished) -> None:
    """The report of an engine that has ended (it reports nothing more)."""


def _ended() -> None:
    """On the hub, once an engine thread has ended and its relay is closed."""
    give_back_memory()
    log.info("engine stopped; its memory is given back")


class EngineLoop(ThreadOwner[list[Choice]]):
    """Owns this process's engine thread, its decoder session, and the batch it runs."""

    def __init__(self, model: Model, config: EngineConfig, *, report: Report,
                 memory: SharedBudget | None = None, draft: Model | None = None) -> None:
        super().__init__()
        self._model = model
        self._draft = draft  # a draft model (engine.sched.drafts), if any
        self.config = config
        self.memory = memory if memory is not None else SharedBudget(config.kv_budget_bytes)
        self._report = report
        self._policy = ReusePolicy(config.prefix_cache, config.prefill_chunk, model.spec.row_wise)
        # Made on the hub, for capacity checks before anything is queued; the engine thread makes its own.
        self._capacity = Ledger(model.spec, config.kv_budget_bytes, config.max_rows, model.info.context_length,
                                shared=self.memory, open_account=False)
        self._arrivals = 0
        self.load = EngineLoad(kv_budget=config.kv_budget_bytes)
        self.batch: ContinuousBatch | None = None  # the engine thread's, for a look from tests
        self.failure: str | None = None  # why the engine thread could not start, for the log
        self._ending: str | None = None  # set by the hub: end everything, with this reason, at the next iteration

    # The hub's side ---------------------------------------------------------------------------------

    def check_capacity(self, prompt_tokens: int, max_tokens: int, rows: int) -> None:
        """Raise :class:`CapacityError` if such a request could never fit the key/value budget."""
        self._capacity.check_capacity(min(self._model.info.context_length, prompt_tokens + max_tokens), rows)

    def submit(self, choices: list[Choice]) -> None:
        """Queue a request's choices (its choices); they start within one iteration if there is room."""
        self._admit()
        self._push(choices)

    def end_all(self, reason: str) -> None:
        """End every request now, each reported with ``reason`` (the worker is about to exit: what ran is counted
        and its clients told, rather than cut); the engine goes on."""
        self._ending = reason
        self._signal.set()

    def _deliver(self, item: Any) -> None:
        if item is _THREAD_ENDED:
            # Break the cycles (relay -> this loop -> relay; engine -> this loop -> engine) so that
            # reference counting frees the engine now: a full gc.collect() here stalled the hub 70-85 ms.
            relay, self._relay = self._relay, None
            assert relay is not None, "the thread ends once"
            relay.close(then=_ended)
            self._report = _discard
            return
        if isinstance(item, str):
            self.failure = item
            log.error("the engine could not start", extra={"traceback": item})
            return
        self._report(*item)

    # The engine thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            decoder = self._model.new_decoder(self.config.threads)
            drafts = self._draft_model()
            batch = self.batch = self._new_batch(decoder, drafts)
        except BaseException as error:  # reported on the hub; the worker then answers 503
            self._send("".join(traceback.format_exception(error)))
            return
        self._ready = True
        while not self._stopping:
            try:
                worked = self._iterate(batch)
            except Exception as error:  # a bug of ours: end what runs, with the cause, and keep serving
                batch.endings.fail_everything("".join(traceback.format_exception(error)))
                continue
            if not worked:
                if self._retiring and not self._inbox and not batch.waiting:
                    break  # unloaded, and nothing left to finish
                self._signal.wait(self.config.idle_wait)
        self._ready = False
        batch.endings.cancel_everything("cancelled")
        if drafts is not None:  # every sequence has ended: its rows are given back
            drafts.close()
        self.load = EngineLoad(kv_budget=self.config.kv_budget_bytes)
        decoder.unbind()
        pool = batch.kv.pool
        if batch.kv.disk is not None:
            batch.kv.disk.close()
        batch.ledger.close()
        self.batch = None
        del batch, decoder, drafts  # the sessions, its threads and its memory go with them ...
        pool.close()  # ... and the pool's reservations
        self._send(_THREAD_ENDED)

    def _draft_model(self) -> DraftModel | None:
        """The draft model's session and rows on this thread, if the model has one."""
        if self._draft is None:
            return None
        config = self.config
        return DraftModel(self._draft, config.threads, config.max_rows, self.memory, config.prefill_chunk,
                          self._model.spec.vocab_size, config.clock)

    def _new_batch(self, decoder: Decoder, drafts: DraftModel | None = None) -> ContinuousBatch:
        """The batch of this engine thread, its pool reserved: rows for the running and starting sequences, as many
        for kept prefixes, and a spare for moves."""
        config = self.config
        ledger = Ledger(decoder.spec, config.kv_budget_bytes, config.max_rows, self._model.info.context_length,
                        shared=self.memory, name=config.name, wake=self._signal.set)
        # One token more than a row holds: a padding row writes at its occupant's length (engine.sched.continuous).
        pool = KVPool(decoder.spec, 2 * config.max_rows + 1, ledger.row_tokens + 1)
        planner = ChunkPlanner.serving(self._policy, invariant=config.batch_invariant,
                                       slice_seconds=config.prefill_slice, costs=StepCosts(config.clock))
        return ContinuousBatch(self._model, decoder, pool, ledger, self._policy, planner, self._publish,
                     draft_max=config.draft_max, disk=self._disk_tier(decoder.spec), invariant=config.batch_invariant,
                     history_tokens=config.history_tokens, drafts=drafts)

    def _disk_tier(self, spec: DecoderSpec) -> PrefixStore | None:
        """The disk tier under the kept prefixes (``PREFIX_CACHE_DIR``), if it is set and prefixes are reused."""
        config = self.config
        if not config.prefix_disk_dir or not self._policy.enabled:
            return None
        key = store_key(self._model.identity, spec, config.prefill_chunk, config.threads, cpu_features(),
                        config.prefix_cache)
        return PrefixStore(Path(config.prefix_disk_dir), key, BlockLayout(spec, config.prefill_chunk),
                           config.prefix_disk_bytes, stage=self.memory.stage, unstage=self.memory.unstage)

    @property
    def disk_stats(self) -> DiskStats | None:
        """What the disk tier did, if this engine has one."""
        batch = self.batch
        return batch.kv.disk.stats if batch is not None and batch.kv.disk is not None else None

    def _iterate(self, batch: ContinuousBatch) -> bool:
        """Take new requests in, then one iteration of the batch; False when there was nothing to do."""
        while self._inbox:
            self._arrivals += 1
            batch.waiting.append(Request(self._inbox.popleft(), self._model, self.config.prefill_chunk,
                                         batch.decoder.spec.rope_switch, self._arrivals))
        ending, self._ending = self._ending, None
        if ending is not None:
            batch.endings.cancel_everything(ending)
        worked = batch.iterate(after_admission=lambda: self._observe(batch))
        if self.config.checked:
            batch.check()
        self._observe(batch)
        return worked

    def _observe(self, batch: ContinuousBatch) -> None:
        """What the engine holds now, for the hub to read (one assignment: never half-updated)."""
        self.load = EngineLoad(waiting=len(batch.waiting) + len(self._inbox),
                               running=len(batch.prefilling) + batch.rows.running, kv_reserved=batch.ledger.reserved,
                               kv_budget=batch.ledger.budget)

    def _publish(self, choice: Choice, finished: Finished) -> None:
        choice.emit(finished)
        self._send((choice, finished))
