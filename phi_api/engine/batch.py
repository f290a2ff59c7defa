"""One engine's continuous batch: what one iteration of the engine thread does.

Each iteration (:meth:`Batch.iterate`):

1. admits the waiting requests, in order, while the key/value budget has
   room for them (kept prefixes leave to make room: :mod:`engine.ledger`);
   each starts from the longest prefix any row already holds
   (:mod:`engine.reuse`);
2. prefills one chunk of one admitted prompt (:mod:`engine.prefill` says how
   much): the one with the least left, unless an older request is computing
   the same prefix, which it then copies;
3. advances every running sequence by one token in one batched step.

A sequence joins the running rows as soon as its prompt is in and leaves them
as soon as it finishes, is cancelled or times out; its row is then kept for
reuse, or freed (:mod:`engine.rows`).

LongRoPE (Phi-3.5): the graph switches to its long rotary factors when a
step's attention mask is wider than ``original_max_position_embeddings``.
Rows still short and rows already long cannot share a step, so the running
rows are kept in two groups, each stepped on its own. A short row that
reaches the switch is prefilled again whole, in one step (as ONNX Runtime
GenAI's own generator does), and joins the long group. A prompt longer than
the switch is prefilled with a first chunk that already crosses it.

Everything here runs on the engine thread; it reports through ``publish``.
"""

from __future__ import annotations

import collections
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from phi_api.engine.job import Finished, Job, PromptLogprobs, TextDelta
from phi_api.engine.kvpool import KVPool
from phi_api.engine.ledger import Ledger
from phi_api.engine.logits import prompt_records
from phi_api.engine.prefill import ChunkPlanner
from phi_api.engine.reuse import MIN_REUSED_TOKENS, ReusePolicy, common_prefix
from phi_api.engine.rows import RowsFull, RowTable
from phi_api.engine.runtime import ORT_ERRORS
from phi_api.engine.sequence import LONG, Kept, Occupant, Request, Sequence, row_of
from phi_api.engine.speculation import Speculation
from phi_api.engine.stepcost import StepCosts

Publish = Callable[[Job, Finished], None]


class Decoder(Protocol):
    """What a batch needs from a decoder session (:class:`runtime.Decoder`, or a fake in tests)."""

    spec: Any

    def step(self, pool: KVPool, first: int, ids: np.ndarray, past: np.ndarray, prefill: bool,
             every_position: bool = False) -> np.ndarray: ...


def _trace(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


class Batch:
    """The rows, the waiting and prefilling requests, and the steps that advance them."""

    def __init__(self, model: Any, decoder: Decoder, pool: KVPool, ledger: Ledger, policy: ReusePolicy,
                 planner: ChunkPlanner, publish: Publish, draft_max: int = 0) -> None:
        self.model = model
        self.decoder = decoder
        self.rows = RowTable(pool)
        self.ledger = ledger
        self.policy = policy
        self.planner = planner
        self.publish = publish
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: list[Request] = []
        self._switch = decoder.spec.rope_switch
        self.draft_max = draft_max  # SPECULATIVE_DRAFT_MAX: how far a sequence may draft, unless its request says
        self.costs = StepCosts()  # what a check must beat (engine.stepcost)
        self.speculation = Speculation(self)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.rows.running)

    def iterate(self, after_admission: Callable[[], None] = lambda: None) -> bool:
        """One iteration; False when there was nothing to do."""
        self.admit()
        after_admission()
        worked = False
        if self.prefilling:
            self.prefill_one()
            worked = True
        if self.rows.running:
            self.decode()
            worked = True
        return worked

    def check(self) -> None:
        """Raise AssertionError unless the rows' layout and the budget's books hold (tests run this after every
        iteration)."""
        self.rows.check()
        active = [*self.rows.group(0, self.rows.running), *(s for r in self.prefilling for s in r.sequences)]
        assert self.ledger.active_rows == len(active), (self.ledger.active_rows, len(active))
        assert self.ledger.reserved == sum(sequence.booked for sequence in active)
        assert self.ledger.reserved <= self.ledger.budget
        kept = [item for item in self.rows.occupants() if isinstance(item, Kept)]
        assert sorted(map(id, kept)) == sorted(map(id, self.ledger.kept)), "a kept prefix without its row"
        for request in self.prefilling:
            assert request.leader.slot is not None and request.leader.slot >= self.rows.running
            assert request.leader.length == request.prefilled

    # Admission --------------------------------------------------------------------------------------

    def admit(self) -> None:
        """Start the waiting requests, in order, while they fit."""
        while self.waiting:
            request = self.waiting[0]
            ended = request.over()
            if ended:
                self.waiting.popleft()
                self.end_request(request, ended)
                continue
            source, point = self._source(request)
            if not self._make_room(request, source):
                if self.idle_but_waiting():
                    self.waiting.popleft()  # it cannot fit even alone (the service checks this before)
                    self.end_request(request, "error", "the request does not fit the key/value budget")
                    continue
                return
            self.waiting.popleft()
            self.start(request, source, point)

    def idle_but_waiting(self) -> bool:
        return not (self.prefilling or self.rows.running)

    def _source(self, request: Request) -> tuple[Occupant | None, int]:
        if request.prompt_logprobs is not None:
            return None, 0
        return self.policy.best_source(request.prompt, request.regime, request.first_chunk, self.rows.occupants())

    def _make_room(self, request: Request, source: Occupant | None) -> bool:
        """Give up kept prefixes (the request's own source last) until the request fits; whether it does."""
        rows, reserve = len(request.jobs), request.reserve
        if not self.ledger.could_fit(rows, reserve):
            return False
        short_bytes, short_rows = self.ledger.room_short(rows, reserve, self.rows.free)
        if short_bytes or short_rows:
            for kept in self.ledger.evictions(short_bytes, short_rows, spare=lambda kept: kept is source):
                self._evict(kept)
        return self.ledger.room_short(rows, reserve, self.rows.free) == (0, 0)

    def _evict(self, kept: Kept) -> None:
        self.ledger.forget(kept)
        self.rows.remove(kept)

    def start(self, request: Request, source: Occupant | None, point: int) -> None:
        """Give an admitted request its sequences and its leader's row, starting from ``source``'s prefix."""
        try:
            request.sequences = [Sequence(job, self.model, self.draft_max, request.order) for job in request.jobs]
        except Exception as error:  # a stream or sampler that cannot be made ends this request only
            self.end_request(request, "error", _trace(error))
            return
        for sequence in request.sequences:
            sequence.booked = self.ledger.take(sequence.reserve)
        leader = request.leader
        if source is not None and source.slot is None:
            source = None  # evicted to make room after all
        if isinstance(source, Kept):
            self.ledger.forget(source)
            self.rows.take(source, leader, point)  # its row as it is: no copy
        else:
            self.rows.place(leader, self.rows.free_slot(self.rows.running))
            if source is not None:
                self.rows.pool.copy(row_of(source), row_of(leader), point)
        if source is None:
            point = 0
        leader.length = leader.cached = request.prefilled = point
        leader.exact_upto = point if source is not None and point <= source.exact_upto else 0
        leader.reusable = self.policy.prompt_reusable(point, leader.exact_upto)
        leader.long = request.regime == LONG
        self.prefilling.append(request)

    # Prefill ----------------------------------------------------------------------------------------

    def prefill_one(self) -> None:
        """One chunk of the prompt with the least left to prefill (see :meth:`_defers`)."""
        request = next(candidate for candidate in sorted(self.prefilling, key=lambda r: (r.remaining, r.order))
                       if not self._defers(candidate))
        self.prefilling.remove(request)
        ended = request.over()
        if ended:
            self.end_request(request, ended)
            return
        if request.prompt_logprobs is None:
            self._catch_up(request)
        leader, prompt, start = request.leader, request.prompt, request.prefilled
        crowded = bool(self.rows.running or self.prefilling or self.waiting)
        end = self.planner.end(start, len(prompt), request.first_chunk, crowded)
        every = request.prompt_logprobs is not None
        started = self.planner.clock()
        try:
            logits = self.decoder.step(self.rows.pool, row_of(leader), prompt[start:end][None, :],
                                       np.array([start]), True, every_position=every)
        except ORT_ERRORS as error:
            self.end_request(request, "error", _trace(error))
            return
        self.planner.observe_prefill(end - start, self.planner.clock() - started)
        if request.prompt_logprobs is not None:  # each position's logits give the next prompt token's logprob
            targets = prompt[start + 1:end + 1]
            request.prompt_records += prompt_records(logits[:len(targets)], targets, request.prompt_logprobs)
            logits = logits[-1:]
        leader.length = request.prefilled = end
        leader.exact_upto = self.policy.exact_after(leader.exact_upto, start, end, len(prompt))
        leader.reusable = self.policy.prompt_reusable(end, leader.exact_upto)
        if end < len(prompt):
            self.prefilling.append(request)
            return
        self.open(request, logits[0])

    def _defers(self, request: Request) -> bool:
        """Whether an older request still prefilling is computing a prefix this one will copy instead (a system
        prompt shared by a burst of requests is computed once)."""
        if not self.policy.enabled or request.prompt_logprobs is not None:
            return False
        for other in self.prefilling:
            if other.order >= request.order or other.regime != request.regime:
                continue
            point = self.policy.resume_point(common_prefix(other.prompt, request.prompt), len(request.prompt),
                                             request.first_chunk)
            if point > request.prefilled and other.prefilled < point:
                return True
        return False

    def _catch_up(self, request: Request) -> None:
        """Copy a longer prefix than the request has, if a row now holds one."""
        leader = request.leader
        source, point = self.policy.best_source(request.prompt, request.regime, request.first_chunk,
                                                (row for row in self.rows.occupants() if row is not leader),
                                                better_than=request.prefilled)
        if source is None:
            return
        if isinstance(source, Kept):
            self.ledger.touch(source)
        self.rows.pool.copy(row_of(source), row_of(leader), point)
        leader.length = leader.cached = request.prefilled = point
        leader.exact_upto = point if point <= source.exact_upto else 0
        leader.reusable = self.policy.prompt_reusable(point, leader.exact_upto)

    def open(self, request: Request, logits: np.ndarray) -> None:
        """The prompt is in: give each choice its row, its first token, and a place among the running."""
        leader = request.leader
        for sequence in request.sequences[1:]:
            sequence.cached, sequence.long, sequence.reusable = leader.cached, leader.long, leader.reusable
            sequence.exact_upto = leader.exact_upto
            self.rows.place(sequence, self.rows.free_slot(self.rows.running))
            self.rows.pool.copy(row_of(leader), row_of(sequence), leader.length)
            sequence.length = leader.length
        shared = len(request.sequences) > 1
        for sequence in request.sequences:
            self.rows.join(sequence)
            if request.prompt_logprobs is not None:
                first = (int(request.prompt[0]), None)
                sequence.job.emit(PromptLogprobs((first, *((record.token, record) for record in
                                                           request.prompt_records)), sequence.job.index))
            if sequence.job.cancelled:
                self.finish(sequence, "cancelled")
            elif sequence.job.params.max_tokens == 0:  # the prompt's log-probabilities were all that was asked
                self.finish(sequence, "length")
            else:
                self.take_token(sequence, logits.copy() if shared else logits)

    # Decode -----------------------------------------------------------------------------------------

    def decode(self) -> None:
        """Advance every running sequence: rows with a draft first, by as many tokens as their draft keeps
        (:mod:`engine.speculation`), then every row by one token in one batched step per LongRoPE group, long
        first; a group whose every row advanced by its draft is not stepped again."""
        if self._switch is not None:
            for row in [row for row in self.rows.group(0, self.rows.short) if row.length >= self._switch]:
                self._cross(row)
        advanced = self.speculation.advance()
        # The long group first: its rows leaving move only rows of its own group.
        if self.rows.running > self.rows.short:
            self._step_unless_advanced(self.rows.short, self.rows.running, advanced)
        if self.rows.short:
            self._step_unless_advanced(0, self.rows.short, advanced)

    def _step_unless_advanced(self, first: int, end: int, advanced: set[int]) -> None:
        if not all(id(row) in advanced for row in self.rows.group(first, end)):
            self._step_rows(first, end)

    def _step_rows(self, first: int, end: int) -> None:
        rows = self.rows.group(first, end)
        ids = np.array([[row.pending] for row in rows], dtype=np.int64)
        past = np.array([row.length for row in rows], dtype=np.int64)
        started = self.planner.clock()
        try:
            logits = self.decoder.step(self.rows.pool, first, ids, past, False)
        except ORT_ERRORS as error:
            detail = _trace(error)
            for row in rows:
                self.finish(row, "error", detail)
            return
        seconds = self.planner.clock() - started
        self.planner.observe_decode(len(rows), seconds)
        self.costs.observe_step(len(rows), seconds)
        for row in rows:  # every row holds its new key and value before any row moves
            self.fed(row, len(rows))
        # Rows that want the raw argmax get it for the whole step at once.
        greedy = [index for index, row in enumerate(rows) if row.sampler.plain_greedy]
        if len(greedy) == len(rows):
            chosen = dict(enumerate(np.argmax(logits, axis=1).tolist()))
        else:
            chosen = dict(zip(greedy, np.argmax(logits[greedy], axis=1).tolist(), strict=True)) if greedy else {}
        for index, row in enumerate(rows):
            self.take_token(row, logits[index], chosen.get(index))

    def _cross(self, row: Sequence) -> None:
        """LongRoPE: the row reaches the switch; prefill it again whole, with the long factors."""
        assert row.pending is not None
        sequence = np.array([*row.tokens, row.pending], dtype=np.int64)
        try:
            logits = self.decoder.step(self.rows.pool, row_of(row), sequence[None, :], np.array([0]), True)
        except ORT_ERRORS as error:
            self.finish(row, "error", _trace(error))
            return
        row.tokens.append(row.pending)
        row.length = len(sequence)
        row.exact_upto = 0  # prefilled again whole: not on the grid
        row.reusable = self.policy.decoded_reusable(row.length, row.exact_upto)
        self.rows.regroup(row)
        self.take_token(row, logits[0])

    # Tokens -----------------------------------------------------------------------------------------

    def take_token(self, row: Sequence, logits: np.ndarray, chosen: int | None = None) -> None:
        """Choose the row's next token from ``logits`` (``chosen``: already chosen, as a batch's argmax) and act on
        it."""
        if not self.live(row):
            return
        try:
            token, record = row.sampler.choose(logits) if chosen is None else (chosen, row.sampler.observe(chosen))
        except Exception as error:  # one sequence's sampler or grammar failing ends that sequence only
            self.finish(row, "error", _trace(error))
            return
        self.act(row, token, record)

    def live(self, row: Sequence) -> bool:
        """Whether the row may go on: not cancelled, not past its deadline (else it is finished so)."""
        if row.job.cancelled:
            self.finish(row, "cancelled")
            return False
        if time.monotonic() > row.job.deadline:
            self.finish(row, "timeout")
            return False
        return True

    def act(self, row: Sequence, token: int, record: Any) -> bool:
        """The row's next token is chosen: its text, or the end of the generation. True while the row goes on (the
        token is then its pending one, to be fed to the model)."""
        job = row.job
        try:
            row.generated += 1
            if row.first_token_at is None:
                row.first_token_at = time.monotonic()
            if token in self.model.info.eos_token_ids:
                self.finish(row, "stop")
                return False
            pieces, stopped = row.text.add(token, record)
            failed = row.sampler.guide_failure
        except Exception as error:  # one sequence's text or grammar failing ends that sequence only
            self.finish(row, "error", _trace(error))
            return False
        self._emit(row, pieces)
        if stopped:
            self.finish(row, "stop", flush=False)
        elif failed:
            self.finish(row, "error", f"the grammar cannot continue: {failed}")
        elif row.generated >= job.params.max_tokens or row.length + 1 > self.rows.pool.tokens:
            self.finish(row, "length")
        else:
            row.pending = token
            row.drafter.extend([token])  # drafts continue from the pending token
            return True
        return False

    def fed(self, row: Sequence, rows_in_step: int = 1) -> None:
        """The row's pending token is in: the step just taken wrote its key and value."""
        assert row.pending is not None
        row.tokens.append(row.pending)
        row.length += 1
        row.reusable = self.policy.decoded_reusable(row.length, row.exact_upto)
        row.steps += 1
        row.step_rows += rows_in_step

    def _emit(self, row: Sequence, pieces: list) -> None:
        records = tuple((piece.text, piece.logprob) for piece in pieces if piece.logprob is not None)
        text = "".join(piece.text for piece in pieces)
        if text or records:
            row.job.emit(TextDelta(text, records, row.job.index))

    def finish(self, row: Sequence, reason: str, error: str | None = None, *, flush: bool = True) -> None:
        """End a running sequence: its last text, its report, and its row kept for reuse or freed."""
        if flush and reason in ("stop", "length"):
            self._emit(row, row.text.finish())
        row.stream.close()
        self.ledger.give_back(row.booked)
        if reason == "error" or not self._keep(row):
            self.rows.remove(row)
        now = time.monotonic()
        first = row.first_token_at
        self.publish(row.job, Finished(
            reason=reason, prompt_tokens=len(row.job.prompt), completion_tokens=row.generated,
            time_to_first_token=(first - row.job.submitted_at) if first is not None else None,
            decode_seconds=(now - first) if first is not None else 0.0, error=error, cached_tokens=row.cached,
            index=row.job.index, batch_rows=row.step_rows / row.steps if row.steps else 0.0,
            stop_string=row.text.stop_string, drafted_tokens=row.drafter.drafted,
            accepted_tokens=row.drafter.accepted, draft_checks=row.drafter.checks))

    def _keep(self, row: Sequence) -> bool:
        """Keep a finished row's reusable prefix for later requests; False when it is not worth a row."""
        if row.reusable < MIN_REUSED_TOKENS or row.slot is None:
            return False
        prefix = row.prefix()
        if any(self.policy.covers(prefix, kept.prefix()) for kept in self.ledger.kept):
            return False  # another kept row already serves whatever this one would
        for kept in [kept for kept in self.ledger.kept if self.policy.covers(kept.prefix(), prefix)]:
            self._evict(kept)  # this one serves what they did
        kept = Kept(prefix, row.regime, row.slot, self.ledger.tick(), row.exact_upto)
        if row.slot < self.rows.running:
            try:
                target = self.rows.free_slot(self.rows.running)
            except RowsFull:
                oldest = self.ledger.evictions(0, 1, spare=lambda _: False)
                if not oldest:
                    return False
                self._evict(oldest[0])
                target = self.rows.free_slot(self.rows.running)
            self.rows.leave_running(row, target)
        self.rows.take(row, kept, len(prefix))
        self.ledger.keep(kept)
        over, _ = self.ledger.room_short(0, 0, self.rows.free)
        for old in self.ledger.evictions(over, 0, spare=lambda candidate: candidate is kept) if over else []:
            self._evict(old)
        return True

    def end_request(self, request: Request, reason: str, error: str | None = None) -> None:
        """End every choice of a request that never reached the running rows."""
        for sequence in request.sequences:
            sequence.stream.close()
            self.ledger.give_back(sequence.booked)
            self.rows.remove(sequence)
        for job in request.jobs:
            self.publish(job, Finished(reason, len(job.prompt), 0, None, 0.0, error,
                                       cached_tokens=request.prefilled if request.sequences else 0,
                                       index=job.index))

    def fail_everything(self, detail: str) -> None:
        """After a bug of ours: every request fails with ``detail``, without trusting the rows' bookkeeping; then
        the batch starts over, empty."""
        jobs = [job for request in [*self.waiting, *self.prefilling] for job in request.jobs]
        jobs += [row.job for row in self.rows.occupants() if isinstance(row, Sequence) and row in self._running()]
        for job in jobs:
            self.publish(job, Finished("error", len(job.prompt), 0, None, 0.0, detail, index=job.index))
        self.waiting.clear()
        self.prefilling.clear()
        self.rows.clear()
        self.ledger.reset()

    def _running(self) -> list[Sequence]:
        return self.rows.group(0, self.rows.running)

    def cancel_everything(self, reason: str, error: str | None = None) -> None:
        """End whatever waits, prefills or runs (the engine stops, or failed)."""
        for request in list(self.waiting) + list(self.prefilling):
            self.end_request(request, reason, error)
        self.waiting.clear()
        self.prefilling.clear()
        for row in [row for row in self.rows.occupants() if isinstance(row, Sequence)]:
            self.finish(row, reason, error)
        for kept in list(self.ledger.kept):
            self._evict(kept)
