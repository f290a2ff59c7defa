"""Fill-in-the-middle against real gunicorn, through each protocol's client: the openai SDK's ``suffix``, the
``ollama`` client's ``suffix``, and llama.cpp's ``/infill`` as its editor plugins call it (raw HTTP, streamed). The
model is the tiny random-weight Phi-3 with three of its tokenizer's special tokens renamed to Qwen2.5-Coder's
fill-in-the-middle tokens: its words are noise, but the prompt it is given is checked by its length, and a model
without those tokens (the default one) refuses."""

from __future__ import annotations

import json

import openai
import pytest
import requests
from ollama import Client
from openai import OpenAI

from tests.support.server import Server
from tests.support.tiny_phi3 import with_renamed_tokens

FIM_NAMES = {3: "<|fim_prefix|>", 4: "<|fim_suffix|>", 5: "<|fim_middle|>"}
PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def coder(tiny_phi3, tmp_path_factory, logs_dir):
    folder = with_renamed_tokens(tiny_phi3, tmp_path_factory.mktemp("tiny-coder") / "model", FIM_NAMES)
    # PREFIX_CACHE=exact: a prompt sent again answers bit for bit as the first time (docs/identical-answers.md)
    with Server(logs_dir, MODEL_PATH=str(folder), MODEL_ID="tiny-coder", WEB_CONCURRENCY=1,
                PREFIX_CACHE="exact") as running:
        yield running


def token_count(server, text: str) -> int:
    answer = requests.post(server.url + "/tokenize", json={"model": "tiny-coder", "prompt": text}, timeout=30)
    return answer.json()["count"]


def test_the_openai_sdk_s_suffix_fills_the_hole_with_the_model_s_tokens(coder):
    client = OpenAI(base_url=coder.url + "/v1", api_key="x", max_retries=0, timeout=120)
    answer = client.completions.create(model="tiny-coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0)
    assert answer.usage.prompt_tokens == token_count(coder, PREFIX) + token_count(coder, SUFFIX) + 3
    assert answer.usage.completion_tokens >= 1 and answer.choices[0].finish_reason in ("stop", "length")


def test_the_ollama_client_s_suffix_too(coder):
    answer = Client(host=coder.url).generate(model="tiny-coder", prompt=PREFIX, suffix=SUFFIX,
                                             options={"num_predict": 8, "temperature": 0})
    assert answer.done and answer.prompt_eval_count == token_count(coder, PREFIX) + token_count(coder, SUFFIX) + 3


def test_llama_cpp_s_infill_streams_as_its_editor_plugins_read_it(coder):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [{"filename": "a.py", "text": "X = 1\n"}],
            "prompt": "a", "n_predict": 8, "temperature": 0, "stream": True}
    with requests.post(coder.url + "/infill", json=body, stream=True, timeout=120) as answer:
        assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/event-stream")
        objects = [json.loads(line[len("data: "):]) for line in answer.iter_lines(decode_unicode=True)
                   if line.startswith("data: ")]
    last = objects[-1]
    assert last["stop"] is True and not any(item["stop"] for item in objects[:-1])
    pieces = ("X = 1\n", PREFIX, SUFFIX, "a")
    expected = sum(token_count(coder, piece) for piece in pieces) + 3
    assert last["tokens_evaluated"] == expected and last["stop_type"] in ("eos", "limit")
    whole = requests.post(coder.url + "/infill", json={**body, "stream": False}, timeout=120).json()
    assert whole["content"] == "".join(item["content"] for item in objects)  # greedy: the same answer


def test_the_default_model_has_no_fill_in_the_middle_tokens_and_says_so(client, server):
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
        client.completions.create(model="smollm2-135m-instruct", prompt="a", suffix="b", max_tokens=4)
    refused = requests.post(server.url + "/infill", json={"input_prefix": "a", "input_suffix": "b"}, timeout=30)
    assert refused.status_code == 400 and "fill-in-the-middle" in refused.json()["error"]["message"]
