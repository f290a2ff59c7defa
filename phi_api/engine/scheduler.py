"""The per-worker engine thread: continuous batching over one decoder session.

One native OS thread per worker owns the decoder session (made in that
thread, after the fork, so it computes with every core the worker is given)
and the key/value buffers of every sequence it runs. Each iteration:

1. takes new requests in, and admits them while the key/value budget has
   room (``KV_CACHE_MB``); the others wait, in order, until rows leave;
2. prefills one chunk of one admitted prompt (the one with the least left to
   prefill), so a long prompt delays the running streams by one chunk at a
   time, and short prompts are not held back behind it;
3. advances every running sequence by one token in one batched step.

A sequence joins the batch as soon as its prompt is prefilled and leaves it
as soon as it finishes, is cancelled or times out. The rows a step advances
must be contiguous in the buffers, so running rows sit at the front
(``[0, running)``) and a leaving row's place is taken by the last one (a copy
of its keys and values, ~3 ms for 600 tokens).

LongRoPE (Phi-3.5): the graph switches to its long rotary factors when a
step's attention mask is wider than ``original_max_position_embeddings``.
Rows that are still short and rows already long cannot share a step, so the
running rows are kept in two groups, short first, each stepped on its own.
A short row that reaches the switch is prefilled again whole, in one step
(as ONNX Runtime GenAI's own generator does), and joins the long group. A
prompt longer than the switch is prefilled with a first chunk that already
crosses it, so every one of its keys uses the long factors.

Model steps go through ONNX Runtime with the GIL released, so the worker's
gevent hub keeps serving while the thread computes. The thread never logs
(under gevent a logging handler's lock is a gevent lock, unsafe from another
OS thread): it hands each finished generation to the hub's thread instead.
"""

from __future__ import annotations

import collections
import logging
import os
import time
import traceback
from typing import Any, Callable, Protocol

import numpy as np

from phi_api.engine.cache import PromptCache
from phi_api.engine.job import Finished, Job, TextDelta
from phi_api.engine.logits import Sampler
from phi_api.engine.native import Signal, give_back_memory, start_thread
from phi_api.engine.runtime import ORT_ERRORS, TOKEN_GRANULE, DecoderSpec, KVCache
from phi_api.engine.text import TextAssembler
from phi_api.engine.wakeup import HubRelay

log = logging.getLogger(__name__)  # used on the hub's thread only
_THREAD_ENDED = object()  # the engine thread's last message to the hub (see HubRelay.close)
Report = Callable[[Job, Finished], None]
_SHORT, _LONG = "short", "long"  # LongRoPE regimes (every sequence is short in other models)


class Decoder(Protocol):
    """What the scheduler needs from a decoder session (:class:`runtime.Decoder`, or a fake in tests)."""

    spec: DecoderSpec

    def step(self, kv: KVCache, first: int, ids: np.ndarray, past: np.ndarray, prefill: bool) -> np.ndarray: ...


class Model(Protocol):
    """What the scheduler needs from a model (``LanguageModel``, or a fake in tests)."""

    info: Any

    def new_decoder(self, threads: int) -> Decoder: ...
    def create_stream(self) -> Any: ...


class CapacityError(ValueError):
    """A request that needs more key/value memory than the whole budget allows (it could never run)."""


class RetiredError(RuntimeError):
    """The engine's model was unloaded: it takes nothing new."""


def _discard(job: Job, finished: Finished) -> None:
    """The report of an engine that has ended (it reports nothing more)."""


def _ended() -> None:
    """On the hub, once an engine thread has ended and its relay is closed."""
    give_back_memory()
    log.info("engine stopped; its memory is given back")


class _Sequence:
    """One choice of a request: its row in the buffers, and how it chooses and spells its tokens."""

    def __init__(self, job: Job, model: Model) -> None:
        self.job = job
        self.reserve = min(model.info.context_length, len(job.prompt) + job.params.max_tokens)
        self.tokens: list[int] = [int(token) for token in job.prompt]  # prompt, then every fed token
        self.length = 0  # tokens whose keys and values the row holds
        self.slot: int | None = None
        self.pending: int | None = None  # chosen, not yet fed to the model
        self.generated = 0
        self.cached = 0
        self.first_token_at: float | None = None
        self.long = False
        self.steps = 0  # batched steps this sequence was advanced in ...
        self.step_rows = 0  # ... and their rows, summed
        self.sampler = Sampler(job.params, job.prompt, model.info.eos_token_ids, guide=job.guide)
        self.stream = model.create_stream()
        self.text = TextAssembler(self.stream, job.params.stop)


class _Request:
    """The sequences of one submitted request: one prompt, prefilled once, then ``n`` choices."""

    def __init__(self, jobs: list[Job], model: Model, chunk: int, rope_switch: int | None) -> None:
        self.jobs = jobs
        self.prompt = jobs[0].prompt
        self.sequences: list[_Sequence] = []
        self.prefilled = 0
        self.reserve = min(model.info.context_length, len(self.prompt) + jobs[0].params.max_tokens)
        long = rope_switch is not None and len(self.prompt) > rope_switch
        self.regime = _LONG if long else _SHORT
        # A long prompt's first chunk must cross the switch: its first grid point past it.
        self.first_chunk = (rope_switch // chunk + 1) * chunk if long else chunk

    @property
    def leader(self) -> _Sequence:
        return self.sequences[0]

    def over(self) -> str | None:
        """Why the whole request ends before it runs (cancelled or timed out), if it does."""
        if all(job.cancelled for job in self.jobs):
            return "cancelled"
        if time.monotonic() > self.jobs[0].deadline:
            return "timeout"
        return None


class Scheduler:
    """Owns this process's engine thread, its decoder session, and the sequences it runs."""

    def __init__(self, model: Model, *, prefill_chunk: int, report: Report, threads: int = 1,
                 kv_budget_bytes: int = 1 << 30, max_rows: int = 64, cache_bytes: int = 0,
                 idle_wait: float = 1.0) -> None:
        self._model = model
        self._chunk = prefill_chunk
        self._report = report
        self._threads = threads
        self._budget = kv_budget_bytes
        self._bytes_per_token = max(1, model.info.kv_bytes_per_token)
        self._max_rows = max_rows
        self._cache = PromptCache(cache_bytes, prefill_chunk)
        self._idle_wait = idle_wait
        self._inbox: collections.deque[list[Job]] = collections.deque()
        self._signal = Signal()
        self._relay: HubRelay | None = None
        self._started_pid: int | None = None
        self._ready = False
        self._stopping = False
        self._retiring = False
        self.failure: str | None = None  # why the engine thread could not start, for the log
        self._reset()

    def _reset(self) -> None:
        self._decoder: Decoder | None = None
        self._kv: KVCache | None = None
        self._reset_rows()

    def _reset_rows(self) -> None:
        if self._kv is not None:
            self._kv.clear()
        self._slots: list[_Sequence | None] = []
        self._running = 0  # rows [0, running) advance each step ...
        self._short = 0  # ... of which [0, short) with LongRoPE's short factors
        self._waiting: collections.deque[_Request] = collections.deque()
        self._prefilling: list[_Request] = []

    # The hub's side ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether this process's engine thread is up and its decoder loaded."""
        return self._started_pid == os.getpid() and self._ready and not self._stopping

    def start(self) -> None:
        """Start the engine thread in this process (after a fork, a new one); call from the hub's thread."""
        if self._started_pid != os.getpid():
            self._started_pid = os.getpid()
            self._stopping = self._ready = False
            self._inbox.clear()
            self._reset()
            self._relay = HubRelay(self._deliver)
            start_thread(self._run)

    def kv_tokens_for(self, rows: int) -> int:
        """The most tokens a request of ``rows`` choices may reserve per choice within the budget, alone."""
        tokens = self._budget // (self._bytes_per_token * KVCache.shape_for(rows + 1, 1)[0])
        return int(tokens // TOKEN_GRANULE * TOKEN_GRANULE)

    def check_capacity(self, prompt_tokens: int, max_tokens: int, rows: int) -> None:
        """Raise :class:`CapacityError` if such a request could never fit the key/value budget."""
        reserve = min(self._model.info.context_length, prompt_tokens + max_tokens)
        if rows > self._max_rows or reserve > self.kv_tokens_for(rows):
            raise CapacityError(
                f"needs {rows} x {reserve} tokens of key/value cache; this server holds at most "
                f"{self.kv_tokens_for(rows)} tokens per choice for {rows} choice(s) (KV_CACHE_MB)")

    def submit(self, jobs: list[Job]) -> None:
        """Queue a request's jobs (its choices); they start within one iteration if there is room."""
        if self._retiring:
            raise RetiredError("this model has been unloaded")
        self.start()
        self._inbox.append(jobs)
        self._signal.set()

    def stop(self) -> None:
        """Ask the engine thread to cancel what it runs and exit."""
        self._stopping = True
        self._signal.set()

    def retire(self) -> None:
        """Take nothing new; let what runs finish, then exit and free the session and the buffers."""
        self._retiring = True
        self._signal.set()

    def _deliver(self, item: Any) -> None:
        if item is _THREAD_ENDED:
            # Break the cycles (relay -> this scheduler -> relay; engine -> this scheduler -> engine) so that
            # reference counting frees the engine now: a full gc.collect() here stalled the hub 70-85 ms.
            self._relay.close(then=_ended)
            self._relay = None
            self._report = _discard
            return
        if isinstance(item, str):
            self.failure = item
            log.error("the engine could not start:\n%s", item)
            return
        self._report(*item)

    # The engine thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._decoder = self._model.new_decoder(self._threads)
            self._kv = KVCache(self._decoder.spec)
        except BaseException as error:  # reported on the hub; the worker then answers 503
            self._relay.send("".join(traceback.format_exception(error)))
            return
        self._ready = True
        while not self._stopping:
            try:
                worked = self._iterate()
            except Exception as error:  # a bug of ours: end what runs, with the cause, and keep serving
                self._fail_everything("".join(traceback.format_exception(error)))
                continue
            if not worked:
                if self._retiring and not self._inbox and not self._waiting:
                    break  # unloaded, and nothing left to finish
                self._signal.wait(self._idle_wait)
        self._ready = False
        for request in list(self._waiting) + list(self._prefilling):
            self._end_request(request, "cancelled")
        for row in list(self._slots):
            if row is not None:
                self._finish(row, "cancelled")
        self._cache.clear()
        self._kv.clear()
        self._decoder = None  # the session, its threads and its memory go with it
        self._relay.send(_THREAD_ENDED)

    def _iterate(self) -> bool:
        """One iteration; False when there was nothing to do."""
        while self._inbox:
            self._waiting.append(_Request(self._inbox.popleft(), self._model, self._chunk,
                                          self._decoder.spec.rope_switch))
        self._admit()
        worked = False
        if self._prefilling:
            self._prefill_one()
            worked = True
        if self._running:
            self._decode()
            worked = True
        if not self._running and not self._prefilling and not self._waiting and self._kv.rows:
            self._kv.clear()  # idle: give the buffers' memory back
        return worked

    def _fail_everything(self, detail: str) -> None:
        for request in list(self._waiting) + list(self._prefilling):
            self._end_request(request, "error", detail)
        for row in list(self._slots):
            if row is not None:
                self._publish(row.job, Finished("error", len(row.job.prompt), row.generated, None, 0.0, detail,
                                                cached_tokens=row.cached, index=row.job.index))
        self._reset_rows()

    # Admission --------------------------------------------------------------------------------------

    def _occupied(self) -> int:
        return sum(row is not None for row in self._slots)

    def _demand(self, admitted: list[_Request]) -> tuple[int, int]:
        """Rows and tokens per row that what is admitted will need: the running rows, and every choice of the
        requests still prefilling or just ``admitted``."""
        pending = list(self._prefilling) + admitted
        rows = self._running + sum(len(request.jobs) for request in pending)
        tokens = max([row.reserve for row in self._slots[:self._running]]
                     + [request.reserve for request in pending], default=0)
        return rows, tokens

    def _fits(self, request: _Request, admitted: list[_Request]) -> bool:
        rows, tokens = self._demand(admitted + [request])
        shape = KVCache.shape_for(rows + 1, tokens)  # one spare row for moves
        return rows <= self._max_rows and shape[0] * shape[1] * self._bytes_per_token <= self._budget

    def _grow(self, rows: int, tokens: int) -> None:
        """Make the buffers hold at least ``rows`` rows of ``tokens`` tokens."""
        self._kv.ensure(rows, tokens)
        self._slots += [None] * (self._kv.rows - len(self._slots))

    def _admit(self) -> None:
        """Start the waiting requests, in order, while they fit; the buffers grow once for all of them."""
        admitted: list[_Request] = []
        while self._waiting:
            request = self._waiting[0]
            ended = request.over()
            if ended:
                self._waiting.popleft()
                self._end_request(request, ended)
                continue
            if not self._fits(request, admitted):
                if not self._running and not self._prefilling and not admitted:
                    self._waiting.popleft()  # it cannot fit even alone (the service checks this before)
                    self._end_request(request, "error", "the request does not fit the key/value budget")
                    continue
                break
            admitted.append(self._waiting.popleft())
        if admitted:
            rows, tokens = self._demand(admitted)
            self._grow(rows + 1, tokens)
            for request in admitted:
                self._start(request)

    def _start(self, request: _Request) -> None:
        try:
            request.sequences = [_Sequence(job, self._model) for job in request.jobs]
        except Exception as error:  # a stream or sampler that cannot be made ends this request only
            self._end_request(request, "error", "".join(traceback.format_exception(error)))
            return
        leader = request.leader
        self._place(leader, self._free_slot(self._running))
        floor = request.first_chunk if request.regime == _LONG else 0
        reused, kv = self._cache.take(request.prompt, request.regime, floor) if self._cache.enabled else (0, None)
        if kv is not None:
            self._kv.write(leader.slot, kv)
            leader.length = request.prefilled = leader.cached = reused
        leader.long = request.regime == _LONG
        self._prefilling.append(request)

    # Prefill ----------------------------------------------------------------------------------------

    def _prefill_one(self) -> None:
        # Shortest remaining prompt first: the fewest waits for first tokens, and a long prompt never holds
        # short ones back (it proceeds whenever nothing shorter is waiting).
        request = min(self._prefilling, key=lambda candidate: len(candidate.prompt) - candidate.prefilled)
        self._prefilling.remove(request)
        ended = request.over()
        if ended:
            self._end_request(request, ended)
            return
        leader, prompt = request.leader, request.prompt
        start = request.prefilled
        # Chunks on a fixed grid (see engine.cache: what makes reuse exact on any CPU).
        end = min(len(prompt), request.first_chunk if start == 0 else start + self._chunk)
        try:
            logits = self._decoder.step(self._kv, leader.slot, np.asarray(prompt[start:end])[None, :],
                                        np.array([start]), True)
        except ORT_ERRORS as error:
            self._end_request(request, "error", "".join(traceback.format_exception(error)))
            return
        leader.length = request.prefilled = end
        if end < len(prompt):
            self._prefilling.append(request)
            return
        self._keep_prompt(request)
        self._open(request, logits[0])

    def _keep_prompt(self, request: _Request) -> None:
        floor = request.first_chunk if request.regime == _LONG else 0
        length = self._cache.keepable(len(request.prompt), floor)
        if length:
            self._cache.put(np.array(request.prompt[:length]), self._kv.read(request.leader.slot, length),
                            request.regime)

    def _open(self, request: _Request, logits: np.ndarray) -> None:
        """The prompt is in: give each choice its row, its first token, and a place among the running."""
        leader = request.leader
        for sequence in request.sequences[1:]:
            sequence.cached, sequence.long = leader.cached, leader.long
            self._grow(self._occupied() + 2, self._kv.tokens)
            self._place(sequence, self._free_slot(self._running))
            self._kv.copy_row(leader.slot, sequence.slot, leader.length)
            sequence.length = leader.length
        shared = len(request.sequences) > 1
        for sequence in request.sequences:
            self._join(sequence)
            if sequence.job.cancelled:
                self._finish(sequence, "cancelled")
                continue
            self._take(sequence, logits.copy() if shared else logits)

    # Decode -----------------------------------------------------------------------------------------

    def _decode(self) -> None:
        switch = self._decoder.spec.rope_switch
        if switch is not None:
            for row in [row for row in self._slots[:self._short] if row.length >= switch]:
                self._cross(row)
        # The long group first: its rows leaving move only rows of its own group.
        if self._running > self._short:
            self._step_rows(self._short, self._running)
        if self._short:
            self._step_rows(0, self._short)

    def _step_rows(self, first: int, end: int) -> None:
        rows: list[_Sequence] = self._slots[first:end]  # type: ignore[assignment]
        ids = np.array([[row.pending] for row in rows], dtype=np.int64)
        past = np.array([row.length for row in rows], dtype=np.int64)
        try:
            logits = self._decoder.step(self._kv, first, ids, past, False)
        except ORT_ERRORS as error:
            detail = "".join(traceback.format_exception(error))
            for row in rows:
                self._finish(row, "error", detail)
            return
        for row in rows:  # every row holds its new key and value before any row moves
            row.tokens.append(row.pending)
            row.length += 1
            row.steps += 1
            row.step_rows += len(rows)
        # Rows that want the raw argmax get it for the whole step at once.
        greedy = [index for index, row in enumerate(rows) if row.sampler.plain_greedy]
        if len(greedy) == len(rows):
            chosen = dict(enumerate(np.argmax(logits, axis=1).tolist()))
        else:
            chosen = dict(zip(greedy, np.argmax(logits[greedy], axis=1).tolist())) if greedy else {}
        for index, row in enumerate(rows):
            self._take(row, logits[index], chosen.get(index))

    def _cross(self, row: _Sequence) -> None:
        """LongRoPE: the row reaches the switch; prefill it again whole, with the long factors."""
        sequence = np.array(row.tokens + [row.pending], dtype=np.int64)
        try:
            logits = self._decoder.step(self._kv, row.slot, sequence[None, :], np.array([0]), True)
        except ORT_ERRORS as error:
            self._finish(row, "error", "".join(traceback.format_exception(error)))
            return
        row.tokens.append(row.pending)
        row.length = len(sequence)
        self._regroup(row)
        self._take(row, logits[0])

    # Tokens -----------------------------------------------------------------------------------------

    def _take(self, row: _Sequence, logits: np.ndarray, chosen: int | None = None) -> None:
        """Choose the row's next token from ``logits`` and act on it: text, or the end of the generation."""
        job = row.job
        if job.cancelled:
            self._finish(row, "cancelled")
            return
        if time.monotonic() > job.deadline:
            self._finish(row, "timeout")
            return
        try:
            if chosen is None:
                token, record = row.sampler.choose(logits)
            else:
                token, record = chosen, row.sampler.observe(chosen)
            row.generated += 1
            if row.first_token_at is None:
                row.first_token_at = time.monotonic()
            if token in self._model.info.eos_token_ids:
                self._finish(row, "stop")
                return
            pieces, stopped = row.text.add(token, record)
            failed = row.sampler.guide_failure
        except Exception as error:  # one sequence's sampler, grammar or text failing ends that sequence only
            self._finish(row, "error", "".join(traceback.format_exception(error)))
            return
        self._emit(row, pieces)
        if stopped:
            self._finish(row, "stop", flush=False)
        elif failed:
            self._finish(row, "error", f"the grammar cannot continue: {failed}")
        elif row.generated >= job.params.max_tokens or row.length + 1 > self._kv.tokens:
            self._finish(row, "length")
        else:
            row.pending = token

    def _emit(self, row: _Sequence, pieces: list) -> None:
        records = tuple((piece.text, piece.logprob) for piece in pieces if piece.logprob is not None)
        text = "".join(piece.text for piece in pieces)
        if text or records:
            row.job.emit(TextDelta(text, records, row.job.index))

    def _finish(self, row: _Sequence, reason: str, error: str | None = None, *, flush: bool = True) -> None:
        if flush and reason in ("stop", "length"):
            self._emit(row, row.text.finish())
        row.stream.close()
        self._release(row)
        now = time.monotonic()
        first = row.first_token_at
        self._publish(row.job, Finished(
            reason=reason, prompt_tokens=len(row.job.prompt), completion_tokens=row.generated,
            time_to_first_token=(first - row.job.submitted_at) if first is not None else None,
            decode_seconds=(now - first) if first is not None else 0.0, error=error, cached_tokens=row.cached,
            index=row.job.index, batch_rows=row.step_rows / row.steps if row.steps else 0.0))

    def _end_request(self, request: _Request, reason: str, error: str | None = None) -> None:
        """End every choice of a request that never reached the running batch."""
        if request.sequences:
            for sequence in request.sequences:
                sequence.stream.close()
                if sequence.slot is not None:
                    self._slots[sequence.slot] = None
                    sequence.slot = None
        for job in request.jobs:
            self._publish(job, Finished(reason, len(job.prompt), 0, None, 0.0, error,
                                        cached_tokens=request.prefilled if request.sequences else 0,
                                        index=job.index))

    def _publish(self, job: Job, finished: Finished) -> None:
        job.emit(finished)
        self._relay.send((job, finished))

    # Rows -------------------------------------------------------------------------------------------

    def _free_slot(self, start: int) -> int:
        """The first free row at or after ``start`` (the buffers grow when there is none)."""
        for index in range(start, len(self._slots)):
            if self._slots[index] is None:
                return index
        self._grow(len(self._slots) + 1, self._kv.tokens)
        return self._free_slot(start)

    def _place(self, row: _Sequence, slot: int) -> None:
        self._slots[slot] = row
        row.slot = slot

    def _move(self, row: _Sequence, target: int) -> None:
        """Copy ``row`` to the free row ``target``."""
        self._kv.copy_row(row.slot, target, row.length)
        self._slots[row.slot] = None
        self._place(row, target)

    def _vacate(self, slot: int) -> None:
        """Move whatever occupies ``slot`` (a row still prefilling) further back."""
        occupant = self._slots[slot] if slot < len(self._slots) else None
        if occupant is not None:
            self._move(occupant, self._free_slot(slot + 1))

    def _join(self, row: _Sequence) -> None:
        """Bring a row whose prompt is in among the running, in its group."""
        if not row.long and self._short < self._running:  # short rows sit before the long ones
            self._vacate(self._running)
            self._move(self._slots[self._short], self._running)
            target = self._short
        else:
            target = self._running
            if row.slot != target:
                self._vacate(target)
        if row.slot != target:
            self._move(row, target)
        self._running += 1
        if not row.long:
            self._short += 1

    def _regroup(self, row: _Sequence) -> None:
        """A short running row became long: it takes the last short place, and the short group shrinks."""
        last_short = self._short - 1
        if row.slot != last_short:
            place = row.slot
            self._move(row, self._free_slot(self._running))  # out of the way
            self._move(self._slots[last_short], place)  # the last short row takes its place
            self._move(row, last_short)
        row.long = True
        self._short -= 1

    def _release(self, row: _Sequence) -> None:
        """Take a finished row out: the last row of its group takes its place, so the running stay in front."""
        slot = row.slot
        if slot is None:
            return
        self._slots[slot] = None
        row.slot = None
        if slot >= self._running:
            return  # it never joined the running rows
        if slot < self._short:
            last_short = self._short - 1
            if slot != last_short:
                self._move(self._slots[last_short], slot)
            if self._running - 1 > last_short:
                self._move(self._slots[self._running - 1], last_short)
            self._short -= 1
        elif slot != self._running - 1:
            self._move(self._slots[self._running - 1], slot)
        self._running -= 1
