"""POST /v1/completions with a fake engine."""

from __future__ import annotations

import re
import threading

from tests.support.fakes import fake_engine, text_pieces
from tests.support.sse import completion_text, parse_sse

BODY = {"model": "test-model", "prompt": "Once upon a time"}


def test_non_streaming_response_has_openai_s_shape(client):
    response = client.post("/v1/completions", json=BODY)
    assert response.status_code == 200
    body = response.get_json()
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", body["id"])
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"text": "Hello, world!", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": len(BODY["prompt"]), "completion_tokens": 5,
                             "total_tokens": len(BODY["prompt"]) + 5, "prompt_tokens_details": {"cached_tokens": 0},
                             "completion_tokens_details": {"accepted_prediction_tokens": 0,
                                                           "rejected_prediction_tokens": 0}}


def test_the_prompt_is_used_as_it_is(client):
    body = client.post("/v1/completions", json=BODY).get_json()
    assert body["usage"]["prompt_tokens"] == len("Once upon a time")  # no chat template around it


def test_streaming_chunks_are_text_completion_chunks(client):
    events = parse_sse(client.post("/v1/completions", json={**BODY, "stream": True}).get_data(as_text=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["object"] == "text_completion.chunk" for chunk in chunks)
    assert all(chunk["id"].startswith("cmpl-") for chunk in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert chunks[-1]["choices"][0]["text"] == ""
    assert completion_text(events) == "Hello, world!"


def test_token_id_prompts(client):
    body = client.post("/v1/completions", json={**BODY, "prompt": [5, 6, 7]}).get_json()
    assert body["usage"]["prompt_tokens"] == 3
    body = client.post("/v1/completions", json={**BODY, "prompt": [[5, 6]]}).get_json()
    assert body["usage"]["prompt_tokens"] == 2


def test_a_list_of_prompts_is_answered_one_choice_per_prompt_times_n(client):
    prompts = ["Once upon a time", "Hi"]
    body = client.post("/v1/completions", json={**BODY, "prompt": prompts, "n": 2, "echo": True}).get_json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2, 3]
    assert [choice["text"] for choice in body["choices"]] == [prompt + "Hello, world!" for prompt in prompts
                                                              for _ in range(2)]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))  # each prompt once, not once per choice
    assert body["usage"]["completion_tokens"] == 4 * 5
    events = parse_sse(client.post("/v1/completions", json={**BODY, "prompt": prompts, "stream": True,
                                                            "stream_options": {"include_usage": True}}
                                   ).get_data(as_text=True))
    texts: dict[int, str] = {}
    for chunk in events[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "Hello, world!", 1: "Hello, world!"}
    assert events[-2]["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_echo_puts_the_prompt_first(client):
    body = client.post("/v1/completions", json={**BODY, "echo": True}).get_json()
    assert body["choices"][0]["text"] == "Once upon a timeHello, world!"
    events = parse_sse(client.post("/v1/completions", json={**BODY, "echo": True, "stream": True})
                       .get_data(as_text=True))
    assert completion_text(events) == "Once upon a timeHello, world!"


def test_a_stream_waiting_for_the_engine_sends_keepalive_comments(make_app):
    gate = threading.Semaphore(0)
    engine = fake_engine([1, 2, 0], text_pieces(b"Hi", b"!"))
    engine.model.script.gate = gate  # every step waits for the test
    client = make_app(engine).test_client()

    def let_it_run() -> None:
        for _ in range(10):  # every prompt chunk and token of the script, with room to spare
            gate.release()

    # Without keepalives, the first chunk would be the text once this lets the engine go.
    fallback = threading.Timer(10, let_it_run)
    fallback.start()
    response = client.post("/v1/completions", json={**BODY, "stream": True}, buffered=False)
    chunks = response.iter_encoded()
    first = next(chunks)
    fallback.cancel()
    assert first == b": keepalive\n\n"  # the engine has said nothing for a second
    let_it_run()
    events = parse_sse(b"".join(chunks).decode())
    assert completion_text(events) == "Hi!"
    assert events[-1] == "[DONE]"
