"""Tool plans: grammars for forced calls and parsing calls out of answers."""

from __future__ import annotations

import json

import pytest

from phi_api.errors import InvalidParameterError
from phi_api.service.tools import template_messages, tool_plan

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def plan(tools=(WEATHER, TIME), tool_choice=None, parallel_tool_calls=True):
    return tool_plan(list(tools), tool_choice, parallel_tool_calls)


@pytest.mark.parametrize("text,expected", [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})]),
    ('Let me check. {"name": "get_weather", "arguments": {"city": "Rome"}} One moment.',
     [("get_weather", {"city": "Rome"})]),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', [("get_time", {})]),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}', [("get_weather", {"city": "Oslo"})]),
    ('{"name": "get_weather", "parameters": {"city": "Lima"}}', [("get_weather", {"city": "Lima"})]),
    ('{"name": "unknown", "arguments": {}}', []),
    ('{"name": "get_weather"}', []),
    ('{"name": "get_weather", "arguments": {"city": ', []),
    ("Sunny, 20 degrees.", []),
])
def test_parsing_calls(text, expected):
    calls = plan().parse(text)
    assert [(call.name, json.loads(call.arguments)) for call in calls] == expected
    assert all(call.id.startswith("call_") and len(call.id) == 29 for call in calls)


def test_parallel_calls_unless_disabled():
    text = '{"name": "get_time", "arguments": {}} {"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert [call.name for call in plan().parse(text)] == ["get_time", "get_weather"]
    assert [call.name for call in plan(parallel_tool_calls=False).parse(text)] == ["get_time"]


def test_call_ids_are_unique():
    text = '{"name": "get_time", "arguments": {}}'
    assert plan().parse(text)[0].id != plan().parse(text)[0].id


def test_required_is_a_grammar_over_every_function():
    kind, grammar = plan(tool_choice="required").grammar()
    schema = json.loads(grammar)
    assert kind == "json_schema"
    assert [option["properties"]["name"]["const"] for option in schema["anyOf"]] == ["get_weather", "get_time"]
    assert schema["anyOf"][1]["properties"]["arguments"] == {"type": "object", "properties": {},
                                                            "additionalProperties": False}  # no undeclared keys


def test_auto_has_no_grammar_and_none_has_no_plan():
    assert plan().grammar() is None
    assert plan(tool_choice="none") is None
    assert tool_plan([]) is None


def test_duplicate_function_names_are_refused():
    with pytest.raises(InvalidParameterError):
        tool_plan([WEATHER, WEATHER])


@pytest.mark.parametrize("text,possible", [("", True), ("  ", True), (" {", True), ("<tool", True),
                                           ("<tool_call>{", True), ("The", False), ("<b>", False)])
def test_could_be_call(text, possible):
    assert plan().could_start(text) is possible


def test_templates_with_tool_support_get_the_messages_as_they_are_but_parsed_arguments():
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]}]
    rendered = template_messages(messages, plan(), template_knows_tools=True)
    assert rendered[0]["tool_calls"][0]["function"]["arguments"] == {"zone": "UTC"}


EMAIL = {"type": "function", "function": {"name": "send_email", "parameters": {
    "type": "object", "required": ["to", "priority", "cc", "urgent", "attempts", "meta"],
    "properties": {"to": {"type": "string"}, "priority": {"type": "string", "enum": ["low", "high"]},
                   "cc": {"type": "array", "items": {"type": "string"}}, "urgent": {"type": "boolean"},
                   "attempts": {"type": "integer"}, "meta": {"type": "object", "required": ["tag"],
                                                               "properties": {"tag": {"type": "string"}}},
                   "body": {"type": "string"}}}}}


def test_tool_instructions_show_a_concrete_call_of_the_first_tool_not_placeholders():
    import jsonschema

    plan = tool_plan([EMAIL, {"type": "function", "function": {"name": "other"}}], "required", True)
    prompt = plan.system_prompt()
    assert "<" not in prompt  # a small model copied "<function name>" into its calls
    example = json.loads(prompt[prompt.rindex("like: ") + len("like: "):])
    assert example["name"] == "send_email"
    arguments = example["arguments"]
    jsonschema.validate(arguments, EMAIL["function"]["parameters"])  # every required argument, of its type
    assert arguments["priority"] == "low" and "body" not in arguments  # an enum's first choice; only the required
    assert arguments["to"] == "to" and arguments["meta"] == {"tag": "tag"}  # a string says what it holds


def test_an_example_of_arguments_walks_each_required_name_once(monkeypatch):
    from phi_api.service import tools

    calls = []
    value = tools.example_value
    monkeypatch.setattr(tools, "example_value", lambda *args: calls.append(1) or value(*args))
    level: dict = {"type": "string"}
    for _ in range(3):  # each level lists its one name 200 times: 200**3 values before
        level = {"type": "object", "properties": {"a": level}, "required": ["a"] * 200}
    assert tools.example_arguments(level) == {"a": {"a": {"a": "a"}}}
    assert len(calls) == 3

