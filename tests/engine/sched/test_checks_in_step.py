"""Drafts checked in the batched step (engine.sched.verify's ``in_step``), where the graph's attention takes several
new tokens for each of several rows, on the fake model: every row's answer is the one it gets without drafts,
rows that end inside a check (stop strings, ``max_tokens``) leave the others' keys and values whole, the step's
common length is chosen where it pays, and no row ever checks its draft in a step of its own."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.sched.stepcost import StepCosts
from tests.support.fakes import fake_engine, text_pieces
from tests.support.generations import collect

SCRIPT = list(range(1, 61))
PIECES = text_pieces(*[f" w{token}".encode() for token in SCRIPT])


def answers(draft_max: int, params: list[dict], *, check_token_seconds: float = 0.0,
            prompts: list[list[int]] | None = None, script_costs: dict | None = None,
            **options) -> tuple[list[tuple[str, str, int]], list[str]]:
    """Every request's (text, reason, tokens), submitted together (no step until all are in), and the steps."""
    engine = fake_engine(SCRIPT, PIECES, draft_max=draft_max, prefill_chunk=64, multi_token_rows=True, **options)
    script = engine.model.script
    script.check_token_seconds = check_token_seconds
    for name, value in (script_costs or {}).items():
        setattr(script, name, value)
    script.gate = threading.Semaphore(0)
    prompts = prompts or [[70 + index, 71, *SCRIPT] for index in range(len(params))]  # copying: drafts come true
    try:
        generations = [engine.submit(np.array(prompt, dtype=np.int32),
                                     SamplingParams(**{"temperature": 0, **each}))
                       for prompt, each in zip(prompts, params, strict=True)]
        script.gate.release(100_000)
        ended = [collect(generation) for generation in generations]
    finally:
        engine.stop()
    return [(text, end.reason, end.completion_tokens) for text, end in ended], list(script.steps)


def test_rows_check_their_drafts_together_and_answer_as_without_drafts():
    params = [{"max_tokens": 40}, {"max_tokens": 33}, {"max_tokens": 27}, {"max_tokens": 40, "stop": [" w19"]}]
    plain, plain_steps = answers(0, params)
    drafted, steps = answers(8, params)
    assert drafted == plain
    assert [reason for _, reason, _ in drafted] == ["length", "length", "length", "stop"]
    assert any(step.startswith("checks:4x") for step in steps)  # four rows' drafts in one step
    assert not any(step.startswith("check:") for step in steps)  # never a row's check in a step of its own
    assert len(steps) < len(plain_steps) / 2


@pytest.mark.parametrize("ends", [[3, 9, 17, 30], [30, 17, 9, 3], [5, 5, 5, 5]])
def test_rows_ending_inside_a_check_leave_the_other_rows_whole(ends):
    """Rows that end at a token a check kept, first or last in the step, have the group's last row take their place
    (a copy of its keys and values as far as its length): the rows after go on exactly as without drafts (the fake
    reads each row's place in its script from its keys and values)."""
    params = [{"max_tokens": end} for end in ends]
    plain, _ = answers(0, params)
    drafted, steps = answers(8, params)
    assert drafted == plain and [tokens for _, _, tokens in drafted] == ends
    assert any(step.startswith("checks:") for step in steps)


def test_rows_without_a_draft_take_one_token_in_the_step_of_the_others_drafts():
    free = [40 + index % 7 for index in range(24)]  # no stretch of the answer in it: no draft comes true
    params = [{"max_tokens": 30}, {"max_tokens": 30}]
    prompts = [[70, 71, *SCRIPT], free]
    plain, _ = answers(0, params, prompts=prompts)
    drafted, steps = answers(8, params, prompts=prompts)
    assert drafted == plain
    assert any(step.startswith("checks:2x") for step in steps)


def test_checks_that_do_not_pay_among_rows_are_not_made():
    params = [{"max_tokens": 200}, {"max_tokens": 200}]
    plain, _ = answers(0, params)
    drafted, steps = answers(8, params, check_token_seconds=0.0125)  # each drafted token costs more than a step
    assert drafted == plain
    checks = [step for step in steps if step.startswith("checks:")]
    assert len(checks) == len(set(checks)) <= 8  # each common length tried once, its price seen, then declined
    assert steps.count("decode:2") >= 200 - 9 * len(checks)


def test_the_common_length_is_the_one_that_pays_best():
    costs = StepCosts()
    drafts = [(4, 3.0), (2, 2.0)]
    assert costs.batch_check_length(drafts, 3) == 0  # no plain step of 3 rows timed yet: the price to beat
    costs.observe_step(3, 0.010)
    assert costs.batch_check_length([], 3) == 0
    assert costs.batch_check_length(drafts, 3) == 4  # nothing timed: 3 rows x 5 tokens tried (a tie: the longer)
    costs.observe_wide(15, 0.020)
    # 4 tokens a row, not timed, cost no less than the plain step: at that, 3 + 3 + 2 tokens in 10 ms could pay best
    assert costs.batch_check_length(drafts, 3) == 3
    costs.observe_wide(12, 0.019)
    assert costs.batch_check_length(drafts, 3) == 2  # likewise: 3 + 2 + 2 tokens in no less than 10 ms
    costs.observe_wide(9, 0.018)
    costs.observe_wide(6, 0.011)
    assert costs.batch_check_length(drafts, 3) == 1  # all timed: 3 + 1 + 1 tokens in 11 ms, the best
    assert costs.batch_check_length([(4, 0.2)], 3) == 0  # 3.2 tokens in 11 ms at best, against 3 in 10 ms
    assert costs.batch_check_length([(4, 0.5), (4, 0.5)], 3) == 1  # 4 tokens in 11 ms: one draft token a row
    assert costs.batch_check_length([(4, 4.0), (4, 4.0)], 3) == 4  # 11 tokens in 20 ms against 5 in 11 ms


def test_a_step_that_costs_a_pass_more_than_a_narrower_one_is_left_for_the_narrower():
    """phi-api's kernels multiply 8 token-rows a pass: a lone row's check of 8 drafted tokens (9 token-rows) costs a
    second pass, and 7 (8 token-rows) give more tokens a second."""
    costs = StepCosts()
    costs.observe_step(1, 0.047)
    assert costs.batch_check_length([(8, 8.0)], 1) == 8
    costs.observe_wide(9, 0.123)
    assert costs.batch_check_length([(8, 8.0)], 1) == 7  # untimed: at no less than 47 ms, 8 tokens could pay best
    costs.observe_wide(8, 0.085)
    assert costs.batch_check_length([(8, 8.0)], 1) == 6  # 7 tokens at no less than 47 ms could pay best: tried
    for width in range(2, 8):  # one pass: a token-row more costs 5.6 ms
        costs.observe_wide(width, 0.040 + 0.0056 * width)
    assert costs.batch_check_length([(8, 8.0)], 1) == 7  # all timed: 8 tokens in 85 ms, against 9 in 123 ms


@pytest.mark.parametrize(("row_wise", "widths"), [(True, {8}), (False, {9})])
def test_alone_where_checks_are_exact_a_check_is_as_long_as_pays(row_wise, widths):
    """A request alone checks every draft whole where a check's length could change its answer (the same steps every
    time); where checks give one-token steps' bits (a row-wise graph) the step costs choose its length, as among
    rows: with matrices computed 8 token-rows a pass, a check of 9 tokens costs a second pass, and 8 are checked."""
    params = [{"max_tokens": 50}]
    plain, _ = answers(0, params, row_wise=row_wise)
    script_options = {"pass_rows": 8, "pass_seconds": 0.02}
    drafted, steps = answers(8, params, row_wise=row_wise, script_costs=script_options)
    assert drafted == plain
    widths_seen = [int(step.split(":")[1]) for step in steps if step.startswith("check:")]  # one row's checks
    assert widths_seen[0] == 9 and set(widths_seen[1:-1]) == widths  # the last one: max_tokens's room
    assert len(steps) < 50 / 4


@pytest.mark.parametrize("requests", [1, 2, 3, 5])
def test_batch_invariant_where_matrices_pair_rows_every_check_holds_an_even_number_of_token_rows(requests):
    """BATCH_INVARIANT on a graph whose matrix kernels compute rows in pairs (not row-wise) but whose attention takes
    several new tokens a row: a check in the batched step gives each token one-token steps' bits when the step holds an
    even number of token-rows, so every check step does (an odd number of rows checks an even number of tokens each),
    and checks are made there as where they pay."""
    params = [{"max_tokens": 30 + 3 * index} for index in range(requests)]
    plain, _ = answers(0, params, batch_invariant=True)
    drafted, steps = answers(8, params, batch_invariant=True)
    assert drafted == plain
    shapes = [tuple(map(int, step.split(":")[1].split("x"))) for step in steps if step.startswith("checks:")]
    checks = [int(step.split(":")[1]) for step in steps if step.startswith("check:")]  # one row alone
    assert shapes or checks
    assert all(rows * tokens % 2 == 0 for rows, tokens in shapes) and all(tokens % 2 == 0 for tokens in checks)
    assert all(step.split(":")[1] != "1" for step in steps if step.startswith("decode:"))  # padded plain steps
