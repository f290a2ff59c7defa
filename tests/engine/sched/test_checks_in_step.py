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
            prompts: list[list[int]] | None = None, **options) -> tuple[list[tuple[str, str, int]], list[str]]:
    """Every request's (text, reason, tokens), submitted together (no step until all are in), and the steps."""
    engine = fake_engine(SCRIPT, PIECES, draft_max=draft_max, prefill_chunk=64, multi_token_rows=True, **options)
    script = engine.model.script
    script.check_token_seconds = check_token_seconds
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
    params = [{"max_tokens": 50}, {"max_tokens": 50}]
    plain, _ = answers(0, params)
    drafted, steps = answers(8, params, check_token_seconds=0.0125)  # each drafted token costs more than a step
    assert drafted == plain
    checks = [step for step in steps if step.startswith("checks:")]
    assert len(checks) == len(set(checks))  # each common length tried once, its price seen, then declined
    assert steps.count("decode:2") >= 25


def test_the_common_length_is_the_one_that_pays_best():
    costs = StepCosts()
    drafts = [(4, 3.0), (2, 2.0)]
    assert costs.batch_check_length(drafts, 3) == 0  # no plain step of 3 rows timed yet: the price to beat
    costs.observe_step(3, 0.010)
    assert costs.batch_check_length([], 3) == 0
    assert costs.batch_check_length(drafts, 3) == 4  # 3 rows x 5 tokens not timed yet: tried
    costs.observe_wide(15, 0.020)
    assert costs.batch_check_length(drafts, 3) == 4  # 3 + 3 + 2 tokens in 20 ms against 3 in 10 ms
    assert costs.batch_check_length([(4, 0.5)], 3) == 0  # 3.5 tokens in 20 ms
    costs.observe_wide(6, 0.011)
    assert costs.batch_check_length([(4, 0.5), (4, 0.5)], 3) == 1  # 4 tokens in 11 ms: one draft token a row
    assert costs.batch_check_length([(4, 4.0), (4, 4.0)], 3) == 4  # 11 tokens in 20 ms against 5 in 11 ms


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
