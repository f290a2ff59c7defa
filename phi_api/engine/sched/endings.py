"""How a batch's generations end when they cannot go on: one request or one sequence after a bug of ours while
handling it (the rest of the batch goes on), every request after a bug that cannot be pinned on one, or all of them
when the engine stops.

Everything here runs on the engine thread.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from phi_api.engine.choice import Finished
from phi_api.engine.kv.cache import KVCache
from phi_api.engine.kv.sequence import Phase, Request, Sequence
from phi_api.engine.sched.outputs import Outputs, Publish


@dataclass(frozen=True)
class Endings:
    """The ends of a batch's generations that are not their own: its queues, its rows and books, its outputs."""

    waiting: collections.deque[Request]
    prefilling: list[Request]
    kv: KVCache
    outputs: Outputs
    publish: Publish

    def fail_request(self, request: Request, detail: str) -> None:
        """After a bug of ours while handling one request (its prompt chunk, its start, its first tokens): its
        choices not ended yet end with "error", giving their rows and bookings back, wherever its start had got to;
        the rest of the batch goes on. Should the books not hold afterwards, the error reaches the loop (which
        fails everything)."""
        if request in self.prefilling:
            self.prefilling.remove(request)
        self.outputs.end_request(request, "error", detail)
        self._books_hold()

    def fail_row(self, row: Sequence, detail: str) -> None:
        """After a bug of ours while handling one running sequence's tokens: it ends with "error" (as a failing
        sampler ends it), the rest goes on."""
        if row.phase is Phase.RUNNING:
            self.outputs.finish(row, "error", detail)
        self._books_hold()

    def _books_hold(self) -> None:
        """The rows' layout and the bookings agree with what prefills and runs (else: AssertionError)."""
        self.kv.rows.check()
        active = [*self.kv.rows.group(0, self.kv.rows.running),
                  *(sequence for request in self.prefilling for sequence in request.sequences)]
        assert self.kv.ledger.active_rows == len(active), (self.kv.ledger.active_rows, len(active))

    def fail_everything(self, detail: str) -> None:
        """After a bug of ours that no one request explains: every request fails with ``detail``, without trusting
        the rows' bookkeeping (a request caught half-way between the lists, whose sequences hold rows, included);
        then the batch starts over, empty."""
        choices = {id(choice): choice
                   for request in [*self.waiting, *self.prefilling] for choice in request.choices}
        for row in self.kv.rows.occupants():
            if isinstance(row, Sequence) and row.phase is not Phase.FINISHED:
                choices.setdefault(id(row.choice), row.choice)
        for choice in choices.values():
            self.publish(choice, Finished("error", len(choice.prompt), 0, None, 0.0, detail, index=choice.index,
                                           first_of_prompt=choice.first_of_prompt))
        self.waiting.clear()
        self.prefilling.clear()
        self.kv.rows.clear()
        self.kv.ledger.reset()

    def cancel_everything(self, reason: str, error: str | None = None) -> None:
        """End whatever waits, prefills or runs (the engine stops, or failed)."""
        for request in list(self.waiting) + list(self.prefilling):
            self.outputs.end_request(request, reason, error)
        self.waiting.clear()
        self.prefilling.clear()
        for row in [row for row in self.kv.rows.occupants() if isinstance(row, Sequence)]:
            self.outputs.finish(row, reason, error)
        self.kv.evict_all()
