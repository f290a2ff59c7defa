"""What a step's results do to the sequences: tokens chosen, text streamed, generations ended and reported.

The batch (:mod:`engine.sched.continuous`) and speculation (:mod:`engine.sched.verify`)
both hand the logits they computed here: one token at a time, every token goes
through the same checks (cancellation, deadline, end of sequence, stop
strings, ``max_tokens``, the grammar), so a token from a draft's check ends a
generation exactly where a token from a batched step would.

Everything here runs on the engine thread; it reports through ``publish``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from phi_api.engine.choice import Choice, Finished, TextDelta
from phi_api.engine.kv.cache import KVCache
from phi_api.engine.kv.sequence import Phase, Request, Sequence
from phi_api.engine.sampling.logits import TokenLogprob
from phi_api.engine.sampling.lookup import HEADER_TOKENS, Histories

Publish = Callable[[Choice, Finished], None]


def trace(error: BaseException) -> str:
    """An exception's traceback, for the log line of the generation it ended."""
    return "".join(traceback.format_exception(error))


class Outputs:
    """Applies chosen tokens to sequences and ends them."""

    def __init__(self, eos_token_ids: Any, kv: KVCache, publish: Publish, histories: Histories) -> None:
        self.eos_token_ids = eos_token_ids
        self.kv = kv
        self.publish = publish
        self.histories = histories  # each key's answers, to draft from (those that end here join it)

    def take_token(self, row: Sequence, logits: np.ndarray, chosen: int | None = None) -> None:
        """Choose the row's next token from ``logits`` (``chosen``: already chosen, as a batch's argmax) and accept
        it."""
        if not self.still_wanted(row):
            return
        try:
            token, record = row.sampler.choose(logits) if chosen is None else (chosen, row.sampler.observe(chosen))
        except Exception as error:  # one sequence's sampler or grammar failing ends that sequence only
            self.finish(row, "error", trace(error))
            return
        self.accept(row, token, record)

    def still_wanted(self, row: Sequence) -> bool:
        """Whether the row may go on: not cancelled, not past its deadline (else it is finished so)."""
        if row.choice.cancelled:
            self.finish(row, "cancelled")
            return False
        if time.monotonic() > row.choice.deadline:
            self.finish(row, "timeout")
            return False
        return True

    def accept(self, row: Sequence, token: int, record: TokenLogprob | None) -> bool:
        """The row's next token is chosen: its text, or the end of the generation. True while the row goes on (the
        token is then its pending one, to be fed to the model)."""
        try:
            row.generated += 1
            if row.first_token_at is None:
                row.first_token_at = time.monotonic()
            # before the end of sequence: a grammar at a dead end offers only that (llguidance's error mask)
            failed = row.sampler.guide_failure
            if failed:
                self.finish(row, "grammar", f"the grammar cannot continue: {failed}")
                return False
            if token in self.eos_token_ids:
                self.finish(row, "stop", last=record)
                return False
            pieces, stopped = row.text.add(token, record)
        except Exception as error:  # one sequence's text or grammar failing ends that sequence only
            self.finish(row, "error", trace(error))
            return False
        self.emit(row, pieces)
        if stopped:
            self.finish(row, "stop", flush=False)
        elif row.generated >= row.choice.params.max_tokens or row.length + 1 > self.kv.pool.tokens:
            self.finish(row, "length")
        else:
            row.pending = token
            row.drafter.extend([token])  # drafts continue from the pending token
            return True
        return False

    def emit(self, row: Sequence, pieces: list) -> None:
        records = tuple((piece.text, piece.logprob) for piece in pieces if piece.logprob is not None)
        text = "".join(piece.text for piece in pieces)
        if text or records:
            row.choice.emit(TextDelta(text, records, row.choice.index))

    def finish(self, row: Sequence, reason: str, error: str | None = None, *, flush: bool = True,
               last: TokenLogprob | None = None) -> None:
        """End a running sequence: its last text, its report, and its row kept for reuse or freed. ``last``: the
        end-of-sequence token's log-probability, which adds no text but is a generated token as usage counts it
        (lm-eval's loglikelihood reads the continuation's last token before it; vLLM lists it too)."""
        if flush and reason in ("stop", "length"):
            self.emit(row, row.text.finish())
        if last is not None:
            row.choice.emit(TextDelta("", (("", last),), row.choice.index))
        row.stream.close()
        row.drafter.close()
        row.phase = Phase.FINISHED
        if reason in ("stop", "length"):  # with the tokens that opened it (engine.sampling.lookup)
            self.histories.add(row.cache_key, row.tokens[max(0, len(row.choice.prompt) - HEADER_TOKENS):])
        self.kv.release(row, keep=reason != "error")
        now = time.monotonic()
        first = row.first_token_at
        self.publish(row.choice, Finished(
            reason=reason, prompt_tokens=len(row.choice.prompt), completion_tokens=row.generated,
            time_to_first_token=(first - row.choice.submitted_at) if first is not None else None,
            decode_seconds=(now - first) if first is not None else 0.0, error=error, cached_tokens=row.cached,
            index=row.choice.index, batch_rows=row.step_rows / row.steps if row.steps else 0.0,
            stop_string=row.text.stop_string, drafted_tokens=row.drafter.drafted,
            accepted_tokens=row.drafter.accepted, draft_checks=row.drafter.checks,
            draft_checks_beside=row.drafter.checks_beside,
            draft_sources=tuple((source, counted.checked, counted.kept)
                               for source, counted in row.drafter.sources.items()),
            queue_seconds=_waited(row.choice), first_of_prompt=row.choice.first_of_prompt))

    def end_request(self, request: Request, reason: str, error: str | None = None) -> None:
        """End every choice of a request that never reached the running rows; of one whose start failed half-way
        (:meth:`phi_api.engine.sched.endings.Endings.fail_request`), those not ended yet: those that joined the running
        rows as :meth:`finish` ends them, the others (a row placed or not, booked) here."""
        ended = set()
        for sequence in request.sequences:
            if sequence.phase is Phase.RUNNING:
                self.finish(sequence, reason, error)
            if sequence.phase is Phase.FINISHED:
                ended.add(id(sequence.choice))
                continue
            sequence.phase = Phase.FINISHED
            sequence.stream.close()
            self.kv.ledger.give_back(sequence.booked)
            self.kv.rows.remove(sequence)
        for choice in (choice for choice in request.choices if id(choice) not in ended):
            self.publish(choice, Finished(reason, len(choice.prompt), 0, None, 0.0, error,
                                       cached_tokens=request.prefilled if request.sequences else 0,
                                       index=choice.index, queue_seconds=_waited(choice),
                                       first_of_prompt=choice.first_of_prompt))


def _waited(choice: Choice) -> float | None:
    """How long ``choice``'s request waited to start (None: it never started)."""
    return choice.started_at - choice.submitted_at if choice.started_at is not None else None
