"""Schemas a client got wrong (response_format, tool parameters): 400 with the path, before any byte of a stream."""

from __future__ import annotations

import pytest

from tests.api.test_chat_features import CHAT, WEATHER, scripted
from tests.api.test_request_errors import assert_error

BAD_SCHEMAS = [{"type": "hiccup"}, {"type": 123}, {"type": "string", "pattern": "("}, {"properties": 5},
               {"$ref": "#/nowhere"}, {"anyOf": []}]


@pytest.mark.parametrize("stream_it", [False, True])
@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_an_invalid_response_schema_is_a_400_with_its_path(make_app, schema, stream_it):
    client, engine = scripted(make_app, b"{}")
    body = {**CHAT, "stream": stream_it,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}
    error = assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                         "invalid_parameter", "response_format.json_schema.schema")
    assert "not a valid JSON Schema" in error["message"]
    assert engine.model.script.params == [] and engine.model.script.steps == []  # nothing was started


@pytest.mark.parametrize("stream_it", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "broken"}}])
def test_invalid_parameters_of_a_forced_tool_are_a_400_naming_the_tool(make_app, tool_choice, stream_it):
    client, engine = scripted(make_app, b"{}")
    broken = {"type": "function", "function": {"name": "broken", "parameters": {"type": "hiccup"}}}
    body = {**CHAT, "stream": stream_it, "tools": [WEATHER, broken], "tool_choice": tool_choice}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                 "invalid_parameter", "tools[1].function.parameters")
    assert engine.model.script.params == [] and engine.model.script.steps == []


@pytest.mark.parametrize("stream_it", [False, True])
def test_a_schema_too_deep_for_the_compiler_is_a_400_and_the_worker_lives(make_app, stream_it):
    from tests.service.test_grammar_limits import chain

    client, engine = scripted(make_app, b"{}")
    body = {**CHAT, "stream": stream_it,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": chain(1000)}}}
    error = assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                         "invalid_parameter", "response_format.json_schema.schema")
    assert "nests too deeply" in error["message"]
    assert engine.model.script.params == [] and engine.model.script.steps == []


def test_valid_schemas_pass_the_check(make_app):
    client, _ = scripted(make_app, b"{}")
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
              "$defs": {"unused": {"type": "integer"}}}
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
