"""JSON nested past MAX_DEPTH is refused without exhausting the stack (nor holding an entry per value), and large
values are encoded in slices that give the same text as the standard encoder."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from phi_api import jsontext


def test_depth_is_measured_without_recursion_and_past_the_bound_is_refused():
    assert jsontext.depth(1) == 0 and jsontext.depth({"a": [1, {"b": []}]}) == 4
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        jsontext.loads(deep)
    assert not jsontext.too_deep(json.loads("[" * jsontext.MAX_DEPTH + "]" * jsontext.MAX_DEPTH))
    with pytest.raises(RecursionError):
        jsontext.loads("[" * (jsontext.MAX_DEPTH + 1) + "]" * (jsontext.MAX_DEPTH + 1))


def test_depth_keeps_only_the_containers_of_one_level_at_a_time():
    wide = {"prompt": [0] * 100_000, "messages": [{"role": "user"}] * 1000}  # a large body: many small values
    tracemalloc.start()
    try:
        assert jsontext.depth(wide) == 3
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000  # not an entry (with its level) for each of the 100,000 values


def test_slices_give_the_standard_encoder_s_text():
    value = {"choices": [{"logprobs": {"tokens": [f"t{i}é" for i in range(1000)],
                                       "top": [{"a": i / 7} for i in range(700)], "empty": []}}], "n": None}
    assert jsontext.dumps_in_slices(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
