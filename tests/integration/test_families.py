"""The small-model families of 2026 served as they are: tiny random-weight Qwen3, Llama 3, Mistral, Phi-4-mini (and
-reasoning), DeepSeek-R1-Distill-Qwen and Gemma 3 models (built with ONNX Runtime GenAI's model builder, the
family's special tokens in their tokenizers, and each family's real template, or vLLM's tool template for it),
through the official clients (openai, anthropic, ollama), with no setting given but Gemma 3's TOOL_PARSER (its
Python-style calls have no marker to tell them by) and Phi-4-mini-reasoning's REASONING_PARSER (its <think> is
text): phi-api reads each family's markup by itself: Qwen3's ``<tool_call>`` and ``<think>``, Llama 3's
``<|python_tag|>`` calls with ``parameters`` and Mistral's ``[TOOL_CALLS]`` (both special tokens, as in their
tokenizers: the answer's text keeps them), Phi-4-mini's ``<|tool_call|>[...]``, DeepSeek-R1-Distill's thinking
opened by its template. Gemma 3's sliding-window layers have a window shorter than the prompts. The weights are
noise: a grammar makes each write its family's markup where the test needs known words; forced calls carry their own
grammar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import openai
import pytest
from ollama import Client
from openai import OpenAI

from tests.support.server import Server
from tests.support.tiny_families import FAMILIES, build_tinies

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '{\\"name\\": \\"get_weather\\", \\"ARGS\\": {\\"city\\": \\"Paris\\"}}'
CALLS = {  # each family's call, as its model writes one (Lark string escapes)
    "qwen3": "<tool_call>\\n" + CALL.replace("ARGS", "arguments") + "\\n</tool_call>",
    "llama": "<|python_tag|>" + CALL.replace("ARGS", "parameters"),
    "mistral": "[TOOL_CALLS][" + CALL.replace("ARGS", "arguments") + "]",
    "phi4-mini": "<|tool_call|>[" + CALL.replace("ARGS", "arguments") + "]<|/tool_call|>",
    "phi4-mini-reasoning": "<|tool_call|>[" + CALL.replace("ARGS", "arguments") + "]<|/tool_call|>",
    # no call format of its own that phi-api reads: the generic one, after the thinking its template opened
    "deepseek-r1-distill": "Easy.\\n</think>\\n\\n" + CALL.replace("ARGS", "arguments"),
    "gemma3": '[get_weather(city=\\"Paris\\")]',  # Python-style, as its tool template asks (TOOL_PARSER=pythonic)
}
THINKERS = {  # what a thinking family writes (its template may have opened the thinking), and what is read of it
    "qwen3": "<think>\nSunny, probably.\n</think>\n\nSunny.",
    "deepseek-r1-distill": "Sunny, probably.\n</think>\n\nSunny.",
    "phi4-mini-reasoning": "<think>\nSunny, probably.\n</think>\n\nSunny.",  # markers as text, not tokens
}
# words before the call (none where the answer must start with it)
PREFIX = {"deepseek-r1-distill": "", "gemma3": ""}


@pytest.fixture(scope="module")
def folders(model_path, tmp_path_factory) -> dict[str, Path]:
    """Every family's tiny model, built together (two builders at a time)."""
    return build_tinies(list(FAMILIES.values()), Path(model_path), tmp_path_factory.mktemp("tiny-families"))


@pytest.fixture(scope="module")
def families_server(folders, logs_dir, tmp_path_factory):
    """One server holding every family's model as "tiny-NAME", each with its family's settings (MODELS_FILE)."""
    listing = tmp_path_factory.mktemp("families") / "models.json"
    listing.write_text(json.dumps({"models": [
        {"id": f"tiny-{name}", "path": str(folders[name]), "options": FAMILIES[name].settings}
        for name in sorted(FAMILIES)]}))
    with Server(logs_dir, MODELS_FILE=str(listing), MAX_MODELS=len(FAMILIES), WEB_CONCURRENCY=1) as running:
        yield running


@pytest.fixture(params=sorted(FAMILIES))
def family(request, families_server):
    return request.param, families_server


def openai_client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def grammar_of(text: str) -> dict:
    return {"structured_outputs": {"grammar": f'start: "{text}"'}}


def test_the_family_loads_and_answers(family):
    name, server = family
    answer = openai_client(server).chat.completions.create(model=f"tiny-{name}", messages=MESSAGES, max_tokens=8,
                                                           temperature=0)
    assert answer.usage.completion_tokens >= 1 and answer.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_family_s_own_call_markup_is_read_without_being_told(family, stream):
    # after a few words where the family's marker opens a call (also a marker its tokenizer holds special)
    name, server = family
    before = PREFIX.get(name, "Checking. ")
    answer = openai_client(server).chat.completions.create(
        model=f"tiny-{name}", messages=MESSAGES, tools=[WEATHER], max_tokens=112, stream=stream,
        extra_body=grammar_of(before + CALLS[name]))
    if stream:
        content, names, arguments = "", "", ""
        for chunk in answer:
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            for call in (delta.tool_calls or []) if delta else []:
                names += call.function.name or ""
                arguments += call.function.arguments or ""
        calls = [(names, json.loads(arguments))]
    else:
        message = answer.choices[0].message
        content = message.content or ""
        calls = [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls]
    assert calls == [("get_weather", {"city": "Paris"})]
    assert content.strip() == before.strip()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_call_comes_out_in_the_family_s_shape_and_validates(family, choice):
    name, server = family
    message = openai_client(server).chat.completions.create(
        model=f"tiny-{name}", messages=MESSAGES, tools=[WEATHER], tool_choice=choice, max_tokens=64,
        temperature=0).choices[0].message
    (call,) = message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and list(arguments) == ["city"] and len(arguments["city"]) <= 12


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "named"])
def test_the_anthropic_client_gets_tool_use_blocks(family, choice):
    name, server = family
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    message = claude.messages.create(model=f"tiny-{name}", max_tokens=64, messages=MESSAGES, tools=[tool],
                                     tool_choice=choice, extra_body={"temperature": 0})
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and use.name == "get_weather" and list(use.input) == ["city"]


@pytest.mark.parametrize("extra,pattern", [
    ({"structured_outputs": {"regex": "[0-9]{3}-[0-9]{2}"}}, r"[0-9]{3}-[0-9]{2}"),
    ({"structured_outputs": {"choice": ["sunny", "rainy"]}}, r"sunny|rainy"),
], ids=["regex", "choice"])
def test_regex_and_choice_answers_match(family, extra, pattern):
    name, server = family
    answer = openai_client(server).chat.completions.create(model=f"tiny-{name}", messages=MESSAGES, max_tokens=24,
                                                           temperature=1.0, seed=3, extra_body=extra).choices[0]
    if name == "deepseek-r1-distill":  # its template opened the thinking: the grammar shapes the whole answer,
        assert re.fullmatch(pattern, answer.message.reasoning_content or "")  # which stays inside it
    else:
        assert re.fullmatch(pattern, answer.message.content) and answer.finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_only_a_family_with_thinking_markers_has_its_thinking_told_apart(family, stream):
    name, server = family
    written = THINKERS.get(name, THINKERS["qwen3"])
    answer = openai_client(server).chat.completions.create(
        model=f"tiny-{name}", messages=MESSAGES, max_tokens=64, stream=stream,
        extra_body={"structured_outputs": {"grammar": f"start: {json.dumps(written)}"}})
    if stream:
        reasoning, content = "", ""
        for chunk in answer:
            delta = chunk.choices[0].delta if chunk.choices else None
            reasoning += (getattr(delta, "reasoning_content", None) or "") if delta else ""
            content += (delta.content or "") if delta else ""
    else:
        message = answer.choices[0].message
        reasoning, content = getattr(message, "reasoning_content", None) or "", message.content
    if name in THINKERS:  # <think> and </think> are its tokenizer's own, or read as text (REASONING_PARSER=think)
        assert (reasoning, content) == ("Sunny, probably.", "Sunny.")
    else:  # the same words from a model without those tokens are its answer, whole
        assert content == written and reasoning == ""


def test_the_ollama_client_gets_thinking_only_from_a_thinking_family(family):
    name, server = family
    think = {"deepseek-r1-distill": True, "qwen3": False}.get(name)  # Qwen3's template turns its thinking off
    reply = Client(host=server.url).chat(model=f"tiny-{name}", messages=MESSAGES, think=think,
                                         options={"num_predict": 12, "temperature": 0})
    if think:  # the template opened the thinking: the weights' words start inside it
        assert reply.message.thinking and not reply.message.content
    else:
        assert reply.message.content and not reply.message.thinking


def test_a_list_of_prompts_answers_each_prompt_as_alone(family):
    name, server = family
    client = openai_client(server)
    prompts = ["The sky is", "Two and two make"]
    listed = client.completions.create(model=f"tiny-{name}", prompt=prompts, max_tokens=6, temperature=0)
    alone = [client.completions.create(model=f"tiny-{name}", prompt=prompt, max_tokens=6, temperature=0)
             for prompt in prompts]
    assert [choice.text for choice in sorted(listed.choices, key=lambda choice: choice.index)] == [
        answer.choices[0].text for answer in alone]


def test_fill_in_the_middle_where_the_tokenizer_has_its_tokens(family):
    name, server = family
    client = openai_client(server)
    request = {"model": f"tiny-{name}", "prompt": "def add(a, b):\n    ", "suffix": "\n    return c\n",
               "max_tokens": 12, "extra_body": {"structured_outputs": {"regex": "c = a \\+ b"}}}
    if name == "qwen3":  # the FIM tokens of Qwen's tokenizers
        assert client.completions.create(**request).choices[0].text == "c = a + b"
    else:
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(**request)
        assert refused.value.body["param"] == "suffix"
