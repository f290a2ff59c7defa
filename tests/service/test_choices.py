"""A choice's engine events into what a client is told: text at once, text that may become a call held back,
calls at the end, a forced call cut short told as far as it got."""

from __future__ import annotations

from phi_api.engine import Finished, TextDelta
from phi_api.service.choices import Calls, ChoiceAssembler, ChoiceResult, Done, Text
from phi_api.service.tools import tool_plan

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def finished(reason: str = "stop") -> Finished:
    return Finished(reason, 3, 4, 0.1, 0.2)


def test_without_tools_text_is_told_as_it_comes():
    assembler = ChoiceAssembler(0, None)
    assert assembler.add(TextDelta("Hel")) == [Text(0, "Hel")]
    assert assembler.add(TextDelta("lo")) == [Text(0, "lo")]
    assert assembler.close(finished()) == [Done(0, "stop", finished())]


def test_auto_holds_text_while_it_could_start_a_call_then_releases_it():
    assembler = ChoiceAssembler(1, tool_plan([WEATHER], "auto", True))
    assert assembler.add(TextDelta("<tool")) == []  # could be a call
    assert assembler.add(TextDelta(" no, ")) == [Text(1, "<tool no, ")]  # cannot any more: all that was held
    assert assembler.add(TextDelta("fine")) == [Text(1, "fine")]


def test_a_call_in_the_answer_is_told_as_calls_with_reason_tool_calls():
    assembler = ChoiceAssembler(0, tool_plan([WEATHER], "auto", True))
    for piece in ('{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}'):
        assert assembler.add(TextDelta(piece)) == []
    calls, done = assembler.close(finished())
    assert isinstance(calls, Calls) and calls.calls[0].name == "get_weather"
    assert calls.calls[0].value == {"city": "Oslo"} and done.reason == "tool_calls"


def test_an_answer_that_opened_as_text_stays_text_whatever_json_it_writes_later():
    """A format whose calls open the answer: text told is never taken back as a call (told and run both)."""
    assembler = ChoiceAssembler(0, tool_plan([WEATHER], "auto", True))
    told = assembler.add(TextDelta("The weather in Paris is:\n"))
    told += assembler.add(TextDelta('{"name": "get_weather", "arguments": {"city": "Paris"}}'))
    assert "".join(event.text for event in told) == 'The weather in Paris is:\n{"name": "get_weather", ' \
        '"arguments": {"city": "Paris"}}'
    assert assembler.close(finished()) == [Done(0, "stop", finished())]


def test_a_forced_call_cut_by_max_tokens_is_told_as_far_as_it_got():
    assembler = ChoiceAssembler(0, tool_plan([WEATHER], "required", True))
    assembler.add(TextDelta('{"name": "get_weather", "arguments": {"city": "Os'))
    calls, done = assembler.close(finished("length"))
    assert calls.calls[0].arguments == '{"city": "Os' and done.reason == "length"


def test_a_choice_result_adds_up_what_it_is_told():
    result = ChoiceResult(0)
    for event in (Text(0, "a", (("a", 1),)), Text(0, "b"), Done(0, "stop", finished())):
        result.take(event)
    assert (result.text, result.logprobs, result.ended.reason) == ("ab", [("a", 1)], "stop")
