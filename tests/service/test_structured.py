"""Structured output as OpenAI and vLLM do it: no undeclared keys (unless a schema allows them on purpose), and
strict schemas held to OpenAI's strict-mode rules, with OpenAI's error codes and words."""

from __future__ import annotations

import json

import pytest

from phi_api.service.grammar import closed, strict_violation

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_objects_that_declare_their_properties_get_no_others():
    schema = {"type": "object", "properties": {"people": {"type": "array", "items": PERSON},
                                               "boss": {"anyOf": [PERSON, {"type": "null"}]}}, "required": ["people"]}
    result = closed(schema)
    assert result["additionalProperties"] is False
    assert result["properties"]["people"]["items"]["additionalProperties"] is False
    assert result["properties"]["boss"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in PERSON  # the request's own schema is left as it was


def test_objects_open_on_purpose_stay_open():
    assert closed({"type": "object"}) == {"type": "object"}  # json_object: any object
    allowing = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}
    assert closed(allowing) == allowing
    defs = closed({"$defs": {"p": PERSON}, "$ref": "#/$defs/p"})
    assert defs["$defs"]["p"]["additionalProperties"] is False


@pytest.mark.parametrize("schema,violation", [
    (PERSON, "In context=(), 'additionalProperties' is required to be supplied and to be false."),
    ({**PERSON, "additionalProperties": False, "required": ["name"]},
     "In context=(), 'required' is required to be supplied and to be an array including every key in properties. "
     "Missing 'age'."),
    ({"type": "object", "additionalProperties": False, "required": ["p"], "properties": {"p": PERSON}},
     "In context=('properties', 'p'), 'additionalProperties' is required to be supplied and to be false."),
    ({**PERSON, "additionalProperties": False}, None),
])
def test_strict_mode_rules_in_openai_s_words(schema, violation):
    assert strict_violation(schema) == violation


@pytest.fixture
def recorded(make_app):
    from tests.support.fakes import fake_engine, text_pieces

    engine = fake_engine([1, 0], text_pieces(b"{}"))
    return make_app(engine).test_client(), engine.model.script


def chat(client, **extra):
    return client.post("/v1/chat/completions", json={"model": "test-model", "messages": [
        {"role": "user", "content": "Who?"}], **extra})


def test_a_plain_pydantic_schema_gets_a_grammar_without_undeclared_keys(recorded):
    client, script = recorded
    response = chat(client, response_format={"type": "json_schema", "json_schema": {"name": "Person",
                                                                                   "schema": PERSON}})
    assert response.status_code == 200
    kind, grammar = script.grammars[-1]
    assert kind == "json_schema" and json.loads(grammar)["additionalProperties"] is False


def test_a_forced_tool_s_arguments_get_no_undeclared_keys(recorded):
    client, script = recorded
    tool = {"type": "function", "function": {"name": "record", "parameters": PERSON}}
    assert chat(client, tools=[tool], tool_choice="required").status_code == 200
    grammar = json.loads(script.grammars[-1][1])
    assert grammar["properties"]["arguments"]["additionalProperties"] is False


def test_a_strict_schema_outside_strict_mode_is_refused_as_openai_does(recorded):
    client, _ = recorded
    response = chat(client, response_format={"type": "json_schema", "json_schema": {"name": "Person", "strict": True,
                                                                                   "schema": PERSON}})
    error = response.get_json()["error"]
    assert response.status_code == 400
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_json_schema",
                                                              "response_format")
    assert error["message"] == ("Invalid schema for response_format 'Person': In context=(), 'additionalProperties' "
                                "is required to be supplied and to be false.")


def test_a_strict_function_outside_strict_mode_is_refused_as_openai_does(recorded):
    client, _ = recorded
    tool = {"type": "function", "function": {"name": "record", "strict": True, "parameters": PERSON}}
    error = chat(client, tools=[tool]).get_json()["error"]
    assert (error["code"], error["param"]) == ("invalid_function_parameters", "tools")
    assert error["message"].startswith("Invalid schema for function 'record': In context=(), 'additionalProperties'")


def test_strict_schemas_that_keep_the_rules_are_served(recorded):
    client, _ = recorded
    schema = {**PERSON, "additionalProperties": False}
    response = chat(client, response_format={"type": "json_schema", "json_schema": {"name": "Person", "strict": True,
                                                                                   "schema": schema}})
    assert response.status_code == 200


class CountingRequired(list):
    """A ``required`` array that counts its reads (a list's ``in`` reads it all: N properties made N x N reads)."""

    reads = 0

    def __iter__(self):
        for item in super().__iter__():
            self.reads += 1
            yield item

    def __contains__(self, item):
        return any(item == name for name in self)


def test_strict_rules_read_required_once_however_many_properties():
    names = [f"p{i}" for i in range(2000)]
    required = CountingRequired(names)
    schema = {"type": "object", "properties": {name: {"type": "string"} for name in names},
              "required": required, "additionalProperties": False}
    assert strict_violation(schema) is None
    assert required.reads <= len(names)
    required.pop()
    assert "Missing 'p1999'" in strict_violation(schema)



def test_a_deep_violation_is_placed_and_only_a_violation_s_path_is_spelled_out(monkeypatch):
    from phi_api.service import grammar

    spelled = []
    where = grammar._where
    monkeypatch.setattr(grammar, "_where", lambda path: spelled.append(path) or where(path))
    deep: dict = {"anyOf": [{} for _ in range(1000)] + [{"type": "object", "properties": {"a": {}}}]}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    found = strict_violation(deep)
    assert found == ("In context=(" + "'items', " * 200 + "'anyOf', '1000'), 'additionalProperties' is required to "
                     "be supplied and to be false.")
    assert len(spelled) == 1
    deep_ok = {"type": "array", "items": {"anyOf": [{} for _ in range(1000)]}}
    assert strict_violation(deep_ok) is None and len(spelled) == 1
