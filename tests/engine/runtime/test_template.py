"""Chat templates rendered by phi-api itself (for chat_template_kwargs): a real family's template gives what its
model expects, and a template cannot reach past the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from phi_api.engine.runtime.template import render
from phi_api.errors import ChatTemplateError

QWEN3 = (Path(__file__).resolve().parents[2] / "data" / "templates" / "qwen3.jinja").read_text(encoding="utf-8")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


def test_qwen3_s_template_turns_thinking_off_with_enable_thinking():
    on = render(QWEN3, MESSAGES, None, True, {}, {})
    off = render(QWEN3, MESSAGES, None, True, {"enable_thinking": False}, {})
    assert on == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_tools_go_through_tojson_as_the_template_writes_them():
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    text = render(QWEN3, MESSAGES, tools, True, {}, {})
    assert '\n{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}\n</tools>' in text


def test_an_earlier_answer_s_thinking_is_left_out_as_the_template_says():
    history = [*MESSAGES, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello."},
               {"role": "user", "content": "Again?"}]
    text = render(QWEN3, history, None, True, {}, {})
    assert "hmm" not in text and "<|im_start|>assistant\nHello.<|im_end|>" in text


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # reaching Python's internals
    "{% set _ = messages.append(1) %}{{ messages }}",  # changing what it was given
    "{{ raise_exception('no system role here') }}",  # the template's own refusal
    "{% for %}",  # not a template
])
def test_a_template_that_fails_or_reaches_past_the_sandbox_is_a_chat_template_error(template):
    with pytest.raises(ChatTemplateError):
        render(template, MESSAGES, None, True, {}, {})


def test_a_template_knows_tools_when_it_reads_the_tools_variable_not_the_word():
    from phi_api.engine.runtime.template import reads

    assert "tools" in reads(QWEN3) and "enable_thinking" in reads(QWEN3)
    assert "tools" not in reads("{{ messages[0]['content'] }} You have no tools.")
    assert "tools" not in reads("{% for m in messages %}{{ m.tools }}{% endfor %}")  # a message's own field
    assert reads("{% for %}") == frozenset()
