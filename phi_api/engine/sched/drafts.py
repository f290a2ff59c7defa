"""Drafts from a draft model: a small model of the same vocabulary guesses a row's next tokens, greedily.

llama.cpp's server (``-md``) and LM Studio pair a model with a smaller one of its family (Qwen3-0.6B for Qwen3-8B,
Llama-3.2-1B for 3B, Gemma 3 270M for 1B and 4B); the small model's greedy tokens are a draft the big one checks in
one step (:mod:`engine.sched.verify`), as a draft copied from the prompt is. A greedy draft is one fixed token per
position, so the speculative sampling rule :meth:`engine.sampling.logits.Sampler.verify` applies keeps the big
model's distribution.

The draft model runs on the engine thread, in a session and a key/value pool of its own
(:class:`DraftModel`). A sequence that drafts from it holds one of the pool's rows (:class:`DraftRow`) from its
first draft to its end, and the row holds at most :data:`WINDOW` tokens: the end of the sequence, where a draft's
next tokens are decided, fed again from half a window back whenever the sequence outgrows it. So a row's memory is
bounded whatever the context; it is booked in the worker's key/value budget beside the rows, never making anything
else leave: without room, the sequence drafts as it would without a draft model. Each row steps alone (a batch of
one): its draft is the same whatever else runs. So it drafts only for a request alone in its batched step
(:meth:`engine.sched.verify.Speculation.advance`; but beside others too where rows check their drafts as alone):
beside other rows, every row's own draft steps would hold up the whole batch (draft steps batched over the rows:
not built); n-grams still draft there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.kv.ledger import row_bytes
from phi_api.engine.runtime.model import Model
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.session import ORT_ERRORS, Decoder

log = logging.getLogger(__name__)
WINDOW = 1024  # the most tokens of a sequence's end the draft model holds for it
_DECAY = 0.9  # the weight of the drafts before, at each new one
_RETRY_EVERY = 1024  # drafts passed over as not paying, between two asked for anyway (each may feed a prompt)
_DRAFT_ROOM = 64  # beyond the window: a draft's own tokens (SPECULATIVE_DRAFT_MAX is at most 64)


def vocabulary_mismatch(model: Model, draft: Model) -> str | None:
    """Why ``draft`` cannot draft for ``model`` (None: it can): each of its token ids must stand for the same bytes
    in the model's vocabulary (the pairs peers run share a tokenizer: Qwen3-0.6B and Qwen3-8B, Llama-3.2-1B and 3B,
    Gemma 3 270M and 4B; the model may have tokens of its own besides, which the draft never proposes)."""
    ours, theirs = model.token_bytes, draft.token_bytes
    differ = sorted(token for token, text in theirs.items() if ours.get(token) != text)
    if not differ:
        return None
    return (f"its vocabulary differs from the model's: {len(differ)} of its {len(theirs)} token ids stand for other "
            f"text there, or for none (the first: id {differ[0]})")


class DraftModel:
    """The draft model's session and pool on this engine thread: ``rows`` rows, each booked in ``memory`` (the
    worker's key/value budget) while a sequence holds it; ``chunk``: the most tokens fed in one step (a step's
    logits for every fed token are held at once); ``vocab``: the big model's logits width (a draft is one of its
    tokens)."""

    def __init__(self, model: Model, threads: int, rows: int, memory: SharedBudget, chunk: int, vocab: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.decoder: Decoder = model.new_decoder(threads)
        self.clock = clock
        self._seconds = self._tokens = 0.0  # the time its drafts took, feeding included, and their tokens (decaying)
        self._passed = 0  # drafts it was not asked for since it last drafted, as not paying
        self.pool = KVPool(self.decoder.spec, rows, WINDOW + _DRAFT_ROOM)
        self.memory, self.chunk, self.vocab = memory, chunk, vocab
        self.row_bytes = row_bytes(self.decoder.spec, self.pool.tokens)
        self._free = list(reversed(range(rows)))

    def open(self) -> DraftRow | None:
        """A row for one sequence, booked; None when every row is taken or the budget has no room for one."""
        if not self._free or not self.memory.stage(self.row_bytes):
            return None
        return DraftRow(self, self._free.pop())

    @property
    def seconds_per_token(self) -> float | None:
        """A draft token's time, what the rows fed first included (a sequence's prompt, once): the recent drafts'
        time over their tokens (None before any)."""
        return self._seconds / self._tokens if self._tokens else None

    def timed(self, seconds: float, tokens: int) -> None:
        """A draft of ``tokens`` tokens took ``seconds``, feeding included."""
        self._seconds = _DECAY * self._seconds + seconds
        self._tokens = _DECAY * self._tokens + tokens
        self._passed = 0

    def passed(self) -> bool:
        """It was not asked for a draft, as not paying: whether to ask it anyway (one such draft in
        :data:`_RETRY_EVERY`: each may feed a sequence's prompt first), so that its time is measured again where things
        have changed."""
        self._passed += 1
        return self._passed % _RETRY_EVERY == 0

    def give_back(self, row: int) -> None:
        self.pool.release(row)
        self._free.append(row)
        self.memory.unstage(self.row_bytes)

    def close(self) -> None:
        """Free the session's bindings and the pool (every row given back first)."""
        self.decoder.unbind()
        self.pool.close()


class DraftRow:
    """One sequence's row of the draft model: which of its tokens the row holds, from where."""

    def __init__(self, owner: DraftModel, row: int) -> None:
        self.owner, self.row = owner, row
        self.start = 0  # the sequence's token at the row's position 0
        self.held: list[int] = []  # the tokens whose keys and values the row holds
        self.closed = False
        self.failed = False  # its session failed once: no more drafts for this sequence

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """The draft model's greedy next ``limit`` tokens after ``tokens`` (the sequence so far); none once its
        session has failed for this sequence (which goes on without it: a draft is only ever a guess)."""
        owner = self.owner
        if self.failed:
            return []
        started = owner.clock()
        try:
            draft = self._propose(tokens, limit)
        except ORT_ERRORS as error:
            log.warning("the draft model failed (%s: %s): the sequence goes on without its drafts",
                        type(error).__name__, error)
            self.failed = True
            return []
        owner.timed(owner.clock() - started, len(draft))
        return draft

    def _propose(self, tokens: list[int], limit: int) -> list[int]:
        owner = self.owner
        if len(tokens) - self.start + limit > WINDOW + _DRAFT_ROOM - 1:  # outgrown: from half a window back
            self.start, self.held = max(0, len(tokens) - WINDOW // 2), []
        view = tokens[self.start:]
        same = 0
        for held, token in zip(self.held, view, strict=False):
            if held != token:
                break
            same += 1
        same = min(same, len(view) - 1)  # the last token fed again: its logits are the next token's
        logits = None
        for begin in range(same, len(view), owner.chunk):
            ids = np.array([view[begin:begin + owner.chunk]], dtype=np.int64)
            logits = owner.decoder.step(owner.pool, self.row, ids, np.array([begin]), prefill=ids.shape[1] > 1)[0]
        assert logits is not None, "a sequence always has a token to feed"
        draft = [int(np.argmax(logits[:owner.vocab]))]
        while len(draft) < limit:
            ids = np.array([[draft[-1]]], dtype=np.int64)
            logits = owner.decoder.step(owner.pool, self.row, ids, np.array([len(view) + len(draft) - 1]),
                                        prefill=False)[0]
            draft.append(int(np.argmax(logits[:owner.vocab])))
        self.held = view + draft[:-1]
        return draft

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.give_back(self.row)
