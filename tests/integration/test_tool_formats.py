"""Tool calls in a family's own format against real gunicorn, through the openai SDK: one server serving the tiny
random-weight Phi-3 twice, as a Hermes/Qwen model and as a Phi-4-mini model (TOOL_PARSER per model in
MODELS_FILE). A grammar (the model's weights are noise) makes each write some text, then a call in its family's
markup: the SDK gets the text as content, the call as ``tool_calls``, whole and streamed, and never the markup."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from tests.support.server import Server

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Paris\\"}}'
GRAMMARS = {
    "tiny-hermes": f'start: "Checking the weather. <tool_call>\\n{CALL}\\n</tool_call>"',
    "tiny-phi4": f'start: "Checking the weather. <|tool_call|>[{CALL}]<|/tool_call|>"',
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MARKERS = {"tiny-hermes": ("<tool_call>", "</tool_call>"), "tiny-phi4": ("<|tool_call|>[", "]<|/tool_call|>")}


@pytest.fixture(scope="module")
def families(tiny_phi3, tmp_path_factory, logs_dir):
    models = tmp_path_factory.mktemp("tool-formats") / "models.json"
    models.write_text(json.dumps({"models": [
        {"id": "tiny-hermes", "path": str(tiny_phi3), "options": {"TOOL_PARSER": "hermes"}},
        {"id": "tiny-phi4", "path": str(tiny_phi3), "options": {"TOOL_PARSER": "phi4_mini"}}]}))
    with Server(logs_dir, MODELS_FILE=str(models), WEB_CONCURRENCY=1) as running:
        yield OpenAI(base_url=running.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.mark.parametrize("model", sorted(GRAMMARS))
def test_a_family_s_call_comes_back_as_tool_calls_with_the_text_as_content(families, model):
    extra = {"structured_outputs": {"grammar": GRAMMARS[model]}}
    message = families.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER], max_tokens=96,
                                               extra_body=extra).choices[0].message
    assert message.content == "Checking the weather."
    assert [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    content, arguments, names, reasons = "", "", [], []
    for chunk in families.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER], max_tokens=96,
                                                  stream=True, extra_body=extra):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert content.strip() == "Checking the weather." and "tool_call" not in content
    assert names == ["get_weather"] and json.loads(arguments) == {"city": "Paris"} and reasons[-1] == "tool_calls"


@pytest.mark.parametrize("model", sorted(GRAMMARS))
def test_a_forced_call_is_written_in_the_family_s_shape_and_validates(families, model):
    city = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
    choice = families.chat.completions.create(model=model, messages=MESSAGES, tools=[city], tool_choice="required",
                                              max_tokens=64, temperature=0, logprobs=True).choices[0]
    [call] = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome") and not choice.message.content
    written = "".join(token.token for token in choice.logprobs.content)  # what the model wrote, markup included
    opening, closing = MARKERS[model]
    assert written.startswith(opening) and written.rstrip().endswith(closing)
