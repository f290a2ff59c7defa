"""Completion features with a fake engine: n and the completion log-probability format."""

from __future__ import annotations

import math

import pytest

from tests.support.fakes import SCRIPTED_LOGIT, VOCAB, fake_engine, text_pieces
from tests.support.sse import parse_sse

BODY = {"model": "test-model", "prompt": "Once"}


def test_logprobs_in_the_completion_format(make_app):
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"upon", b" a", b" time"))
    client = make_app(engine).test_client()
    choice = client.post("/v1/completions", json={**BODY, "logprobs": 2}).get_json()["choices"][0]
    lists = choice["logprobs"]
    # the end of sequence too (the fake's spells as nothing): lm-eval reads the continuation's tokens before it
    assert lists["tokens"] == ["upon", " a", " time", ""] and "".join(lists["tokens"]) == choice["text"]
    assert lists["text_offset"] == [0, 4, 6, 11]
    scripted = SCRIPTED_LOGIT - math.log(math.exp(SCRIPTED_LOGIT) + VOCAB - 1)  # 0 but the scripted token's
    assert lists["token_logprobs"] == pytest.approx([scripted] * 4, abs=1e-5)
    assert all(len(top) >= 2 and entry in top
               for top, entry in zip(lists["top_logprobs"], lists["tokens"], strict=True))


def test_streamed_logprobs_continue_their_offsets(make_app):
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"upon", b" a", b" time"))
    client = make_app(engine).test_client()
    events = parse_sse(client.post("/v1/completions", json={**BODY, "logprobs": 0, "stream": True})
                       .get_data(as_text=True))[:-1]
    offsets = [offset for event in events for offset in (event["choices"][0]["logprobs"] or {}).get("text_offset", [])]
    assert offsets == [0, 4, 6, 11]


def test_n_completions(client):
    body = client.post("/v1/completions", json={**BODY, "n": 2}).get_json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 10


PIECES = text_pieces(b"upon", b" a", b" time")


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(make_app):
    """lm-eval's loglikelihood: token ids, echo, logprobs 1, max_tokens 1: the prompt's tokens come first, the first
    without a log-probability (null), each with its top alternatives, then the generated token's."""
    engine = fake_engine([1, 2, 3, 0], PIECES, prefix_cache="on")
    client = make_app(engine).test_client()
    body = {"model": "test-model", "prompt": [1, 2, 3], "echo": True, "logprobs": 1, "max_tokens": 1}
    choice = client.post("/v1/completions", json=body).get_json()["choices"][0]
    lists = choice["logprobs"]
    assert choice["text"] == "upon a timeupon"
    assert lists["tokens"] == ["upon", " a", " time", "upon"]
    assert lists["token_logprobs"][0] is None and lists["top_logprobs"][0] is None
    likely = SCRIPTED_LOGIT - math.log(math.exp(SCRIPTED_LOGIT) + VOCAB - 1)  # the fake: each next token likeliest
    assert lists["token_logprobs"][1:] == pytest.approx([likely] * 3, abs=1e-5)
    # lm-eval's greedy check: each token's log-probability is the best of its top alternatives
    assert all(logprob == max(top.values())
               for logprob, top in zip(lists["token_logprobs"][1:], lists["top_logprobs"][1:], strict=True))
    assert lists["text_offset"] == [0, 4, 6, 11]
    # the same prompt again is scored again (no reused prefix: its logits were never kept)
    again = client.post("/v1/completions", json=body).get_json()
    assert again["choices"][0]["logprobs"]["token_logprobs"] == lists["token_logprobs"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_continuation_the_model_would_end_keeps_its_last_token_as_lm_eval_slices_it(make_app):
    """lm-eval reads ``token_logprobs[len(context):-1]``, one entry past the prompt: when the model's next token
    ends the sequence, that entry is the end's, and the continuation's last token is kept."""
    engine = fake_engine([0], PIECES)  # the end of sequence first
    client = make_app(engine).test_client()
    body = {"model": "test-model", "prompt": [1, 2, 3], "echo": True, "logprobs": 1, "max_tokens": 1}
    answer = client.post("/v1/completions", json=body).get_json()
    lists = answer["choices"][0]["logprobs"]
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 1
    assert len(lists["token_logprobs"]) == 4 and lists["token_logprobs"][1:3] == lists["token_logprobs"][1:-1]
    assert lists["tokens"][:3] == ["upon", " a", " time"] and lists["token_logprobs"][-1] is not None


def test_tokens_that_split_a_character_are_spelled_as_bytes_and_offsets_point_into_the_text(make_app):
    engine = fake_engine([1, 2, 3, 4, 0], text_pieces(b"Hi ", "世".encode()[:2], "世".encode()[2:], b"!"))
    client = make_app(engine).test_client()
    body = {"model": "test-model", "prompt": [1, 2, 3, 4], "echo": True, "logprobs": 2, "max_tokens": 8}
    choice = client.post("/v1/completions", json=body).get_json()["choices"][0]
    lists, text = choice["logprobs"], choice["text"]
    assert text == "Hi 世!Hi 世!"
    spelled = ["Hi ", "bytes:\\xe4\\xb8", "bytes:\\x96", "!"]
    assert lists["tokens"] == spelled + spelled + [""]  # the prompt's and the answer's alike, then the end's
    # each offset is where its token's text starts: a character split over tokens starts at its first
    assert lists["text_offset"] == [0, 3, 3, 4, 5, 8, 8, 9, 10]
    assert all(len(top) == 2 and token in top for token, top in zip(lists["tokens"][1:], lists["top_logprobs"][1:],
                                                                     strict=True))


def test_echo_with_max_tokens_0_only_scores_the_prompt(make_app):
    engine = fake_engine([1, 2, 3, 0], PIECES)
    client = make_app(engine).test_client()
    body = {"model": "test-model", "prompt": [1, 2, 3], "echo": True, "logprobs": 0, "max_tokens": 0}
    answer = client.post("/v1/completions", json=body).get_json()
    choice = answer["choices"][0]
    assert choice["text"] == "upon a time" and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["token_logprobs"]) == 3 and choice["logprobs"]["token_logprobs"][0] is None
    assert answer["usage"]["completion_tokens"] == 0


def test_a_streamed_echo_carries_the_prompt_s_logprobs_first(make_app):
    engine = fake_engine([1, 2, 3, 0], PIECES)
    client = make_app(engine).test_client()
    body = {"model": "test-model", "prompt": [1, 2], "echo": True, "logprobs": 1, "max_tokens": 2, "stream": True}
    events = parse_sse(client.post("/v1/completions", json=body).get_data(as_text=True))[:-1]
    first = events[0]["choices"][0]
    assert first["text"] == "upon a" and first["logprobs"]["tokens"] == ["upon", " a"]
    assert first["logprobs"]["token_logprobs"][0] is None
    offsets = [offset for event in events for offset in (event["choices"][0]["logprobs"] or {}).get("text_offset", [])]
    assert offsets == [0, 4, 6, 10]


def test_a_streamed_echo_s_prompt_lists_are_made_on_a_pooled_thread_not_the_hub(make_app, monkeypatch):
    import _thread

    from phi_api.protocols.openai.shapes import CompletionShape

    made_on = []
    lists = CompletionShape._prompt_lists

    def recorded(self, index, records):
        made_on.append(_thread.get_ident())
        return lists(self, index, records)

    monkeypatch.setattr(CompletionShape, "_prompt_lists", recorded)
    client = make_app(fake_engine([1, 2, 3, 0], PIECES)).test_client()
    body = {"model": "test-model", "prompt": [1, 2], "echo": True, "logprobs": 1, "max_tokens": 2, "stream": True}
    events = parse_sse(client.post("/v1/completions", json=body).get_data(as_text=True))[:-1]
    assert events[0]["choices"][0]["logprobs"]["tokens"] == ["upon", " a"]
    assert len(made_on) == 1 and _thread.get_ident() not in made_on


@pytest.mark.parametrize("extreme", [{"temperature": 5e-324}, {"temperature": 1e-45, "top_p": 0.5},
                                     {"repetition_penalty": 1e-40, "temperature": 1.0}])
def test_extreme_sampling_values_still_answer(client, extreme):
    """What schemathesis sent: values the schemas allow whose arithmetic overflows (a 500 before)."""
    answer = client.post("/v1/completions", json={"model": "test-model", "prompt": "Hello Hello", "max_tokens": 4,
                                                 **extreme})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["choices"][0]["finish_reason"] in ("stop", "length")
