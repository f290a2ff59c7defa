"""OpenAI's Responses API through the official clients (the openai SDK, and the openai-agents SDK on its default
settings) against real gunicorn on the real model; the bodies and the streamed events are validated against
OpenAI's published schemas (tests/support/openai_schemas.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import openai
import pytest
import requests
from openai import OpenAI
from pydantic import BaseModel, Field

from tests.integration.conftest import MODEL_ID
from tests.support.openai_schemas import validate
from tests.support.sse import parse_named_sse

INSTRUCTIONS = "Answer briefly."
QUESTION = "What is the capital of France?"
# The enum keeps the small model's arguments short: the call ends, whatever the weights prefer.
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                          "required": ["city"], "additionalProperties": False}}


class City(BaseModel):
    name: str = Field(max_length=24)
    country: Literal["Japan", "France", "Italy"]


def create_raw(client: OpenAI, **body) -> openai.types.responses.Response:
    """responses.create, its raw body checked against OpenAI's schema before the SDK reads it."""
    raw = client.responses.with_raw_response.create(model=MODEL_ID, temperature=0, **body)
    validate("Response", raw.http_response.json())
    return raw.parse()


def pinned_client(server, pid: int) -> OpenAI:
    """An openai client whose keep-alive connection worker ``pid`` accepted."""

    def connect() -> httpx.Client:
        http = httpx.Client(timeout=120)
        http.get(server.url + "/health")
        return http

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                  http_client=server.connected_to(pid, connect))


def test_create_with_exact_usage(client, reference):
    response = create_raw(client, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=24,
                          metadata={"suite": "integration"})
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.output_text.strip()
    assert response.metadata == {"suite": "integration"} and response.instructions == INSTRUCTIONS
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    assert response.usage.input_tokens == reference.chat_tokens(messages)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    if response.status == "incomplete":
        assert response.usage.output_tokens == 24
        assert response.incomplete_details.reason == "max_output_tokens"


def test_the_raw_stream_is_the_documented_events(server):
    body = {"model": MODEL_ID, "input": QUESTION, "instructions": INSTRUCTIONS, "max_output_tokens": 16,
            "temperature": 0, "stream": True}
    answer = requests.post(server.url + "/v1/responses", json=body, timeout=120)
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = parse_named_sse(answer.text)
    for name, data in events:
        assert name == data["type"]
        validate("ResponseStreamEvent", data)
    names = [name for name, _ in events]
    final = events[-1][1]["response"]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if final["status"] == "completed" else "response.incomplete"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert deltas == final["output"][0]["content"][0]["text"]


def test_the_sdk_stream_equals_create_under_greedy_decoding(client):
    plain = create_raw(client, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=24)
    with client.responses.stream(model=MODEL_ID, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=24,
                                 temperature=0) as stream:
        events = list(stream)
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    # An answer cut at max_output_tokens ends with response.incomplete, which the SDK's get_final_response() does
    # not accept: the last event carries the response either way.
    last = events[-1]
    assert last.type == ("response.completed" if plain.status == "completed" else "response.incomplete")
    assert deltas == last.response.output_text == plain.output_text and deltas
    assert last.response.status == plain.status and last.response.usage.output_tokens == plain.usage.output_tokens


def test_parse_with_a_pydantic_model(client):
    parsed = client.responses.parse(model=MODEL_ID, input="Name a large city in Japan.", text_format=City,
                                    max_output_tokens=64, temperature=0)
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, City)  # the grammar held the answer to the schema
    assert City.model_validate_json(parsed.output_text) == parsed.output_parsed


def test_a_function_call_then_its_output_by_previous_response_id(client):
    first = create_raw(client, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                       max_output_tokens=64)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Paris", "London")
    follow_up = create_raw(client, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=24,
                           input=[{"type": "function_call_output", "call_id": call.call_id,
                                   "output": "Sunny, 24 degrees."}])
    assert follow_up.previous_response_id == first.id
    assert follow_up.usage.input_tokens > first.usage.input_tokens  # the whole conversation, then the output
    assert follow_up.output and follow_up.output[0].type in ("message", "function_call")
    for stray in ("never mind", [{"type": "function_call_output", "call_id": call.call_id + "x", "output": "?"}]):
        with pytest.raises(openai.BadRequestError) as unanswered:  # the call left without its output
            client.responses.create(model=MODEL_ID, previous_response_id=first.id, tools=[WEATHER], input=stray)
        assert unanswered.value.body["param"] == "input"


def test_the_whole_conversation_as_input_items(client):
    """How agent frameworks call: no stored state, every item sent again."""
    first = create_raw(client, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                       max_output_tokens=64, store=False)
    call = first.output[0]
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}]
    answer = create_raw(client, input=items, tools=[WEATHER], max_output_tokens=24, store=False)
    assert answer.status in ("completed", "incomplete") and answer.output
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)  # store=False kept nothing


def test_previous_response_id_on_another_worker_and_the_cache_on_the_same(server):
    workers = server.worker_pids()
    assert len(workers) == 2
    here, there = (pinned_client(server, pid) for pid in workers)
    first = create_raw(here, input="List three colours.", instructions=INSTRUCTIONS, max_output_tokens=16)
    # Instructions are not carried over from a previous response (as OpenAI's are not): they are sent again.
    follow_up = {"previous_response_id": first.id, "instructions": INSTRUCTIONS, "input": "And one more?",
                 "max_output_tokens": 8}
    elsewhere = create_raw(there, **follow_up)
    assert elsewhere.previous_response_id == first.id
    assert elsewhere.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert here.responses.retrieve(first.id).id == there.responses.retrieve(first.id).id == first.id
    again = create_raw(here, **follow_up)
    # The worker that answered first still holds its prompt and answer: the follow-up computes only what is new.
    assert again.usage.input_tokens == elsewhere.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_get_and_delete_a_stored_response(client):
    first = create_raw(client, input=QUESTION, max_output_tokens=4)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(model=MODEL_ID, previous_response_id=first.id, input="Again?", max_output_tokens=4)
    assert gone.value.code == "previous_response_not_found" and gone.value.param == "previous_response_id"


def test_a_hosted_tool_is_refused_in_openai_s_shape(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL_ID, input=QUESTION, tools=[{"type": "web_search"}])
    assert (refused.value.code, refused.value.param) == ("unsupported_parameter", "tools")


# The openai-agents SDK, on its default settings (which call the Responses API) ----------------------------------


class Report(BaseModel):
    city: Literal["Paris", "London"]
    summary: str = Field(max_length=40)


@pytest.fixture
def make_agent(server):
    """An Agent with one function tool and tool_choice="required" (and the calls its tool received), on a client of
    its own (an async client belongs to the event loop it first ran in)."""
    from agents import Agent, ModelSettings, function_tool, set_default_openai_client, set_tracing_disabled

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                                 timeout=120), use_for_tracing=False)
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "London"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    def make(**options):
        settings = ModelSettings(tool_choice="required", temperature=0, max_tokens=96)
        return Agent(name="Assistant", instructions=INSTRUCTIONS, model=MODEL_ID, tools=[get_weather],
                     model_settings=settings, **options)

    return make, calls


class Sky(BaseModel):
    sky: Literal["sunny", "cloudy", "rainy"]


def test_an_agent_calls_its_tool_and_reaches_a_final_output(make_agent):
    """The SDK raises on ``response.incomplete`` (a response cut by max_output_tokens), streamed or not, and how
    long a free-text answer runs depends on the CPU's kernels: a closed output type bounds the final answer."""
    from agents import Runner

    make, calls = make_agent
    result = Runner.run_sync(make(output_type=Sky), "What is the weather in Paris?", max_turns=4)
    assert calls and calls[0] in ("Paris", "London")
    assert isinstance(result.final_output, Sky)
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"


def test_an_agent_streamed_to_a_structured_final_output(make_agent):
    """Streamed, the SDK counts ``response.incomplete`` (how a response cut by max_output_tokens ends) as a failure:
    the structured output keeps the final answer within the token limit on any CPU."""
    from agents import Runner

    make, calls = make_agent

    async def run() -> tuple[Report, list[str]]:
        streamed = Runner.run_streamed(make(output_type=Report), "What is the weather in London?", max_turns=4)
        kinds = [event.type async for event in streamed.stream_events()]
        return streamed.final_output, kinds

    final_output, kinds = asyncio.run(run())
    assert calls and calls[0] in ("Paris", "London")
    assert isinstance(final_output, Report)
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds


def test_a_stream_of_megabyte_events_reaches_a_client_that_reads(client):
    """The Responses API echoes the request's tools in its events: a tool of 120,000 properties makes events of ~6 MB.
    Each write of a stream has STREAM_WRITE_TIMEOUT (1 s) to finish, and such an event took longer through the
    stream's small send buffer: the stream was cut after its first event. It goes a slice at a time now."""
    properties = {f"field_{index:06d}": {"type": "string", "description": "x" * 16} for index in range(120_000)}
    tool = {"type": "function", "name": "wide", "parameters": {"type": "object", "properties": properties}}
    events = list(client.responses.create(model=MODEL_ID, input="Hi", tools=[tool], tool_choice="none",
                                          max_output_tokens=4, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert len(events[-1].response.tools[0].parameters["properties"]) == 120_000
