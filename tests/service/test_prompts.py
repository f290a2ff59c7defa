"""Prompts: chat content into plain text for templates, completion prompts, and what is refused before tokenizing."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.errors import (
    ContextLengthExceededError,
    InvalidMessagesError,
    InvalidParameterError,
    UnsupportedParameterError,
)
from phi_api.service.prompts import (
    MAX_RUN_CHARS,
    chat_messages,
    check_token_ids,
    completion_prompt,
    completion_prompts,
    text_tokens,
)
from tests.support.fakes import fake_engine, text_pieces


@pytest.fixture(scope="module")
def engine():
    made = fake_engine([1, 0], text_pieces(b"a"))
    yield made
    made.stop()


def test_chat_content_parts_are_joined_and_roles_get_the_names_templates_know():
    messages = chat_messages([{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]},
                              {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}])
    assert messages == [{"role": "system", "content": "a\nb"},
                        {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}]


def test_an_image_part_is_refused_naming_the_message():
    with pytest.raises(UnsupportedParameterError, match=r"messages\[0\]"):
        chat_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_a_text_that_cannot_fit_or_a_run_without_spaces_is_refused_before_tokenizing(engine):
    with pytest.raises(ContextLengthExceededError):
        text_tokens(engine, "a " * (engine.info.context_length * engine.longest_token_bytes), "prompt")
    with pytest.raises(InvalidParameterError):
        text_tokens(engine, "x" * (MAX_RUN_CHARS + 1), "prompt", must_fit=False)
    with pytest.raises(InvalidMessagesError):
        text_tokens(engine, "x" * (MAX_RUN_CHARS + 1), "messages", must_fit=False)
    assert len(text_tokens(engine, "x" * MAX_RUN_CHARS, "prompt", must_fit=False)) == MAX_RUN_CHARS


def test_completion_prompts_as_text_or_ids_or_a_list_of_either(engine):
    [(ids, text)] = completion_prompts(engine, ["hi"], most=4)
    assert text == "hi" and len(ids) == 2
    [(ids, _)] = completion_prompts(engine, [1, 2, 3], most=4)
    assert ids.tolist() == [1, 2, 3] and ids.dtype == np.int32
    several = completion_prompts(engine, ["a", [5, 6], "bc"], most=4)
    assert [text for _, text in several][0::2] == ["a", "bc"] and several[1][0].tolist() == [5, 6]
    with pytest.raises(InvalidParameterError, match="at most 2") as raised:
        completion_prompts(engine, ["a", "b", "c"], most=2)
    assert raised.value.param == "prompt"
    with pytest.raises(InvalidParameterError, match="empty"):
        completion_prompts(engine, ["a", ""], most=4)
    with pytest.raises(InvalidParameterError, match="empty"):
        completion_prompt(engine, "")
    with pytest.raises(InvalidParameterError, match="vocabulary"):
        check_token_ids(engine, [1, 10**6], "prompt")


def test_a_raw_prompt_starts_with_what_the_tokenizer_puts_first_once():
    made = fake_engine([1, 0], text_pieces(b"a"), prompt_prefix=(7,))
    try:
        text = completion_prompt(made, "ab")[0].tolist()
        assert text == [7, *made.encode("ab").tolist()]
        spelled = made.encode("\x06b").tolist()  # a text that spells the prefix itself keeps one
        assert spelled[0] == 7 and completion_prompt(made, "\x06b")[0].tolist() == spelled
        assert completion_prompt(made, [3, 4])[0].tolist() == [3, 4]  # token ids are taken as they are
    finally:
        made.stop()


def test_a_raw_prompt_of_a_tokenizer_that_puts_nothing_first_is_its_text_alone(engine):
    assert completion_prompt(engine, "ab")[0].tolist() == engine.encode("ab").tolist()
