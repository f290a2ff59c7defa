"""phi-api bench spec's projection: an answer replayed through the drafter, and the speed-up step costs give."""

from __future__ import annotations

import pytest

from phi_api.bench.speculative import project, projected_speedup, replay, shared_start


def test_a_copied_answer_replays_as_checks_that_keep_its_tokens():
    copied = list(range(100, 140))
    steps = replay([1, 2, 3, *copied, 4], copied, draft_max=8)
    assert sum(kept + 1 for _, kept in steps) == len(copied) - 1  # every token after the first, once
    assert all(kept == drafted for drafted, kept in steps if drafted)  # a true copy: every draft kept whole
    assert len(steps) < len(copied) / 4


def test_an_answer_that_copies_nothing_replays_as_plain_steps_after_the_first_failures():
    steps = replay([1, 2, 3, 4, 5], list(range(200, 230)), draft_max=8)
    assert sum(kept + 1 for _, kept in steps) == 29
    assert all(kept == 0 for _, kept in steps)


def test_the_projected_speed_up_is_tokens_over_step_costs():
    steps = [(0, 0), (4, 4), (4, 1), (0, 0)]  # 1 + 5 + 2 + 1 = 9 tokens
    assert projected_speedup(steps, [1.0] * 9) == pytest.approx(9 / 4)
    assert projected_speedup(steps, [1.0, 1.1, 1.2, 1.3, 1.5]) == pytest.approx(9 / (1 + 1.5 + 1.5 + 1))


def test_shared_start_is_the_share_of_an_answer_the_other_begins_with():
    assert shared_start("abcdef", "abcxyz") == pytest.approx(0.5)
    assert shared_start("abc", "abc") == 1.0
    assert shared_start("", "abc") == 0.0


def test_the_projection_gives_each_model_s_and_case_s_speed_up_with_its_arithmetic():
    traces = [[(0, 0), (2, 2)], [(2, 1)]]  # 1 + 3 + 2 = 6 tokens in 3 steps
    costs = {"model": {"one row": [1.0, 1.2, 1.5], "8 rows, one step": [1.0, 1.1, 2.0]}}
    projection = project(traces, costs)
    assert projection["speedup"] == {"model, one row": pytest.approx(6 / 4), "model, 8 rows, one step":
                                     pytest.approx(6 / 5)}
    assert projection["arithmetic"]["model, one row"].startswith("6 tokens / (1 plain steps + 3.0 step-equivalents")
    assert projection["checked_tokens"] == {2: 2} and projection["accepted_per_check"] == 1.5


def test_a_draft_model_s_projection_is_tokens_per_check_over_the_check_and_the_draft_s_time():
    from phi_api.bench.speculative import draft_projection

    chat = {"checks": 10, "drafted": 40, "tokens_per_check": 3.5}
    case = draft_projection(chat, [1.0, 1.1, 1.2, 1.3, 1.4], 0.05)
    assert case["draft_tokens"] == 4.0 and case["speedup"] == 3.5 / (1.4 + 4 * 0.05)


def test_the_table_gives_the_kept_draft_tokens_of_each_source():
    from phi_api.bench.speculative import kept_by_source

    case = {"by_source": {"model_checked": 100.0, "model_kept": 90.0, "prompt_checked": 8.0, "prompt_kept": 3.0}}
    assert kept_by_source(case) == "; kept of checked: model 90/100, prompt 3/8"
    assert kept_by_source({"by_source": {}}) == ""
