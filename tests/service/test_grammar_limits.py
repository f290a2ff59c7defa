"""Schemas and grammars too large for llguidance's compiler (a chain of references deep enough to overflow a
thread's stack, which kills the worker; patterns whose intersections take seconds) are refused with a 400 before
they reach it, and the largest ones allowed still compile."""

from __future__ import annotations

import json

import pytest
from llguidance import LLMatcher

from phi_api.errors import InvalidParameterError
from phi_api.service.constraints import MAX_GRAMMAR_RULES, grammar
from phi_api.service.grammar import (
    MAX_PATTERN_PROPERTIES,
    MAX_PATTERNS_AT_ONCE,
    MAX_SCHEMA_LEVELS,
    check_json_schema,
    patterns_at_once,
    schema_levels,
)


def chain(links: int) -> dict:
    """Objects each holding the next by reference: the shape that overflowed the stack at ~1,000 links."""
    defs = {str(i): {"type": "object", "properties": {"a": {"$ref": f"#/$defs/{i + 1}"}}, "required": ["a"]}
            for i in range(links)}
    defs[str(links)] = {"type": "integer"}
    return {"$ref": "#/$defs/0", "$defs": defs}


def lark_chain(rules: int) -> str:
    return "start: r0\n" + "".join(f'r{i}: "a" r{i + 1}\n' for i in range(rules)) + f'r{rules}: "b"\n'


def test_levels_count_the_nesting_and_each_referenced_definition_once():
    assert schema_levels({"type": "integer"}) == (1, 0)
    # root -> $defs -> a: 3 levels; the reference adds one, and a's own level
    single = {"$ref": "#/$defs/a", "$defs": {"a": {"type": "integer"}}}
    assert schema_levels(single) == (5, 0)
    twice = {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "integer"}}}
    assert schema_levels(twice)[0] == schema_levels({**twice, "anyOf": [{"$ref": "#/$defs/a"}, {}]})[0]
    # a reference that points nowhere (llguidance says why) or outside counts its one level
    assert schema_levels({"$ref": "#/nowhere"}) == (2, 0)
    assert schema_levels({"$ref": "https://example.com/s.json"}) == (2, 0)
    assert schema_levels(chain(10))[0] < schema_levels(chain(20))[0]


def test_a_recursive_schema_counts_its_cycle_once():
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}
    levels, _ = schema_levels(tree)
    assert levels < 20
    check_json_schema(tree, "schema")


def test_a_chain_of_references_past_the_limit_is_a_400_not_a_crash():
    # without the limit this request ends the process with SIGSEGV inside llguidance
    with pytest.raises(InvalidParameterError, match="nests too deeply") as caught:
        check_json_schema(chain(1000), "response_format.json_schema.schema")
    assert caught.value.param == "response_format.json_schema.schema"


def test_the_longest_chain_allowed_compiles():
    links = max(n for n in range(1, 400) if schema_levels(chain(n))[0] <= MAX_SCHEMA_LEVELS)
    assert schema_levels(chain(links + 1))[0] > MAX_SCHEMA_LEVELS
    check_json_schema(chain(links), "schema")  # compiles on a pooled thread's stack


def test_too_many_property_name_patterns_are_a_400():
    def patterned(count: int) -> dict:
        return {"type": "object", "patternProperties": {f"^a{i}[a-z]*$": {"type": "string"} for i in range(count)}}

    check_json_schema(patterned(MAX_PATTERN_PROPERTIES), "schema")
    with pytest.raises(InvalidParameterError, match="patternProperties"):
        check_json_schema(patterned(MAX_PATTERN_PROPERTIES + 1), "schema")


@pytest.mark.parametrize("text", [lark_chain(3000),
                                  "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(3000))
                                  + 'r3000 ::= "b"\n'])
def test_a_grammar_of_too_many_rules_is_a_400_not_a_crash(text):
    with pytest.raises(InvalidParameterError, match=f"more than {MAX_GRAMMAR_RULES} rules") as caught:
        grammar("grammar", text, "guided_grammar")
    assert caught.value.param == "guided_grammar"


def test_the_largest_grammar_allowed_compiles():
    found = grammar("grammar", lark_chain(MAX_GRAMMAR_RULES - 2), "guided_grammar")
    assert LLMatcher.validate_grammar(found.definition) == ""


def test_a_schema_within_a_grammar_is_held_to_the_same_limits():
    text = f"start: %json {json.dumps(chain(1000))}\n"
    with pytest.raises(InvalidParameterError, match="nests too deeply"):
        grammar("grammar", text, "guided_grammar")
    small = grammar("grammar", f"start: %json {json.dumps(chain(3))}\n", "guided_grammar")
    assert LLMatcher.validate_grammar(small.definition) == ""


def hard(count: int) -> list[str]:
    """Patterns whose intersection llguidance's emptiness check takes ~2x longer to give up on with each more (what
    an outside review sent: 23 of them took 28 s of a core, 27 minutes and gigabytes)."""
    return [f"^.*a.{{{i}}}$" for i in range(1, count + 1)]


@pytest.mark.parametrize("shape", ["allOf", "references", "nested"])
def test_too_many_patterns_one_value_must_match_at_once_are_a_400(shape):
    def schema(count: int) -> dict:
        patterns = hard(count)
        if shape == "allOf":
            return {"type": "string", "allOf": [{"pattern": pattern} for pattern in patterns]}
        if shape == "references":
            return {"type": "string", "allOf": [{"$ref": f"#/$defs/p{i}"} for i in range(count)],
                    "$defs": {f"p{i}": {"pattern": pattern} for i, pattern in enumerate(patterns)}}
        nested: dict = {"type": "string", "pattern": patterns[0]}
        for pattern in patterns[1:]:
            nested = {"allOf": [nested, {"pattern": pattern}]}
        return nested

    assert patterns_at_once(schema(MAX_PATTERNS_AT_ONCE)) == MAX_PATTERNS_AT_ONCE
    with pytest.raises(InvalidParameterError, match="patterns at once"):
        check_json_schema(schema(30), "response_format")
    check_json_schema({"type": "string", "allOf": [{"pattern": "^[a-z]+$"}, {"pattern": "^.{2,8}$"}]}, "x")


def test_patterns_of_different_values_are_not_counted_together_and_a_cycle_ends():
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": pattern}
                                             for i, pattern in enumerate(hard(40))}}
    assert patterns_at_once(many) == 1
    check_json_schema(many, "response_format")
    looped = {"$defs": {"a": {"pattern": "^a", "allOf": [{"$ref": "#/$defs/b"}]},
                        "b": {"pattern": "b$", "allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
    assert 2 <= patterns_at_once(looped) <= MAX_PATTERNS_AT_ONCE + 1
    shared = {"$defs": {"p": {"pattern": "^x"}}, "allOf": [{"$ref": "#/$defs/p"}] * 3}  # one pattern met 3 ways
    assert patterns_at_once(shared) == 3



def test_a_reference_with_a_digit_int_cannot_read_is_refused_not_a_crash():
    """"²" is a digit to str.isdigit(), not to int(): the reference's walk once raised (a 500)."""
    with pytest.raises(InvalidParameterError):
        check_json_schema({"anyOf": [{"type": "string"}], "$ref": "#/anyOf/\u00b2"}, "schema")
