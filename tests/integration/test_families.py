"""The small-model families of 2026 served as they are: tiny random-weight Qwen3, Llama 3 and Mistral models (built
with ONNX Runtime GenAI's model builder, the family's special tokens in their tokenizers and Qwen3's real template)
load and answer, and phi-api reads each family's markup by itself (no TOOL_PARSER given): Qwen3's ``<tool_call>``
and ``<think>``, Llama 3's ``<|python_tag|>`` calls with ``parameters``, Mistral's ``[TOOL_CALLS]``. A grammar
makes each write its family's markup (the weights are noise), through the openai SDK."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import OpenAI

from tests.support.server import Server
from tests.support.tiny_families import FAMILIES, build_tiny

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLS = {
    "qwen3": '<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Paris\\"}}\\n</tool_call>',
    "llama": '<|python_tag|>{\\"name\\": \\"get_weather\\", \\"parameters\\": {\\"city\\": \\"Paris\\"}}',
    "mistral": '[TOOL_CALLS][{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Paris\\"}}]',
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, model_path, tmp_path_factory, logs_dir):
    name = request.param
    work = tmp_path_factory.mktemp(f"tiny-{name}")
    folder = build_tiny(FAMILIES[name], Path(model_path), work / "model", work)
    with Server(logs_dir, MODEL_PATH=str(folder), MODEL_ID=f"tiny-{name}", WEB_CONCURRENCY=1) as running:
        yield name, OpenAI(base_url=running.url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_the_family_loads_and_answers(family):
    name, client = family
    answer = client.chat.completions.create(model=f"tiny-{name}", messages=MESSAGES, max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens >= 1 and answer.choices[0].finish_reason in ("stop", "length")


def test_the_family_s_own_call_markup_is_read_without_being_told(family):
    name, client = family
    message = client.chat.completions.create(
        model=f"tiny-{name}", messages=MESSAGES, tools=[WEATHER], max_tokens=96,
        extra_body={"structured_outputs": {"grammar": f'start: "{CALLS[name]}"'}}).choices[0].message
    assert [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert not message.content


def test_only_a_family_with_thinking_markers_has_its_thinking_told_apart(family):
    name, client = family
    written = "<think>\nSunny, probably.\n</think>\n\nSunny."
    message = client.chat.completions.create(
        model=f"tiny-{name}", messages=MESSAGES, max_tokens=64,
        extra_body={"structured_outputs": {"grammar": f"start: {json.dumps(written)}"}}).choices[0].message
    if name == "qwen3":  # <think> and </think> are its tokenizer's own
        assert (message.reasoning_content, message.content) == ("Sunny, probably.", "Sunny.")
    else:  # the same words from a model without those tokens are its answer, whole
        assert message.content == written and getattr(message, "reasoning_content", None) is None
