"""The scheduling decisions of one engine's batch: which waiting requests start, and which prompt is prefilled next.

- Priority (a request's ``priority``, lower first, as vLLM's): the waiting
  start, and the prefilling get their chunks, by priority first, then as
  below; running sequences all advance together whatever their priority.
- Admission: waiting requests start in arrival order while they fit the
  key/value budget (:mod:`engine.kv.cache` makes room by giving up kept
  prefixes); each starts from the longest prefix any row holds. One that can
  never fit, with nothing else in progress, ends with an error (the service
  refuses those before they are queued); one that could fit later waits, and
  so do those behind it.
- The next prompt chunk: the prompt with the least left, but never twice in a
  row ahead of the oldest, so that no prompt waits forever behind a stream of
  shorter ones; a prompt that has waited ``WHOLE_CHUNKS_AFTER`` seconds goes
  in whole chunks rather than time slices; a request waiting for an older one to compute the prefix it
  will copy is passed over; how long the chunk is, :mod:`engine.sched.prefill` says.

Everything here runs on the engine thread.
"""

from __future__ import annotations

import collections
import time
from typing import NamedTuple

from phi_api.engine.kv.cache import KVCache, OnDisk
from phi_api.engine.kv.reuse import Occupant, common_prefix
from phi_api.engine.kv.sequence import LONG, Request, Sequence
from phi_api.engine.runtime.model import Model
from phi_api.engine.sampling.draft import DraftModelSource
from phi_api.engine.sched.outputs import Outputs, trace
from phi_api.engine.sched.prefill import ChunkPlanner

# A prompt that has waited this long is prefilled in whole chunks: in time slices between decode steps, a long
# prompt at Phi-3.5-mini's size waited minutes under a mixed load (docs/engine.md).
WHOLE_CHUNKS_AFTER = 30.0


class Chunk(NamedTuple):
    """A prompt chunk planned for this iteration: tokens ``[start, end)`` of ``request``'s prompt."""

    request: Request
    start: int
    end: int


class Scheduler:
    """The waiting and prefilling requests of a batch, and the decisions about them."""

    def __init__(self, model: Model, kv: KVCache, planner: ChunkPlanner, outputs: Outputs, draft_max: int = 0,
                 drafts: DraftModelSource | None = None) -> None:
        self.model = model
        self.kv = kv
        self.planner = planner
        self.outputs = outputs
        self.drafts = drafts  # the draft model, if any (engine.sched.drafts)
        self.draft_max = draft_max  # SPECULATIVE_DRAFT_MAX: how far a sequence may draft, unless its request says
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: list[Request] = []
        self.passed_oldest = False  # whether the last prompt chunk was a shorter prompt's, ahead of the oldest

    def plan_chunk(self) -> Chunk | None:
        """The prompt chunk this iteration computes: the next prompt's (:meth:`next_prompt`), from the longest prefix
        any row now holds, as long as :mod:`engine.sched.prefill` says; None when that request has ended meanwhile."""
        request = self.next_prompt()
        self.prefilling.remove(request)
        ended = request.over()
        if ended:
            self.outputs.end_request(request, ended)
            return None
        if request.prompt_logprobs is None:
            self.kv.catch_up(request)
        # A prompt that has waited long goes in whole chunks, not in slices of the time others wait for.
        waited = time.monotonic() - request.choices[0].submitted_at
        crowded = bool(self.kv.rows.running or self.prefilling or self.waiting) and waited < WHOLE_CHUNKS_AFTER
        end = self.planner.end(request.prefilled, len(request.prompt), request.first_chunk, crowded)
        return Chunk(request, request.prefilled, end)

    def admit(self) -> None:
        """Start the waiting requests, by priority then in order, while they fit."""
        if len(self.waiting) > 1:
            ordered = sorted(self.waiting, key=lambda request: (request.priority, request.order))
            self.waiting.clear()
            self.waiting.extend(ordered)
        while self.waiting:
            request = self.waiting[0]
            ended = request.over()
            if ended:
                self.waiting.popleft()
                self.outputs.end_request(request, ended)
                continue
            source: Occupant | OnDisk | None
            source, point = self.kv.source(request)
            stored = self.kv.stored(request, point)
            if stored:
                source, point = OnDisk(stored), stored
            with self.kv.ledger.shared.lock:  # decided and booked at once: other engines book the same budget
                fits = self.kv.make_room(request, source, self.promised_rows())
                if fits:
                    self.waiting.popleft()
                    self.start(request, source, point)
                    continue
            if self.nothing_in_progress() and self._never_fits(request):
                self.waiting.popleft()  # the service refuses these before they are queued
                self.outputs.end_request(request, "capacity")
                continue
            return

    def _never_fits(self, request: Request) -> bool:
        """Whether ``request`` could not run even with no other request of any engine running."""
        ledger = self.kv.ledger
        return (len(request.choices) > ledger.max_rows
                or len(request.choices) * ledger.reserve_bytes(request.reserve) > ledger.budget)

    def promised_rows(self) -> int:
        """Rows the requests still prefilling will take when their prompt is in: one for each choice but the leader
        (which holds its row already). Admission leaves them free, or a prompt would be in with nowhere to run."""
        return sum(len(request.sequences) - 1 for request in self.prefilling)

    def nothing_in_progress(self) -> bool:
        """Whether no request of this engine prefills or runs."""
        return not (self.prefilling or self.kv.rows.running)

    def start(self, request: Request, source: Occupant | OnDisk | None, point: int) -> None:
        """Give an admitted request its sequences and its leader's row, starting from ``source``'s prefix."""
        try:
            request.sequences = [Sequence(choice, self.model, self.draft_max, request.order,
                                          self.outputs.histories.of(choice.cache_key), self.drafts)
                                 for choice in request.choices]
        except Exception as error:  # a stream or sampler that cannot be made ends this request only
            self.outputs.end_request(request, "error", trace(error))
            return
        for sequence in request.sequences:
            sequence.booked = self.kv.ledger.take(sequence.reserve)
            sequence.choice.started_at = time.monotonic()
        request.leader.long = request.regime == LONG
        request.prefilled = self.kv.start_from(request.leader, source, point)
        self.prefilling.append(request)

    def next_prompt(self) -> Request:
        """The prompt whose chunk comes next, among those of the first priority: the one with the least left (short
        questions answer soon), but never twice in a row ahead of the oldest (so no prompt waits forever behind a
        stream of shorter ones: it gets at least every other chunk); passing over those waiting for an older
        request's prefix (:meth:`_defers`)."""
        candidates = [candidate for candidate in self.prefilling if not self._defers(candidate)]
        first = min(candidate.priority for candidate in candidates)
        candidates = [candidate for candidate in candidates if candidate.priority == first]
        oldest = min(candidates, key=lambda r: r.order)
        shortest = min(candidates, key=lambda r: (r.remaining, r.order))
        if shortest is oldest or self.passed_oldest:
            self.passed_oldest = False
            return oldest
        self.passed_oldest = True
        return shortest

    def _defers(self, request: Request) -> bool:
        """Whether an older request still prefilling is computing a prefix this one will copy instead (a system
        prompt shared by a burst of requests is computed once)."""
        if not self.kv.policy.enabled or request.prompt_logprobs is not None:
            return False
        for other in self.prefilling:
            if other.order >= request.order or other.regime != request.regime or other.cache_key != request.cache_key:
                continue
            point = self.kv.policy.resume_point(common_prefix(other.prompt, request.prompt), len(request.prompt),
                                             request.first_chunk)
            if point > request.prefilled and other.prefilled < point:
                return True
        return False
