"""Prompt reuse on the real model: the next turn of a conversation skips the shared prefill."""

from __future__ import annotations

import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

SYSTEM = "You are a helpful assistant. " + " ".join(f"Fact {i}: {i} squared is {i * i}." for i in range(40))


@pytest.fixture(scope="module")
def servers(model_path, logs_dir):
    """One worker with the prompt cache (so every turn meets it), and one without."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PROMPT_CACHE_MB=64) as cached, \
            Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PROMPT_CACHE_MB=0) as cold:
        yield (OpenAI(base_url=cached.url + "/v1", api_key="x", max_retries=0),
               OpenAI(base_url=cold.url + "/v1", api_key="x", max_retries=0))


def chat(client, messages):
    return client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=24, temperature=0)


def test_the_next_turn_reuses_the_conversation_and_answers_the_same(servers):
    cached, cold = servers
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me about fact 7."}]
    first = chat(cached, conversation)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    conversation += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And fact 9?"}]
    second = chat(cached, conversation)
    # The first turn's prompt comes from the cache; its answer and the new message are prefilled.
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    reference = chat(cold, conversation)
    assert reference.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == reference.choices[0].message.content  # exactly as cold
    assert second.usage.prompt_tokens == reference.usage.prompt_tokens


def test_streams_report_cached_tokens_too(servers):
    cached, _ = servers
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fact 3?"}]
    chat(cached, messages)
    chunks = list(cached.chat.completions.create(model=MODEL_ID, messages=messages + [
        {"role": "assistant", "content": "x"}, {"role": "user", "content": "Fact 4?"}], max_tokens=8,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
