"""The batch driven iteration by iteration, synchronously, on the fake model: no engine thread, no gevent.

Each test builds a :class:`ContinuousBatch` as the engine loop does, queues requests, calls
:meth:`ContinuousBatch.iterate` and looks at what the fake decoder was asked (``script.steps``, ``script.chunks``)
and what was published. The batch's invariants (:meth:`ContinuousBatch.check`) are checked after every iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from phi_api.engine.choice import Choice, Finished
from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.kv.ledger import Ledger, row_bytes
from phi_api.engine.kv.reuse import ReusePolicy
from phi_api.engine.kv.sequence import Kept, Phase, Request
from phi_api.engine.params import SamplingParams
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.sched.continuous import ContinuousBatch
from phi_api.engine.sched.prefill import ChunkPlanner
from phi_api.engine.sched.stepcost import StepCosts
from tests.support.fakes import EOS, FakeModel, Script, text_pieces

PIECES = text_pieces(b"a", b"b", b"c")


@dataclass
class Bench:
    """A batch, its fake model's script, and what it published."""

    batch: ContinuousBatch
    script: Script
    chunk: int
    finished: list[tuple[Choice, Finished]] = field(default_factory=list)
    arrivals: int = 0

    def submit(self, prompt, n: int = 1, priority: int = 0, cache_key: str = "", **params) -> list[Choice]:
        params = {"max_tokens": 4, "temperature": 0.0, **params}
        tokens = np.asarray(prompt, dtype=np.int32)
        choices = [Choice(tokens, SamplingParams(**params), timeout=60, notify=lambda: None, index=index,
                          priority=priority, cache_key=cache_key) for index in range(n)]
        self.arrivals += 1
        self.batch.waiting.append(Request(choices, self.batch.model, self.chunk, None, self.arrivals))
        return choices

    def iterate(self, times: int = 1) -> None:
        for _ in range(times):
            self.batch.iterate()
            self.batch.check()

    def run(self, limit: int = 500) -> None:
        for _ in range(limit):
            if self.batch.idle:
                return
            self.iterate()
        raise AssertionError("the batch never went idle")

    def reasons(self) -> list[str]:
        return [finished.reason for _, finished in self.finished]


def bench(tokens=(1, 2, 3), *, chunk: int = 4, budget: int = 1 << 20, max_rows: int = 8, mode: str = "on",
          draft_max: int = 0, shared: SharedBudget | None = None, name: str = "", invariant: bool = False,
          decoder: Any = None, row_wise: bool = False) -> Bench:
    """A batch as the engine loop makes one (``shared``: the worker's budget it books from, with others;
    ``decoder``: one of the tests' own, instead of the fake model's; ``row_wise``: the fake graph computes each token
    on its own)."""
    script = Script(list(tokens))
    model = FakeModel(script, PIECES, row_wise=row_wise)
    decoder = decoder or model.new_decoder(1)
    ledger = Ledger(decoder.spec, budget, max_rows, model.info.context_length, shared=shared, name=name)
    pool = KVPool(decoder.spec, 2 * max_rows + 1, ledger.row_tokens + 1)
    policy = ReusePolicy(mode, chunk, decoder.spec.row_wise)
    planner = ChunkPlanner.serving(policy, invariant=invariant, slice_seconds=0.2, costs=StepCosts(script.clock))
    made = Bench(None, script, chunk)  # type: ignore[arg-type]
    made.batch = ContinuousBatch(model, decoder, pool, ledger, policy, planner,
                       lambda choice, finished: made.finished.append((choice, finished)), draft_max=draft_max,
                       invariant=invariant)
    return made


def test_a_request_is_admitted_prefilled_in_chunks_then_decodes_one_token_a_step():
    b = bench()
    b.submit(np.arange(1, 11), max_tokens=3)
    b.iterate()  # admitted, first chunk
    assert b.script.chunks == [(0, 4)] and b.batch.prefilling and not b.batch.rows.running
    b.iterate(2)  # the rest of the prompt: its last chunk starts it running, and it decodes in the same iteration
    assert b.script.chunks == [(0, 4), (4, 4), (8, 2)]
    assert b.script.steps[-1] == "decode:1" and b.batch.rows.running == 1
    b.run()
    assert b.reasons() == ["length"] and b.finished[0][1].completion_tokens == 3


def test_admission_waits_for_room_in_arrival_order():
    tokens = 10 + 40  # prompt + max_tokens: each request books a row of 50 tokens
    b = bench(budget=row_bytes(bench().batch.decoder.spec, tokens) * 2, mode="off")
    for first in (1, 11, 21):
        b.submit(np.arange(first, first + 10), max_tokens=40)
    b.iterate()
    assert len(b.batch.prefilling) == 2 and len(b.batch.waiting) == 1  # two fit; the third waits
    b.run()
    assert b.reasons() == ["length"] * 3


def test_a_request_that_cannot_fit_even_alone_ends_with_an_error():
    b = bench(budget=row_bytes(bench().batch.decoder.spec, 20), mode="off")
    b.submit(np.arange(1, 11), max_tokens=100)
    b.iterate()
    assert b.reasons() == ["capacity"]


def test_n_choices_share_one_prefill_then_run_as_rows():
    b = bench()
    b.submit(np.arange(1, 9), n=3, max_tokens=5)
    b.iterate(2)
    assert [step for step in b.script.steps if step.startswith("prefill")] == ["prefill:4", "prefill:4"]
    assert b.batch.rows.running == 3 and b.script.steps[-1] == "decode:3"
    b.run()
    assert sorted(choice.index for choice, _ in b.finished) == [0, 1, 2]


def test_a_finished_row_is_kept_and_the_next_turn_resumes_from_it():
    b = bench(tokens=[1, 2, 3, EOS])
    conversation = np.arange(1, 25)
    b.submit(conversation, max_tokens=8)
    b.run()
    kept = [item for item in b.batch.rows.occupants() if isinstance(item, Kept)]
    assert len(kept) == 1 and len(kept[0].tokens) >= 24
    answer = [1, 2, 3]
    b.submit(np.concatenate([conversation, answer, [40, 41, 42, 43, 44]]), max_tokens=1)
    b.run()
    assert b.finished[-1][1].cached_tokens >= 24  # the conversation and the answer were not computed again


@pytest.mark.parametrize(("row_wise", "next_turn", "again"), [(True, [(27, 3)], [(23, 1)]),
                                                             (False, [(27, 1), (28, 2)], [(20, 4)])])
def test_where_cuts_are_free_a_turn_resumes_where_its_prefix_ends_in_one_chunk(row_wise, next_turn, again):
    """On a graph computing each token on its own, the next turn goes in one chunk from the end of the last answer,
    and the same prompt sent again computes its last token only; elsewhere (batch-invariant) both keep the grid of
    4-token chunks the first prompt was cut on, so that they compute as it did."""
    conversation = np.arange(1, 25)
    for follow_up, chunks in ((np.concatenate([conversation, [1, 2, 3], [40, 41, 42]]), next_turn),
                              (conversation, again)):
        b = bench(tokens=[1, 2, 3, EOS], invariant=True, row_wise=row_wise)
        b.submit(conversation, max_tokens=8)
        b.run()
        before = len(b.script.chunks)
        b.submit(follow_up, max_tokens=1)
        b.run()
        assert b.script.chunks[before:] == chunks


def test_a_kept_prefix_serves_only_requests_of_its_own_cache_key():
    b = bench(tokens=[1, 2, 3, EOS])
    conversation = np.arange(1, 25)
    b.submit(conversation, max_tokens=8, cache_key="team-a")
    b.run()
    follow_up = np.concatenate([conversation, [40, 41, 42, 43, 44]])
    b.submit(follow_up, max_tokens=1, cache_key="team-b")
    b.run()
    assert b.finished[-1][1].cached_tokens == 0  # another key's prefix is neither reused nor seen
    b.submit(follow_up, max_tokens=1, cache_key="team-a")
    b.run()
    assert b.finished[-1][1].cached_tokens >= 24
    kept = {item.cache_key for item in b.batch.rows.occupants() if isinstance(item, Kept)}
    assert kept == {"team-a", "team-b"}  # each key's row kept apart: one does not stand in for the other


@pytest.mark.parametrize(("second_key", "reused"), [("team-a", True), ("team-b", False)])
def test_a_prompt_being_prefilled_is_shared_only_with_requests_of_its_own_cache_key(second_key, reused):
    b = bench(tokens=[1, 2, 3, EOS])
    shared = np.arange(1, 40)
    b.submit(shared, max_tokens=1, cache_key="team-a")
    b.submit(shared, max_tokens=1, cache_key=second_key)  # arrives while the first is being prefilled
    b.run()
    cached = {choice.cache_key + str(index): finished.cached_tokens for index, (choice, finished) in
              enumerate(b.finished)}
    assert (max(cached.values()) > 0) == reused, cached


def test_kept_prefixes_leave_least_recently_used_first_when_a_request_needs_room():
    spec = bench().batch.decoder.spec
    b = bench(tokens=[EOS], budget=row_bytes(spec, 40) * 2)
    for first in (1, 21):  # two conversations, each kept after it ends
        b.submit(np.arange(first, first + 20), max_tokens=1)
        b.run()
    assert sorted(int(kept.tokens[0]) for kept in b.batch.ledger.kept) == [1, 21]
    b.submit(np.arange(41, 61), max_tokens=20)  # needs the room of one kept prefix: the older one leaves
    b.iterate()
    assert [int(kept.tokens[0]) for kept in b.batch.ledger.kept] == [21]


def test_a_cancelled_request_ends_before_its_next_chunk_and_frees_its_booking():
    b = bench()
    choices = b.submit(np.arange(1, 21), max_tokens=4)
    b.iterate()
    choices[0].cancel()
    b.iterate()
    assert b.reasons() == ["cancelled"] and b.batch.ledger.reserved == 0 and not b.batch.prefilling


def test_a_sequence_moves_through_its_phases():
    b = bench()
    b.submit(np.arange(1, 9), max_tokens=5)
    b.iterate()
    leader = b.batch.prefilling[0].leader
    assert leader.phase is Phase.PREFILLING
    b.iterate()
    assert leader.phase is Phase.RUNNING
    b.run()
    assert leader.phase is Phase.FINISHED


def test_speculation_keeps_draft_tokens_through_the_same_output_handling():
    # The prompt repeats "1 2 3": the drafter proposes the continuation the script then writes.
    b = bench(tokens=[1, 2, 3], draft_max=4)
    b.submit(np.array([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]), max_tokens=9)
    b.run()
    [(_, finished)] = b.finished
    assert finished.reason == "length" and finished.completion_tokens == 9  # drafts never carry it past
    assert finished.accepted_tokens > 0 and finished.draft_checks > 0
    assert any(step.startswith("check") for step in b.script.steps)


def test_a_prompt_that_has_waited_long_goes_in_whole_chunks_not_time_slices():
    from phi_api.engine.sched.scheduler import WHOLE_CHUNKS_AFTER

    b = bench(chunk=64, mode="off")
    b.script.step_seconds, b.script.token_seconds = 0.1, 0.01  # a 0.2 s slice holds 10 prompt tokens
    b.submit(np.arange(1, 21) % 60 + 1, max_tokens=2)  # the batch learns its step costs
    b.run()
    b.submit(np.arange(1, 301) % 60 + 1, max_tokens=1)
    [running] = b.submit(np.arange(5, 9), max_tokens=50)  # another request runs: the long prompt is sliced
    b.iterate(3)
    sliced = b.script.chunks[-1][1]
    long_request = next(request for request in b.batch.prefilling if len(request.prompt) == 300)
    long_request.choices[0].submitted_at -= WHOLE_CHUNKS_AFTER  # it has now waited long enough
    b.iterate()
    start, length = b.script.chunks[-1]
    assert sliced == 10 and length > sliced and (start + length) % 64 == 0  # to the end of its whole chunk
    running.cancel()
    b.run()


def test_waiting_requests_start_by_priority_then_in_arrival_order():
    tokens = 10 + 40  # prompt + max_tokens: each request books a row of 50 tokens, two fit
    b = bench(budget=row_bytes(bench().batch.decoder.spec, tokens) * 2, mode="off")
    low = [b.submit(np.arange(first, first + 10), max_tokens=40, priority=5) for first in (1, 11)]
    b.iterate()  # both low-priority requests fit and start
    later = b.submit(np.arange(21, 31), max_tokens=40, priority=5)
    urgent = b.submit(np.arange(31, 41), max_tokens=40, priority=-1)
    b.run()
    order = [choice for choice, _ in b.finished]
    assert order.index(urgent[0]) < order.index(later[0])  # it arrived last, and started before the other waiter
    assert {id(choice) for choice in order[:2]} == {id(low[0][0]), id(low[1][0])}


def test_the_next_prompt_chunk_goes_to_the_first_priority():
    b = bench(chunk=4, mode="off")
    b.submit(np.arange(1, 41), max_tokens=1, priority=1)  # long, low priority, first
    b.iterate()
    b.submit(np.arange(41, 61), max_tokens=1, priority=0)  # arrives while the other prefills
    b.run()
    firsts = b.script.chunk_firsts
    urgent_chunks = [index for index, first in enumerate(firsts) if 41 <= first < 61]
    other_chunks = [index for index, first in enumerate(firsts) if first < 41]
    assert len(urgent_chunks) == 5 and urgent_chunks == list(range(1, 6))  # every chunk of it, at once
    assert len(other_chunks) == 10 and other_chunks[0] == 0
