"""Drafts that change no answer: a model served twice from one models file, with drafts and without, by one real
gunicorn worker, asked through the openai SDK. A draft's check gives each of its tokens the bits one-token steps give
it, so greedy and seeded answers and their log-probabilities are the same with speculation on and off, alone and
beside seven other streams, while drafts are kept (beside the others, checked in their batched step). Two models:
a tiny Phi-3 with Phi-3.5-mini's recipe (4-bit weights, int8 keys and values: a graph of phi-api's own operators,
row-wise), and the default model at its defaults (ONNX Runtime's 8-bit and float32 matrices, which compute rows in
pairs, and phi-api's attention over float32 keys and values: BATCH_INVARIANT's even steps make checks exact), also
with a draft model (itself: its drafts are kept up to near ties).

Where the CPU lacks AVX-512 VNNI, ONNX Runtime's operators serve, whose checks compute other last bits than one-token
steps (docs/identical-answers.md): there the test checks that /v1/status says which attention serves."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from phi_api.engine.kernels.native import unsupported
from tests.support.server import Server

PROMPTS = ["Repeat this line three times: the red fox runs over the hill.", "Count from one to twenty.",
           "Write the alphabet twice, then stop.", "List the days of the week, twice over.",
           "Say 'ok' ten times.", "Copy this: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
           # past the 512 keys a decode step walks as one part (its parts are tasks of their own, merged)
           "Copy this list: " + ", ".join(str(n) for n in range(300)) + "."]
KINDS = {"greedy": {"temperature": 0}, "seeded": {"temperature": 0.8, "seed": 7}}
PROBES = [(prompt, kind) for prompt in PROMPTS for kind in KINDS]
NOISE = [f"Tell me about the number {n}, at length." for n in range(7)]


@pytest.fixture(scope="module", params=["phi-3.5 recipe", "default model", "draft model"])
def twice(request, tiny_phi3, model_path, logs_dir, tmp_path_factory):
    listing = tmp_path_factory.mktemp("draft-identity") / "models.json"
    path, cache = (str(tiny_phi3), "int8") if request.param == "phi-3.5 recipe" else (model_path, "auto")
    models = [{"id": "drafts", "path": path, "options": {"KV_CACHE_DTYPE": cache, "SPECULATIVE_DRAFT_MAX": 8}},
              {"id": "plain", "path": path, "options": {"KV_CACHE_DTYPE": cache, "SPECULATIVE_DRAFT_MAX": 0}}]
    if request.param == "draft model":  # the default model drafts for itself: its drafts are kept but near ties
        models[0]["draft"] = "draft"
        models.append({"id": "draft", "path": path, "options": {"SPECULATIVE_DRAFT_MAX": 0}})
    listing.write_text(json.dumps({"models": models}))
    with Server(logs_dir, MODELS_FILE=str(listing), WEB_CONCURRENCY=1, MAX_CONCURRENT_REQUESTS=16) as running:
        yield running


def answer(client: OpenAI, model: str, prompt: str, kind: str) -> list[tuple[str, float]]:
    """The answer's tokens and their log-probabilities, greedy or seeded."""
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=48, logprobs=True, **KINDS[kind])
    return [(entry.token, entry.logprob) for entry in reply.choices[0].logprobs.content]


def noise(client: OpenAI, prompt: str) -> int:
    answer = client.chat.completions.create(model="drafts", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=40, temperature=0.8)
    return answer.usage.completion_tokens


def drafts_metric(server: Server, name: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and sample.labels["model_name"] == "drafts")


def kept_drafts(server: Server) -> float:
    return drafts_metric(server, "phi_api_draft_accepted_tokens_total")


def model_kept(server: Server) -> float:
    """Draft tokens the draft model proposed and the model kept."""
    text = requests.get(server.url + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "phi_api_draft_source_tokens_total" and sample.labels["model_name"] == "drafts"
               and sample.labels["source"] == "model" and sample.labels["outcome"] == "kept")


def test_answers_are_the_same_with_drafts_and_without_alone_and_beside_seven_streams(twice):
    status = requests.get(twice.url + "/v1/status", timeout=30).json()["models"]
    kernels = {entry["model_name"]: entry["runtime_config"]["attention_kernel"] for entry in status
               if entry["model_name"] != "draft"}
    assert kernels == dict.fromkeys(("drafts", "plain"), "phi-api" if unsupported() is None else "onnxruntime")
    if unsupported() is not None:
        return  # ONNX Runtime's operators serve: their checks are not one-token steps' bits, and nothing promises it
    client = OpenAI(base_url=twice.url + "/v1", api_key="none", max_retries=0, timeout=300)
    plain = [answer(client, "plain", prompt, kind) for prompt, kind in PROBES]
    # answers long enough to part somewhere (the default model ends a few short), and not all alike
    assert sum(len(tokens) >= 16 for tokens in plain) >= len(plain) // 2
    assert len({tuple(tokens) for tokens in plain}) > len(PROMPTS)
    assert [answer(client, "drafts", prompt, kind) for prompt, kind in PROBES] == plain
    alone_kept = kept_drafts(twice)
    assert alone_kept >= 16  # the answers were drafted, not merely decoded a token at a time
    if any(entry["model_name"] == "draft" for entry in status):
        # some by the draft model: its first draft is tried untimed; after that, as far as its time pays
        assert model_kept(twice) > 0
    with ThreadPoolExecutor(1 + len(NOISE)) as pool:
        for (prompt, kind), want in zip(PROBES, plain, strict=True):
            others = [pool.submit(noise, client, text) for text in NOISE]
            assert pool.submit(answer, client, "drafts", prompt, kind).result() == want, (prompt, kind)
            assert all(other.result() > 0 for other in others)
    assert kept_drafts(twice) > alone_kept
    # checked in the batched step beside the other streams (phi-api's operator takes several new tokens a row)
    assert drafts_metric(twice, "phi_api_draft_checks_beside_total") > 0
