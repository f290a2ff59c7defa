"""The phi3 path, on a tiny random-weight Phi-3 model built with the model builder."""

from __future__ import annotations

import json

import pytest
import requests

from phi_api.engine.runtime.model import PHI3_CHAT_TEMPLATE
from tests.support.server import Server
from tests.support.sse import parse_sse
from tests.support.tiny_phi3 import PHI3_EOS_TOKENS, ROPE_CONTEXT, ROPE_SWITCH


@pytest.fixture(scope="module")
def phi3_server(tiny_phi3, logs_dir):
    # GroupQueryAttention, as ONNX Runtime GenAI's generator computes (the crossing's tokens are compared with it,
    # bit for bit: on random weights near-ties come often); phi-api's attention is compared in test_attention.py
    with Server(logs_dir, MODEL_PATH=str(tiny_phi3), ATTENTION_KERNEL="onnxruntime") as running:  # MODEL_ID default
        yield running


def test_the_builder_recipe_int4_block_128_accuracy_4(tiny_phi3):
    import onnx

    config = json.loads((tiny_phi3 / "genai_config.json").read_text())
    assert config["model"]["type"] == "phi3"
    nodes = [node for node in onnx.load(str(tiny_phi3 / "model.onnx"), load_external_data=False).graph.node
             if node.op_type == "MatMulNBits"]
    assert nodes
    for node in nodes:
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (4, 128, 4)


def test_served_as_phi_3_5_mini_with_the_phi_3_5_template(phi3_server, tiny_phi3):
    import onnxruntime_genai as og

    assert requests.get(phi3_server.url + "/v1/models").json()["data"][0]["id"] == "phi-3.5-mini"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "안녕"}]
    expected_prompt = "<|system|>\nBe brief.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi<|end|>\n" \
                      "<|user|>\n안녕<|end|>\n<|assistant|>\n"
    tokenizer = og.Tokenizer(og.Model(str(tiny_phi3)))
    assert tokenizer.apply_chat_template(json.dumps(messages), template_str=PHI3_CHAT_TEMPLATE,
                                         add_generation_prompt=True) == expected_prompt
    body = {"model": "phi-3.5-mini", "messages": messages, "max_tokens": 4, "temperature": 0}
    answer = requests.post(phi3_server.url + "/v1/chat/completions", json=body).json()
    assert answer["usage"]["prompt_tokens"] == len(tokenizer.encode(expected_prompt))


@pytest.mark.parametrize("eos_token", PHI3_EOS_TOKENS)
def test_each_end_of_sequence_id_ends_the_answer(phi3_server, tiny_phi3, eos_token):
    eos_ids = json.loads((tiny_phi3 / "genai_config.json").read_text())["model"]["eos_token_id"]
    tokenizer_config = json.loads((tiny_phi3 / "tokenizer.json").read_text())
    token_id = next(t["id"] for t in tokenizer_config["added_tokens"] if t["content"] == eos_token)
    assert token_id in eos_ids
    body = {"model": "phi-3.5-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20,
            "temperature": 0, "logit_bias": {str(token_id): 100}}
    answer = requests.post(phi3_server.url + "/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["content"] == ""
    assert answer["usage"]["completion_tokens"] == 1


def test_the_graph_says_where_longrope_switches(tiny_phi3):
    from phi_api.engine.runtime.model import ModelInfo

    assert ModelInfo.read(str(tiny_phi3)).rope_switch == ROPE_SWITCH
    assert ModelInfo.read(str(tiny_phi3)).context_length == ROPE_CONTEXT


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_crossing_the_longrope_switch_gives_onnxruntime_genai_s_tokens(phi3_server, tiny_phi3,
                                                                                    stream):
    """The prompt ends 40 tokens before the switch; the answer crosses it. ONNX Runtime GenAI's own generator
    (fed the prompt in the server's 64-token chunks) then prefills the whole sequence again with the long
    factors, as the server does: the tokens must be the same."""
    import numpy as np
    import onnxruntime_genai as og

    rng = np.random.default_rng(5)
    prompt = rng.integers(1000, 40000, ROPE_SWITCH - 40).astype(np.int32)
    answer_tokens = 100
    model = og.Model(str(tiny_phi3))
    params = og.GeneratorParams(model)
    length = len(prompt) + answer_tokens
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    generator = og.Generator(model, params)
    for start in range(0, len(prompt), 64):
        generator.append_tokens(prompt[start:start + 64])
    reference = []
    while len(reference) < answer_tokens:
        generator.generate_next_token()
        reference.append(int(generator.get_next_tokens()[0]))
    spelling = og.Tokenizer(model).create_stream()  # incremental decoding, as the server spells tokens
    expected = "".join(spelling.decode(token) for token in reference)
    body = {"model": "phi-3.5-mini", "prompt": prompt.tolist(), "max_tokens": answer_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    response = requests.post(phi3_server.url + "/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    if stream:
        text = "".join(event["choices"][0]["text"] for event in parse_sse(response.text)[:-1] if event["choices"])
    else:
        text = response.json()["choices"][0]["text"]
        assert response.json()["usage"]["completion_tokens"] == answer_tokens
    assert text == expected
