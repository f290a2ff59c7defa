"""INT4_KERNEL on a real server: a tiny Phi-3 (4-bit weights, blocks of 128, accuracy level 4) and the default model
(8-bit weights over K = 576, float32 down projections) each served twice, with phi-api's kernel where it runs (auto)
and with ONNX Runtime's (mlas), both asked through the OpenAI SDK.

Where the CPU lacks AVX-512 VNNI, auto falls back to ONNX Runtime's kernel and the log says why: the same test
then checks the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from openai import OpenAI

from phi_api.engine.kernels.native import unsupported
from tests.support.server import Server

MESSAGES = [{"role": "user", "content": "Count from one to ten."}]


# How far the top tokens' log-probabilities of the two kernels may be apart. The tiny Phi-3: the same int8 rows and
# int32 sums, the float steps in another order (MLAS differs from itself by as much between a lone row and a pair
# of rows, docs/kernels.md). The default model: its activations' outliers make each matrix's int8 rows round a few
# values the other way after such a difference, and 30 layers carry it (docs/kernels.md, 8-bit weights). A wrong
# product moves them by whole units.
CLOSE = {"tiny phi-3": 0.05, "default model": 0.5}


@pytest.fixture(scope="module", params=list(CLOSE))
def kernels_server(request, tiny_phi3, model_path, logs_dir, tmp_path_factory):
    path = str(tiny_phi3) if request.param == "tiny phi-3" else model_path
    listing = tmp_path_factory.mktemp("int4") / "models.json"
    listing.write_text(json.dumps({"models": [
        {"id": "auto", "path": path, "options": {"INT4_KERNEL": "auto"}},
        {"id": "mlas", "path": path, "options": {"INT4_KERNEL": "mlas"}},
    ]}))
    with Server(logs_dir, MODELS_FILE=str(listing), WEB_CONCURRENCY=1) as running:
        yield request.param, path, running


def first_token_logprobs(client: OpenAI, model: str) -> dict[str, float]:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=5)
    assert answer.choices[0].message.content
    return {entry.token: entry.logprob for entry in answer.choices[0].logprobs.content[0].top_logprobs}


def test_both_kernels_answer_with_the_same_probabilities_and_the_log_says_which_served(kernels_server):
    name, path, server = kernels_server
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    ours, theirs = first_token_logprobs(client, "auto"), first_token_logprobs(client, "mlas")
    shared = ours.keys() & theirs.keys()
    assert len(shared) >= 3
    assert max(abs(ours[token] - theirs[token]) for token in shared) < CLOSE[name]
    log = server.log()
    reason = unsupported()
    if reason is None:
        graph = onnx.load(str(Path(path) / "model.onnx"), load_external_data=False).graph
        matrices = sum(node.op_type == "MatMulNBits" for node in graph.node)  # every one qualifies in both models
        assert f"{path}: {matrices} matrices of 4-bit or 8-bit weights on phi-api's kernel" in log
    else:
        assert f"phi-api's cannot run here ({reason})" in log
