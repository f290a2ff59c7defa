"""Drafts from a draft model (engine.sched.drafts), on the fake model: what a sequence's row of the draft model
holds and feeds, its memory booked in the worker's budget, which source a sequence drafts from, when its time pays,
and a real engine whose answers are the same with a draft model as without, the draft model drafting for a request
alone only."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.sampling.draft import Drafter
from phi_api.engine.sched.drafts import WINDOW, DraftModel, DraftRow
from phi_api.engine.sched.stepcost import StepCosts, model_draft_cost
from tests.support.fakes import VOCAB, FakeModel, Script, fake_engine, text_pieces
from tests.support.generations import collect

SCRIPT = list(range(1, 61))
PIECES = text_pieces(*[f" w{token}".encode() for token in SCRIPT])


def draft_model(rows: int = 2, budget: int = 1 << 30, chunk: int = 8) -> tuple[DraftModel, Script]:
    script = Script(list(SCRIPT))
    return DraftModel(FakeModel(script, PIECES), 1, rows, SharedBudget(budget), chunk, VOCAB), script


def held(drafts: DraftModel, row: DraftRow, count: int) -> list[int]:
    """The tokens row's first ``count`` positions hold (the fake writes each fed token + 1 into its values)."""
    return [int(value) - 1 for value in drafts.pool.values[0][row.row, 0, :count, 0]]


def test_a_row_feeds_what_it_lacks_and_holds_the_sequence_then_its_draft():
    drafts, script = draft_model()
    row = drafts.open()
    assert row is not None
    tokens = list(range(5, 25))
    draft = row.propose(tokens, 4)
    assert len(draft) == 4 and held(drafts, row, 23) == tokens + draft[:3]
    assert script.steps == ["prefill:8", "prefill:8", "prefill:4", "decode:1", "decode:1", "decode:1"]
    script.steps.clear()
    going_on = tokens + draft[:2] + [40]  # two draft tokens kept, then the model's own
    second = row.propose(going_on, 3)
    assert held(drafts, row, len(going_on) + 2) == going_on + second[:2]
    assert script.steps == ["decode:1"] * 3  # the one token it lacked, then its draft
    script.steps.clear()
    declined = going_on + second[:1]  # a draft not checked, whose first token came: the row holds it already
    row.propose(declined, 2)
    assert script.steps == ["decode:1"] * 2  # fed again for its logits, then one draft token


def test_a_draft_s_time_counts_what_it_fed_first_and_a_passed_model_is_asked_again_now_and_then():
    drafts, script = draft_model()
    drafts.clock, script.token_seconds = script.clock, 0.0  # the fake's clock: each step 10 ms
    row = drafts.open()
    assert row is not None and drafts.seconds_per_token is None
    tokens = list(range(5, 25))
    row.propose(tokens, 4)  # 20 prompt tokens fed in 3 chunks, then 3 one-token steps: 6 steps for 4 tokens
    assert drafts.seconds_per_token == pytest.approx(6 * 0.01 / 4)
    row.propose(tokens + [50], 4)  # one token fed, then 3 one-token steps: 4 steps
    assert drafts.seconds_per_token == pytest.approx((0.9 * 0.06 + 0.04) / (0.9 * 4 + 4))
    asked = [drafts.passed() for _ in range(2048)]
    assert [index for index, yes in enumerate(asked) if yes] == [1023, 2047]


def test_a_sequence_longer_than_the_window_is_fed_from_half_a_window_back():
    drafts, script = draft_model(chunk=64)
    row = drafts.open()
    assert row is not None
    tokens = [3 + index % 50 for index in range(WINDOW + 100)]
    draft = row.propose(tokens, 4)
    start = len(tokens) - WINDOW // 2
    assert row.start == start and held(drafts, row, WINDOW // 2 + 3) == tokens[start:] + draft[:3]
    assert script.steps[:WINDOW // 2 // 64] == ["prefill:64"] * (WINDOW // 2 // 64)


def test_a_failing_draft_model_leaves_the_sequence_without_drafts(caplog):
    drafts, script = draft_model()
    script.fail_at = 1  # its second one-token step raises, as ONNX Runtime would
    row = drafts.open()
    assert row is not None and row.propose(list(range(5, 25)), 4) == []
    steps = len(script.steps)
    assert row.propose(list(range(5, 26)), 4) == [] and len(script.steps) == steps  # never stepped again
    assert "the draft model failed (RuntimeError: fake engine failure)" in caplog.text


def test_rows_are_booked_in_the_worker_budget_and_given_back():
    probe, _ = draft_model()
    one_row = probe.row_bytes
    drafts, _ = draft_model(rows=2, budget=one_row)
    first = drafts.open()
    assert first is not None and drafts.memory.staged == one_row == drafts.memory.usage()["staged"]  # in /metrics
    assert drafts.open() is None  # no room for a second row's memory: none
    first.close()
    first.close()  # twice: given back once
    assert drafts.memory.staged == 0
    assert drafts.open() is not None
    no_room, _ = draft_model(rows=2, budget=one_row - 1)
    assert no_room.open() is None and no_room.memory.staged == 0
    single, _ = draft_model(rows=1)
    assert single.open() is not None and single.open() is None  # every row taken


class Row:
    """A draft model's row that proposes ``tokens``, counting its proposals."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.proposed, self.closed = tokens, 0, 0

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        self.proposed += 1
        return self.tokens[:limit]

    def close(self) -> None:
        self.closed += 1


class Source:
    def __init__(self, row: Row | None) -> None:
        self.row, self.opened = row, 0

    def open(self) -> Row | None:
        self.opened += 1
        return self.row


def test_the_draft_model_drafts_where_no_n_gram_matches_and_where_it_keeps_more():
    row = Row([7, 8, 9])
    source = Source(row)
    drafter = Drafter([1, 2, 3, 1, 2], 3, model=source)
    assert drafter.propose(8, model_cost=0.0) == [3, 1, 2] and source.opened == 0  # an n-gram matches: it drafts first
    drafter.record(3, 0)
    drafter.extend([5])
    assert drafter.propose(8, model_cost=None) == []  # the caller's cost decision: not here
    assert source.opened == 0
    assert drafter.propose(8, model_cost=0.0) == [7]  # no n-gram matches: the model drafts (one more than kept)
    drafter.record(1, 1)
    drafter.extend([7, 6, 1, 2])  # "1 2" again: an n-gram draft matches ...
    assert drafter.propose(8, model_cost=0.0) == [7, 8] and row.proposed == 2  # ... but the model kept more so far
    drafter.record(2, 2)
    drafter.extend([7, 8, 6, 1, 2])
    # its draft costing 2 checks' time: 1 + 3 tokens for 3 checks' time against the n-gram's 1 for one
    assert drafter.propose(8, model_cost=2.0) == [7, 8, 9] and row.proposed == 3
    drafter.record(3, 3)
    drafter.extend([7, 8, 9, 6, 1, 2])
    # 4 tokens for 6 checks' time: the n-gram's draft ("1 2" was followed by 7 8 9), the model not asked
    assert drafter.propose(8, model_cost=5.0) == [7, 8, 9] and row.proposed == 3
    drafter.close()
    drafter.close()
    assert row.closed == 1 and source.opened == 1  # one row, held from the first draft to the end


def test_without_a_free_row_the_sequence_drafts_as_without_a_model():
    source = Source(None)
    drafter = Drafter([1, 2, 3, 1, 2], 3, model=source)
    assert drafter.propose(8, model_cost=0.0) == [3, 1, 2] and source.opened == 0  # an n-gram matched: not asked
    plain = Drafter([4, 5, 6], 3, model=source)
    assert plain.propose(8, model_cost=0.0) == [] and source.opened == 1
    plain.close()


class NextDecoder:
    """A draft model's decoder that guesses the token after ``t`` is ``t + 1``: the fake's script, 1 to 60."""

    def __init__(self, spec) -> None:
        self.spec = spec

    def step(self, pool, first, ids, past, prefill, every_position=False) -> np.ndarray:
        logits = np.zeros((len(ids), VOCAB), dtype=np.float32)
        logits[np.arange(len(ids)), (ids[:, -1] + 1) % VOCAB] = 1.0
        return logits

    def unbind(self) -> None:
        pass


class NextModel(FakeModel):
    def new_decoder(self, threads: int) -> NextDecoder:
        return NextDecoder(self.spec)


def answers(prompts: list[list[int]], draft: bool, **options) -> tuple[list[tuple[str, int]], list]:
    """Each request's (text, tokens) and ending, submitted together (no step until all are in)."""
    options = {"multi_token_rows": True, **options}
    engine = fake_engine(SCRIPT, PIECES, draft_max=6, prefill_chunk=64,
                         draft=NextModel(Script(list(SCRIPT)), PIECES) if draft else None, **options)
    script = engine.model.script
    script.gate = threading.Semaphore(0)
    try:
        generations = [engine.submit(np.array(prompt, dtype=np.int32), SamplingParams(temperature=0, max_tokens=30))
                       for prompt in prompts]
        script.gate.release(100_000)
        ended = [collect(generation) for generation in generations]
    finally:
        engine.stop()
    return [(text, end.completion_tokens) for text, end in ended], [end for _, end in ended]


def model_kept(end) -> int:
    return sum(kept for source, _, kept in end.draft_sources if source == "model")


def test_an_engine_answers_the_same_with_a_draft_model_which_drafts_for_a_request_alone():
    prompt = [[61, 62, 63]]  # nothing to copy: only the draft model drafts
    plain, _ = answers(prompt, draft=False)
    drafted, ends = answers(prompt, draft=True)
    alone = model_kept(ends[0])
    assert drafted == plain and alone > 20
    together, ends = answers([[61, 62, 63], [62, 61, 63]], draft=True)
    assert together == answers([[61, 62, 63], [62, 61, 63]], draft=False)[0]
    # only while the other one prefills or after it ended: beside another row, its per-row steps would not pay
    assert all(model_kept(end) < alone / 2 for end in ends)


def test_where_rows_check_as_alone_the_draft_model_drafts_as_alone_beside_others():
    """BATCH_INVARIANT on a graph whose checks are not one-token steps' bits: a row's drafts must not depend on what
    runs beside it (each check's bits would), so the draft model drafts for it beside others too."""
    _, ends = answers([[61, 62, 63]], draft=True, batch_invariant=True, multi_token_rows=False)
    alone = model_kept(ends[0])
    _, ends = answers([[61, 62, 63], [62, 61, 63]], draft=True, batch_invariant=True, multi_token_rows=False)
    assert alone > 20 and [model_kept(end) for end in ends] == [alone, alone]


def test_the_draft_model_drafts_where_its_time_pays_by_the_measured_costs():
    costs = StepCosts()
    costs.observe_step(1, 0.010)
    assert model_draft_cost(costs, 3.0, 4, 0.001) == 0.0  # its check not timed yet: a try times it
    costs.observe_wide(5, 0.011)  # a check of 4 draft tokens, alone
    assert model_draft_cost(costs, 3.0, 4, None) == 0.0
    assert model_draft_cost(costs, 3.0, 4, 0.001) == pytest.approx(4 / 11)  # 4 tokens in 15 ms against one in 10
    assert model_draft_cost(costs, 3.0, 4, 0.008) is None  # 4 tokens in 43 ms
    assert model_draft_cost(costs, 0.2, 4, 0.001) is None  # 1.2 tokens in 15 ms
    always = StepCosts()  # a row alone that always drafted: no plain step timed, its narrowest check stands for it
    always.observe_wide(6, 0.011)  # paired: one row's check of 4 draft tokens is 6 tokens wide
    always.observe_wide(4, 0.010)
    assert model_draft_cost(always, 3.0, 4, 0.008) is None
    assert model_draft_cost(always, 3.0, 4, 0.001) == pytest.approx(4 / 11)


def test_a_prediction_s_refused_tokens_are_bounded_by_its_length():
    """The key is charged for the prediction's tokens the checks refuse, reserved before the work: at most the
    prediction's length, however often its n-grams match and its drafts fail (without the bound: 57 of 21)."""
    from phi_api.engine.sampling.lookup import Index

    prediction = Index([1, 2, 3, 9, 9, 9, 9] * 3)
    drafter = Drafter([5, 6], max_tokens=8, prediction=prediction)
    for _ in range(5000):
        draft = drafter.propose(8)
        if draft:
            drafter.record(len(draft), 0)
        drafter.extend([1, 2, 3])
    refused = drafter.sources["prediction"]
    assert refused.kept == 0 and refused.checked == len(prediction.tokens) and drafter.prediction_room == 0
