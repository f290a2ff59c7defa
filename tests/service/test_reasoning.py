"""A reasoning model's thinking told apart from its answer, however the text arrives in pieces."""

from __future__ import annotations

import pytest

from phi_api.service.reasoning import Reasoning, ReasoningSplitter

THINK = Reasoning("<think>", "</think>")


def split(reasoning: Reasoning, pieces: list[str]) -> tuple[str, str, list[tuple[bool, str]]]:
    splitter = ReasoningSplitter(reasoning)
    told = [piece for text in pieces for piece in splitter.feed(text)] + splitter.flush()
    return ("".join(text for thinking, text in told if thinking), "".join(text for thinking, text in told
                                                                              if not thinking), told)


ANSWER = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 100])
def test_thinking_and_answer_come_apart_whatever_the_pieces(size):
    pieces = [ANSWER[start:start + size] for start in range(0, len(ANSWER), size)]
    thought, answer, told = split(THINK, pieces)
    assert (thought, answer) == ("The user greets me.\nI greet back.", "Hello!")
    assert [thinking for thinking, _ in told] == sorted((thinking for thinking, _ in told), reverse=True)


def test_a_prompt_that_opened_the_thinking_shows_only_the_end_marker():
    thought, answer, _ = split(Reasoning("<think>", "</think>", inside=True), ["Let me see.", "</th", "ink>Yes."])
    assert (thought, answer) == ("Let me see.", "Yes.")


def test_an_answer_without_thinking_is_all_answer_even_if_it_starts_like_a_marker():
    assert split(THINK, ["<th", "is is not a marker"])[:2] == ("", "<this is not a marker")
    assert split(THINK, ["Plain answer, <think> later is text."])[:2] == ("", "Plain answer, <think> later is text.")


def test_thinking_cut_short_stays_thinking():
    assert split(THINK, ["<think>still thinking when max_tokens came"])[:2] == (
        "still thinking when max_tokens came", "")
    assert split(Reasoning("<think>", "</think>", inside=True), ["partial </thi"])[:2] == ("partial </thi", "")


def test_a_marker_prefix_inside_the_thinking_is_released_once_it_cannot_be_the_marker():
    thought, answer, told = split(THINK, ["<think>a </t", "able> b</think>c"])
    assert (thought, answer) == ("a </table> b", "c")
    assert told[0] == (True, "a")  # "</t" and the blank before it waited


def test_a_forced_call_s_prompt_closes_the_thinking_its_template_opened():
    import numpy as np

    from phi_api.service.reasoning import closed_for_an_answer

    class Encoder:
        def encode(self, text: str) -> np.ndarray:
            return np.array([ord(character) for character in text], dtype=np.int64)

    prompt = np.array([1, 2, 3], dtype=np.int32)
    opened = Reasoning("<think>", "</think>", inside=True)
    closed, found = closed_for_an_answer(Encoder(), prompt, opened)  # type: ignore[arg-type]
    assert "".join(map(chr, closed[3:])) == "</think>\n\n" and closed.dtype == prompt.dtype
    assert found == Reasoning("<think>", "</think>", inside=False)
    for unchanged in (None, Reasoning("<think>", "</think>", inside=False)):  # nothing opened: nothing to close
        same, kept = closed_for_an_answer(Encoder(), prompt, unchanged)  # type: ignore[arg-type]
        assert same is prompt and kept is unchanged
