"""Prefix reuse on the real model: the next turn of a conversation skips the shared prefill; with
PREFIX_CACHE=exact it answers exactly as a cold request, whatever the chunk size and wherever the prompts end
against the chunk grid; with PREFIX_CACHE=on (the default) the previous answer is reused too."""

from __future__ import annotations

import pytest
from openai import OpenAI

from phi_api.engine.kv.reuse import MIN_REUSED_TOKENS
from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

SYSTEM = "You are a helpful assistant. " + " ".join(f"Fact {i}: {i} squared is {i * i}." for i in range(40))
TEXT = " ".join(f"Line {i}: the {i}th bird sang {i % 7} songs before the storm of year {1900 + i}." for i in range(30))


@pytest.fixture(scope="module", params=[64, 7], ids=["chunk-64", "chunk-7"])
def servers(request, model_path, logs_dir):
    """One worker reusing prefixes exactly (one worker: every turn meets its kept rows), and one reusing nothing;
    same prefill chunk."""
    chunk = request.param
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE="exact",
                PREFILL_CHUNK_TOKENS=chunk) as cached, \
            Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE="off",
                   PREFILL_CHUNK_TOKENS=chunk) as cold:
        yield (OpenAI(base_url=cached.url + "/v1", api_key="x", max_retries=0),
               OpenAI(base_url=cold.url + "/v1", api_key="x", max_retries=0), chunk)


def chat(client, messages):
    return client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=24, temperature=0)


def test_the_next_turn_reuses_the_conversation_and_answers_the_same(servers):
    cached, cold, chunk = servers
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me about fact 7."}]
    first = chat(cached, conversation)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    conversation += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And fact 9?"}]
    second = chat(cached, conversation)
    # The first turn's prompt is reused, up to the chunk grid; the rest (the answer included) is prefilled.
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens // chunk * chunk
    reference = chat(cold, conversation)
    assert reference.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == reference.choices[0].message.content  # exactly as cold
    assert second.usage.prompt_tokens == reference.usage.prompt_tokens


@pytest.mark.parametrize("first,second", [(40, 41), (63, 64), (64, 65), (65, 66), (70, 77), (127, 128),
                                          (128, 130), (133, 140)])
def test_a_reused_prompt_gives_the_cold_logits_bit_for_bit(servers, reference_ids, first, second):
    """Token-id prompts around the chunk boundaries: the reused request's log-probabilities (the model's raw
    logits, normalized) equal the cold request's exactly, so its answer does too."""
    cached, cold, chunk = servers
    ids = [reference_ids[first % 50]] + reference_ids  # a prefix no other case shares
    cached.completions.create(model=MODEL_ID, prompt=ids[:first], max_tokens=2, temperature=0)
    kwargs = dict(model=MODEL_ID, prompt=ids[:second], max_tokens=12, temperature=0, logprobs=5)
    warm, reference = cached.completions.create(**kwargs), cold.completions.create(**kwargs)
    reused = warm.usage.prompt_tokens_details.cached_tokens
    on_grid = min(first, second - 1) // chunk * chunk
    assert reused == (on_grid if on_grid >= MIN_REUSED_TOKENS else 0)
    assert warm.choices[0].text == reference.choices[0].text
    assert warm.choices[0].logprobs.token_logprobs == reference.choices[0].logprobs.token_logprobs
    assert warm.choices[0].logprobs.top_logprobs == reference.choices[0].logprobs.top_logprobs


def test_streams_report_cached_tokens_too(servers):
    cached, _, _ = servers
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fact 3?"}]
    chat(cached, messages)
    chunks = list(cached.chat.completions.create(model=MODEL_ID, messages=messages + [
        {"role": "assistant", "content": "x"}, {"role": "user", "content": "Fact 4?"}], max_tokens=8,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_by_default_the_next_turn_reuses_the_previous_answer_too(model_path, logs_dir):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me about fact 7."}]
        first = chat(client, conversation)
        conversation += [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "And fact 9?"}]
        second = chat(client, conversation)
    assert first.usage.completion_tokens > 2
    # More than the first prompt: the answer's keys and values, computed while it was generated, are reused.
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens + 1
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


@pytest.fixture(scope="module")
def reference_ids(reference_model):
    ids = [int(token) for token in reference_model[1].encode(TEXT)]
    assert len(ids) > 200
    return ids
