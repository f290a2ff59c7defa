"""Each model family's way of writing tool calls: the calls found, the markup taken out of the text, and which
format a model folder says it writes."""

from __future__ import annotations

import pytest

from phi_api.service.tool_formats import FORMATS, detect
from phi_api.settings import TOOL_PARSERS

PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
TIME = {"name": "get_time", "arguments": {}}


@pytest.mark.parametrize("name,text,content,calls", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me check.", [PARIS]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
               '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', "", [PARIS, TIME]),
    ("phi4_mini", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                  '{"type": "function", "function": {"name": "get_time", "arguments": {}}}]<|/tool_call|>', "",
     [PARIS, TIME]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}', "", [PARIS, TIME]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("pythonic", '[get_weather(city="Paris"), get_time()]', "", [PARIS, TIME]),
    ("generic", 'Sure: {"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
])
def test_each_family_s_calls_come_out_and_its_markup_does_not_stay(name, text, content, calls):
    assert FORMATS[name].split(text) == (content, calls)


@pytest.mark.parametrize("text", ['[os.system("ls")]', "[get_weather(city)]", "[get_weather(city=x.y)]",
                                  "get_weather(", "Plain words."])
def test_pythonic_calls_are_read_never_run_and_anything_else_is_text(text):
    assert FORMATS["pythonic"].split(text) == (text, [])


def test_a_marker_may_be_opening_while_its_start_is_at_the_end():
    hermes = FORMATS["hermes"]
    assert hermes.may_open("I will check <tool") and hermes.may_open("x <tool_call>{")
    assert not hermes.may_open("I will check <b>") and not FORMATS["generic"].may_open("<tool_call>")


@pytest.mark.parametrize("added,template,expected", [
    ({"<|tool_call|>", "<|/tool_call|>"}, "", "phi4_mini"),
    ({"[TOOL_CALLS]"}, "", "mistral"),
    ({"<|python_tag|>"}, "", "llama3_json"),
    (set(), "{{- '<tool_call>' }}", "hermes"),
    ({"<|im_start|>"}, "plain", "generic"),
])
def test_a_model_folder_says_which_format_its_model_writes(added, template, expected):
    assert detect(added, template) == expected


def test_the_setting_names_every_format():
    assert set(TOOL_PARSERS) == {"auto", *FORMATS}


def test_a_forced_call_s_grammar_writes_the_family_s_markers_around_the_call():
    from llguidance import LLMatcher

    from phi_api.service.tools import tool_plan

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    generic = tool_plan(tools, "required")
    assert generic.grammar()[0] == "json_schema"
    for name in ("hermes", "phi4_mini", "mistral"):
        family = generic.__class__(generic.functions, generic.forced, generic.parallel, FORMATS[name])
        kind, definition = family.grammar()
        assert kind == "llguidance" and LLMatcher.validate_grammar(definition) == ""
        assert FORMATS[name].forced[0].strip() in definition
    hermes = generic.__class__(generic.functions, generic.forced, generic.parallel, FORMATS["hermes"])
    cut = hermes.partial_call('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert (cut.name, cut.arguments) == ("get_weather", '{"city": "Pa')


@pytest.mark.parametrize("text", ["[" * 1200, "[" * 1200 + "]" * 1200, '{"name": "f", "arguments": ' + "[" * 600
                                  + "]" * 600 + "}", "[TOOL_CALLS]f[ARGS]" + "[" * 1200])
def test_an_answer_of_brackets_nested_past_any_call_is_text_not_a_crash(text):
    for name in ("generic", "mistral"):
        content, calls = FORMATS[name].split(text)
        assert calls == []

