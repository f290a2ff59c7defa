"""INT4_KERNEL on a real server: a tiny Phi-3 (4-bit weights, blocks of 128, accuracy level 4) served twice, with
phi-api's kernel where it runs (auto) and with ONNX Runtime's (mlas), both asked through the OpenAI SDK.

Where the CPU lacks AVX-512 VNNI, auto falls back to ONNX Runtime's kernel and the log says why: the same test
then checks the fallback."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from phi_api.engine.kernels.native import unsupported
from tests.support.server import Server

MESSAGES = [{"role": "user", "content": "Count from one to ten."}]


@pytest.fixture(scope="module")
def kernels_server(tiny_phi3, logs_dir, tmp_path_factory):
    listing = tmp_path_factory.mktemp("int4") / "models.json"
    listing.write_text(json.dumps({"models": [
        {"id": "auto", "path": str(tiny_phi3), "options": {"INT4_KERNEL": "auto"}},
        {"id": "mlas", "path": str(tiny_phi3), "options": {"INT4_KERNEL": "mlas"}},
    ]}))
    with Server(logs_dir, MODELS_FILE=str(listing), WEB_CONCURRENCY=1) as running:
        yield running


def first_token_logprobs(client: OpenAI, model: str) -> dict[str, float]:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=5)
    assert answer.choices[0].message.content
    return {entry.token: entry.logprob for entry in answer.choices[0].logprobs.content[0].top_logprobs}


def test_both_kernels_answer_with_the_same_probabilities_and_the_log_says_which_served(kernels_server):
    client = OpenAI(base_url=kernels_server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    ours, theirs = first_token_logprobs(client, "auto"), first_token_logprobs(client, "mlas")
    shared = ours.keys() & theirs.keys()
    assert len(shared) >= 3
    # The same int8 rows and int32 sums, the float steps in another order: MLAS differs from itself by as much
    # between a lone row and a pair of rows (docs/kernels.md); a wrong product would move them by whole units.
    assert max(abs(ours[token] - theirs[token]) for token in shared) < 0.05
    log = kernels_server.log()
    reason = unsupported()
    if reason is None:
        assert "matrices of 4-bit or 8-bit weights on phi-api's kernel" in log
    else:
        assert f"phi-api's cannot run here ({reason})" in log
