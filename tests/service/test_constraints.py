"""What the answer must match, from each field clients use to say it; bad grammars refused with a 400 naming the
field, before anything is generated."""

from __future__ import annotations

import json

import pytest
from llguidance import LLMatcher

from phi_api.errors import InvalidParameterError, UnsupportedParameterError
from phi_api.service.constraints import constraint_fields, grammar

GBNF = 'root ::= "yes" | "no"'
LARK = 'start: "yes" | "no"'


@pytest.mark.parametrize("body,param", [
    ({"structured_outputs": {"regex": "[0-9]{3}"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": GBNF}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"grammar": LARK}}, "structured_outputs.grammar"),
    ({"guided_regex": "[a-z]+"}, "guided_regex"),
    ({"guided_choice": ["a", "b"]}, "guided_choice"),
    ({"guided_grammar": GBNF}, "guided_grammar"),
    ({"grammar": GBNF}, "grammar"),
])
def test_each_grammar_field_compiles_to_a_checked_llguidance_grammar(body, param):
    found = constraint_fields(body)["output_grammar"]
    assert found.param == param
    kind, definition = found.guidance()
    assert kind == "llguidance" and LLMatcher.validate_grammar(definition) == ""


@pytest.mark.parametrize("body,schema,param", [
    ({"structured_outputs": {"json": {"type": "integer"}}}, {"type": "integer"}, "structured_outputs.json"),
    ({"structured_outputs": {"json": '{"type": "string"}'}}, {"type": "string"}, "structured_outputs.json"),
    ({"structured_outputs": {"json_object": True}}, {"type": "object"}, "structured_outputs.json_object"),
    ({"guided_json": {"type": "boolean"}}, {"type": "boolean"}, "guided_json"),
    ({"json_schema": {"type": "number"}}, {"type": "number"}, "json_schema"),
    ({"response_format": {"type": "json_object"}}, {"type": "object"}, "response_format"),
])
def test_json_schemas_stay_schemas_whatever_field_brings_them(body, schema, param):
    assert constraint_fields(body) == {"output_schema": schema, "output_param": param}


def test_free_text_has_no_constraint():
    assert constraint_fields({}) == {}
    assert constraint_fields({"response_format": {"type": "text"}, "grammar": None}) == {}


def test_a_choice_answers_exactly_one_of_its_strings():
    matcher_grammar = grammar("choice", ["yes", "no thanks"], "guided_choice").definition
    assert "no thanks" in matcher_grammar and "yes" in matcher_grammar


@pytest.mark.parametrize("body,param", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar"),
    ({"grammar": "start: missing_rule"}, "grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 3]}, "guided_choice"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"json_schema": ["a list"]}, "json_schema"),
])
def test_a_grammar_that_cannot_compile_is_a_400_naming_its_field(body, param):
    with pytest.raises(InvalidParameterError) as raised:
        constraint_fields(body)
    assert raised.value.param == param and param in str(raised.value)


def test_only_one_constraint_may_be_given():
    with pytest.raises(InvalidParameterError, match="Only one of response_format, guided_regex") as raised:
        constraint_fields({"response_format": {"type": "json_object"}, "guided_regex": "a"})
    assert raised.value.param == "guided_regex"
    with pytest.raises(InvalidParameterError, match="exactly one of json"):
        constraint_fields({"structured_outputs": {"regex": "a", "choice": ["a"]}})
    with pytest.raises(InvalidParameterError, match="exactly one of json"):
        constraint_fields({"structured_outputs": {}})


def test_structured_outputs_options_phi_api_does_not_honour_are_refused():
    with pytest.raises(UnsupportedParameterError) as raised:
        constraint_fields({"structured_outputs": {"regex": "a", "structural_tag": json.dumps({})}})
    assert raised.value.param == "structured_outputs.structural_tag"
