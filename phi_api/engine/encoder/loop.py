"""The per-worker encoder thread of an encoder model: it owns the session (made there, after the fork), takes the
inputs of every request of the worker from a thread-safe inbox, and encodes them in batches
(:mod:`.batcher`), pooled and normalized (:mod:`.pooling`) before they go back. It never logs (see
:mod:`phi_api.engine.sched.loop`): its start-up failure goes to the hub through a relay."""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phi_api.engine.config import EngineConfig
from phi_api.engine.encoder.batcher import Pending, next_batch, padded
from phi_api.engine.encoder.folder import EncoderInfo
from phi_api.engine.encoder.job import Encoding
from phi_api.engine.encoder.pooling import normalized, pool, scores
from phi_api.engine.encoder.session import EncoderSession
from phi_api.engine.threads.owner import ThreadOwner

log = logging.getLogger(__name__)  # on the hub's thread only


@dataclass(frozen=True)
class EncoderLoad:
    """What the encoder holds now (read on the hub): inputs waiting, inputs in the call that runs; no key/value
    memory (the gauges a generator's engine fills read zero)."""

    waiting: int = 0
    running: int = 0
    kv_reserved: int = 0
    kv_budget: int = 0


class EncoderLoop(ThreadOwner[Encoding]):
    """Owns this process's encoder thread and its session."""

    def __init__(self, info: EncoderInfo, config: EngineConfig, model_file: Path) -> None:
        super().__init__(thread_name=b"phi-encoder")
        self.info, self.config, self.model_file = info, config, model_file
        self._broken: str | None = None  # why this process's session could not be made
        self._arrivals = 0
        self.load = EncoderLoad()
        self.failure: str | None = None

    # The hub's side ---------------------------------------------------------------------------------

    def submit(self, job: Encoding) -> None:
        self._admit()
        if self._broken is not None:  # its session could not be made: nothing would ever encode it
            job.end("error", self._broken)
            return
        self._push(job)

    def _on_start(self) -> None:
        self._broken = None

    def _deliver(self, failure: str) -> None:
        self.failure = failure
        log.error("the encoder could not start", extra={"traceback": failure})

    # The encoder thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        info = self.info
        try:
            session = EncoderSession(self.model_file, info.inputs, info.output, self.config.threads)
        except BaseException as error:  # reported on the hub; requests then fail at once
            cause = self._broken = "".join(traceback.format_exception(error))
            self._send(cause)
            while self._inbox:
                self._inbox.popleft().end("error", cause)
            return
        self._ready = True
        pending: list[Pending] = []
        while not self._stopping:
            pending = self._take_in(pending)
            if pending:
                pending = self._encode_next(session, pending)
            elif self._retiring and not self._inbox:
                break
            else:
                self._signal.wait(self.config.idle_wait)
        self._ready = False
        for job in {id(item.job): item.job for item in pending}.values():
            job.end("cancelled")
        for job in self._inbox:
            job.end("cancelled")
        self.load = EncoderLoad()

    def _take_in(self, pending: list[Pending]) -> list[Pending]:
        """The inputs waiting: new requests' in, those of cancelled or timed-out requests out (their requests
        ended)."""
        while self._inbox:
            job = self._inbox.popleft()
            self._arrivals += 1
            pending += [Pending(job, index, tokens, job.priority, self._arrivals)
                        for index, tokens in enumerate(job.inputs)]
        now = time.monotonic()
        kept = []
        for item in pending:
            reason = item.job.dropped(now)
            if reason is None:
                kept.append(item)
            else:
                item.job.end(reason)
        self.load = EncoderLoad(waiting=len(kept))
        return kept

    def _encode_next(self, session: EncoderSession, pending: list[Pending]) -> list[Pending]:
        """Encode the next batch; what is left waiting."""
        batch = next_batch(pending, self.config.max_rows, self.config.encoder_batch_tokens)
        self.load = EncoderLoad(waiting=len(pending) - len(batch), running=len(batch))
        ids, mask, types = padded(batch)
        try:
            results = self._results(session.run(ids, mask, types), mask)
        except Exception as error:  # a bug of ours or the runtime's: these requests fail, the thread goes on
            cause = "".join(traceback.format_exception(error))
            for item in batch:
                item.job.end("error", cause)
        else:
            for item, result in zip(batch, results, strict=True):
                item.job.fill(item.index, result)
        taken = {id(item) for item in batch}
        return [item for item in pending if id(item) not in taken]

    def _results(self, output: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Each row's vector (pooled, normalized if the model's are) or scores."""
        info = self.info
        if info.task == "rerank":
            return scores(output, info.activation)
        assert info.pooling is not None
        vectors = pool(output.astype(np.float32, copy=False), mask, info.pooling)
        return normalized(vectors) if info.normalize else vectors
