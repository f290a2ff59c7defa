"""``bench profile``: operators' times assigned to the step they ran in, and a real profile of the default model."""

from __future__ import annotations

import argparse

import pytest

from phi_api.bench.profile import VOCABULARY, breakdown, run


def node(ts: int, dur: int, name: str, op: str) -> dict:
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_each_operator_counts_in_the_step_it_ran_in():
    runs = [{"cat": "Session", "name": "model_run", "ts": start, "dur": 90} for start in (0, 100, 200, 300)]
    events = [*runs,
              node(5, 40, "fill", "MatMul"),  # the context's fill: counted nowhere
              node(110, 30, "layer.0", "MatMul"), node(150, 20, "lm_head", "MatMul"),
              node(210, 50, "layer.0", "MatMul"), node(270, 10, "attention", "Attention"),
              node(305, 70, "layer.0", "MatMul"), node(380, 5, "lm_head", "MatMul")]
    labels = [None, "1 rows", "prompt", "1 rows"]
    walls = {"1 rows": [0.001, 0.003], "prompt": [0.002]}
    phases = breakdown(events, labels, walls, product="lm_head")
    assert phases["1 rows"]["operators"] == {"MatMul": 0.05, VOCABULARY: 0.0125}  # (30 + 70) / 2, (20 + 5) / 2
    assert phases["prompt"]["operators"] == {"MatMul": 0.05, "Attention": 0.01}
    assert phases["1 rows"]["wall_ms"] == pytest.approx(2.0) and phases["1 rows"]["steps"] == 2
    assert phases["prompt"]["ort_ms"] == pytest.approx(0.09)
    with pytest.raises(RuntimeError, match="3 runs"):
        breakdown(events[1:], labels, walls, product="lm_head")


def test_a_profile_of_the_default_model_accounts_for_its_steps(model_path):
    args = argparse.Namespace(model_path=model_path, rows="1,2", context=32, prompt=24, past=0, steps=3, threads=2,
                              out="")
    report = run(args)
    phases = report["phases"]
    assert set(phases) == {"1 rows", "2 rows", "prompt of 24"}
    for phase in phases.values():
        operators = phase["operators"]
        assert phase["steps"] == 3 and VOCABULARY in operators
        assert 0.5 * phase["ort_ms"] < sum(operators.values()) <= 1.01 * phase["ort_ms"]
        assert 0 < phase["ort_ms"] <= 1.5 * phase["wall_ms"]
    # where phi-api's graph serves (its library runs here), a prompt chunk computes its last position's logits
    # alone: its vocabulary product costs about what a one-row step's does, not 24 positions' worth
    from phi_api.engine.kernels.native import unsupported

    ratio = phases["prompt of 24"]["operators"][VOCABULARY] / phases["1 rows"]["operators"][VOCABULARY]
    assert (ratio < 4) == (unsupported() is None), ratio


def test_a_prompt_chunk_after_a_past_is_profiled_on_its_own_row(model_path):
    args = argparse.Namespace(model_path=model_path, rows="1", context=8, prompt=16, past=40, steps=2, threads=1,
                              out="")
    report = run(args)
    assert report["past"] == 40
    chunk = report["phases"]["prompt of 16 after 40"]
    assert chunk["steps"] == 2 and VOCABULARY in chunk["operators"]
