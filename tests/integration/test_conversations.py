"""OpenAI's Conversations API against real gunicorn (two workers, the real model) through the openai SDK and
openai-agents' OpenAIConversationsSession: a conversation's items kept on the server, responses that read and extend
it, and each key's conversations kept from the others."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Literal

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

TEAM_A, TEAM_B = "sk-conversations-a", "sk-conversations-b"
# A closed answer keeps each turn short whatever the weights prefer: what the test checks is what the model read.
WORD = {"format": {"type": "json_schema", "name": "word", "strict": True, "schema": {
    "type": "object", "properties": {"word": {"type": "string", "enum": ["yes", "no", "maybe"]}},
    "required": ["word"], "additionalProperties": False}}}
LONG = " ".join(f"Line {i}: the harbour master logged ship {i} at berth {i % 9}." for i in range(40))  # ~700 tokens


@pytest.fixture(scope="module")
def served(model_path, logs_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("conversations")
    keys = root / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": TEAM_A}, {"name": "team-b", "key": TEAM_B}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, API_KEYS_FILE=str(keys),
                DATA_DIR=str(root / "data")) as running:
        yield running


def client(server: Server, key: str = TEAM_A) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=300)


def test_a_conversation_and_its_items_through_the_sdk(served):
    api = client(served).conversations
    made = api.create(items=[{"type": "message", "role": "user", "content": "Hello there."}],
                      metadata={"topic": "greeting"})
    assert made.id.startswith("conv_") and made.metadata == {"topic": "greeting"}
    added = api.items.create(made.id, items=[{"type": "message", "role": "assistant", "content": "Hi!"},
                                             {"type": "message", "role": "user", "content": "How are you?"}])
    assert [item.role for item in added.data] == ["assistant", "user"]
    listed = api.items.list(made.id, order="asc")
    assert [(item.role, item.content[0].text) for item in listed.data] == [
        ("user", "Hello there."), ("assistant", "Hi!"), ("user", "How are you?")]
    assert [item.id for item in api.items.list(made.id, order="desc", limit=2).data] == [
        listed.data[2].id, listed.data[1].id]
    after = api.items.list(made.id, order="asc", after=listed.data[0].id, limit=1)
    assert [item.id for item in after.data] == [listed.data[1].id] and after.has_more
    assert api.items.retrieve(listed.data[1].id, conversation_id=made.id).content[0].text == "Hi!"
    assert api.update(made.id, metadata={"topic": "small talk"}).metadata == {"topic": "small talk"}
    assert api.items.delete(listed.data[1].id, conversation_id=made.id).id == made.id
    assert len(api.items.list(made.id).data) == 2
    assert api.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.retrieve(made.id)


def test_a_reasoning_item_is_kept_in_the_shape_the_sdk_reads(served):
    api = client(served).conversations
    made = api.create(items=[{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Sum two numbers."}]}])
    [item] = api.items.list(made.id).data
    assert (item.type, [part.text for part in item.summary]) == ("reasoning", ["Sum two numbers."])
    with pytest.raises(openai.BadRequestError):
        api.items.create(made.id, items=[{"type": "reasoning", "summary": [{"type": "summary_text", "text": 4}]}])
    assert len(api.items.list(made.id).data) == 1


def test_three_turns_of_responses_read_and_extend_the_conversation(served):
    sdk = client(served)
    conversation = sdk.conversations.create()
    used = []
    for question in ("Is the sea salty?", "Is fire cold?", "Will it rain tomorrow?"):
        answered = sdk.responses.create(model=MODEL_ID, conversation=conversation.id, input=question, text=WORD,
                                        temperature=0, max_output_tokens=32)
        assert answered.status == "completed" and answered.conversation.id == conversation.id
        assert json.loads(answered.output_text)["word"] in ("yes", "no", "maybe")
        used.append(answered.usage)
    # each turn's prompt holds the earlier turns: their prompts and answers at least
    for before, after in itertools.pairwise(used):
        assert after.input_tokens > before.input_tokens + before.output_tokens
    items = sdk.conversations.items.list(conversation.id, order="asc").data
    assert [item.role for item in items] == ["user", "assistant"] * 3
    assert [item.content[0].text for item in items[::2]] == [
        "Is the sea salty?", "Is fire cold?", "Will it rain tomorrow?"]


def test_a_conversation_past_the_context_is_refused_unless_truncated(served):
    sdk = client(served)
    conversation = sdk.conversations.create(items=[{"type": "message", "role": "user", "content": f"{i}. {LONG}"}
                                                   for i in range(14)])  # ~10,000 tokens: past the 8,192
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL_ID, conversation=conversation.id, input="Summarize.", max_output_tokens=8)
    assert refused.value.body["param"] == "conversation" and refused.value.body["code"] == "context_length_exceeded"
    answered = sdk.responses.create(model=MODEL_ID, conversation=conversation.id, input="Summarize.",
                                    max_output_tokens=8, truncation="auto", temperature=0)
    assert answered.status in ("completed", "incomplete") and answered.usage.input_tokens < 8192 - 8
    assert answered.usage.input_tokens > 6000  # as few dropped as make it fit


def test_previous_response_id_and_conversation_together_are_refused(served):
    sdk = client(served)
    conversation = sdk.conversations.create()
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL_ID, conversation=conversation.id, previous_response_id="resp_x",
                             input="Hi")
    assert refused.value.body["param"] == "conversation"


def test_another_keys_conversation_is_one_that_never_was(served):
    mine, theirs = client(served, TEAM_A), client(served, TEAM_B)
    made = mine.conversations.create(items=[{"type": "message", "role": "user", "content": "secret plans"}])
    for attempt in (lambda: theirs.conversations.retrieve(made.id),
                    lambda: theirs.conversations.items.list(made.id),
                    lambda: theirs.conversations.update(made.id, metadata={"x": "y"}),
                    lambda: theirs.conversations.items.create(made.id, items=[{"role": "user", "content": "hi"}]),
                    lambda: theirs.conversations.delete(made.id),
                    lambda: theirs.responses.create(model=MODEL_ID, conversation=made.id, input="What plans?",
                                                    max_output_tokens=4)):
        with pytest.raises(openai.NotFoundError) as hidden:
            attempt()
        assert hidden.value.body["message"] == f"Conversation with id '{made.id}' not found."
    never = "conv_" + "0" * 48  # answered as a conversation that never was
    with pytest.raises(openai.NotFoundError) as missing:
        theirs.conversations.retrieve(never)
    assert missing.value.body["message"] == f"Conversation with id '{never}' not found."
    assert [item.content[0].text for item in mine.conversations.items.list(made.id).data] == ["secret plans"]


class Word(BaseModel):
    """A closed answer (strict JSON schema), as WORD above: each turn ends within its tokens whatever the weights."""

    word: Literal["hello", "goodbye", "yes", "no"]


def test_an_agents_conversations_session_over_two_turns(served):
    from agents import Agent, ModelSettings, OpenAIConversationsSession, Runner, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)

    async def run() -> list[dict]:
        http = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key=TEAM_A, max_retries=0, timeout=300)
        session = OpenAIConversationsSession(openai_client=http)
        agent = Agent(name="Assistant", instructions="Answer in one word.", output_type=Word,
                      model=OpenAIResponsesModel(model=MODEL_ID, openai_client=http),
                      model_settings=ModelSettings(temperature=0, max_tokens=24))
        await Runner.run(agent, "Say hello.", session=session)
        await Runner.run(agent, "Say goodbye.", session=session)
        return await session.get_items()

    items = asyncio.run(run())
    said = [item["content"][0]["text"] for item in items if item.get("role") == "user"]
    assert said == ["Say hello.", "Say goodbye."]
    assert sum(1 for item in items if item.get("role") == "assistant") == 2
