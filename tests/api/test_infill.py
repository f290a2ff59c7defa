"""Fill-in-the-middle with a fake engine: ``suffix`` on ``/v1/completions`` and on Ollama's generate lays the prompt
out prefix-suffix-middle with the model's own tokens for it; a model without them gets a 400 naming ``suffix``."""

from __future__ import annotations

import json

from tests.support.fakes import VOCAB, fake_engine, text_pieces

FIM = (61, 62, 63)  # the fake tokenizer's prefix, suffix and middle tokens
PIECES = text_pieces(b"return ", b"a + b")


def encoded(text: str) -> list[int]:
    return [1 + ord(ch) % (VOCAB - 1) for ch in text]  # the fake model's encoding (tests/support/fakes.py)


def fim_app(make_app):
    engine = fake_engine([1, 2, 0], PIECES, fim_tokens=FIM)
    return engine, make_app(engine=engine).test_client()


def test_a_suffix_fills_the_hole_between_prompt_and_suffix(make_app):
    engine, client = fim_app(make_app)
    body = {"model": "test-model", "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))"}
    answer = client.post("/v1/completions", json=body).get_json()
    assert answer["choices"][0]["text"] == "return a + b"
    assert engine.model.script.prompts == [[61, *encoded(body["prompt"]), 62, *encoded(body["suffix"]), 63]]
    assert answer["usage"]["prompt_tokens"] == len(body["prompt"]) + len(body["suffix"]) + 3


def test_ollama_s_generate_takes_a_suffix_too(make_app):
    engine, client = fim_app(make_app)
    answer = client.post("/api/generate", json={"model": "test-model", "prompt": "x = ", "suffix": "\n",
                                                "stream": False}).get_json()
    assert answer["response"] == "return a + b" and answer["done"] is True
    assert engine.model.script.prompts == [[61, *encoded("x = "), 62, *encoded("\n"), 63]]


def test_an_empty_suffix_is_a_plain_completion(make_app):
    engine, client = fim_app(make_app)
    client.post("/v1/completions", json={"model": "test-model", "prompt": "abc", "suffix": ""})
    assert engine.model.script.prompts == [encoded("abc")]


def test_a_model_without_fill_in_the_middle_tokens_refuses_a_suffix(client):
    for route, body in (("/v1/completions", {"prompt": "a", "suffix": "b"}),
                        ("/api/generate", {"prompt": "a", "suffix": "b", "stream": False})):
        answer = client.post(route, json={"model": "test-model", **body})
        assert answer.status_code == 400
        error = answer.get_json()["error"]
        assert "fill-in-the-middle" in (error if isinstance(error, str) else error["message"])


def test_suffix_with_echo_or_token_ids_is_a_400(make_app):
    _, client = fim_app(make_app)
    echo = client.post("/v1/completions", json={"model": "test-model", "prompt": "a", "suffix": "b", "echo": True})
    assert echo.status_code == 400 and echo.get_json()["error"]["param"] == "echo"
    ids = client.post("/v1/completions", json={"model": "test-model", "prompt": [5, 6], "suffix": "b"})
    assert ids.status_code == 400 and ids.get_json()["error"]["param"] == "prompt"


def test_llama_cpp_s_infill_lays_out_extra_prefix_suffix_middle_and_prompt(make_app):
    engine, client = fim_app(make_app)
    body = {"input_extra": [{"filename": "util.py", "text": "X=1\n"}], "input_prefix": "a = ", "input_suffix": "\n",
            "prompt": "b", "n_predict": 16, "temperature": 0}  # no model: the server's own, as llama.cpp serves one
    answer = client.post("/infill", json=body).get_json()
    assert engine.model.script.prompts == [[*encoded("X=1\n"), 61, *encoded("a = "), 62, *encoded("\n"), 63,
                                            *encoded("b")]]
    assert answer["content"] == "return a + b" and answer["stop"] is True and answer["stop_type"] == "eos"
    assert answer["tokens_predicted"] == 3 and answer["tokens_evaluated"] == len(engine.model.script.prompts[0])
    assert answer["timings"]["predicted_n"] == 3


def test_llama_cpp_s_infill_streams_pieces_then_its_last_object_without_done(make_app):
    _, client = fim_app(make_app)
    raw = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "stream": True}).get_data(as_text=True)
    objects = [json.loads(line[len("data: "):]) for line in raw.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in raw and objects[-1]["stop"] is True and not any(o["stop"] for o in objects[:-1])
    assert "".join(o["content"] for o in objects) == "return a + b"


def test_infill_on_a_model_without_fill_in_the_middle_tokens_is_a_400(client):
    answer = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert answer.status_code == 400 and "fill-in-the-middle" in answer.get_json()["error"]["message"]


def test_an_over_long_stop_is_a_400_as_on_the_other_routes(make_app):
    _, client = fim_app(make_app)
    body = {"input_prefix": "a", "input_suffix": "b", "n_predict": 4}
    assert client.post("/infill", json={**body, "stop": ["x" * 1000]}).status_code == 200
    answer = client.post("/infill", json={**body, "stop": ["x" * 1001]})  # matched on the engine thread, every token
    assert answer.status_code == 400 and answer.get_json()["error"]["param"] == "stop"
