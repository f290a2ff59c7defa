"""Answers that do not depend on the load (BATCH_INVARIANT, the default), with the openai SDK against one real
gunicorn worker, so that concurrent requests really share its engine's steps: greedy and seeded answers alone, beside
seven other requests of other lengths over several rounds, and as Batch API lines run several at a time, are the same
token for token, log-probabilities included."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.integration.test_batches import finished, results, start_batch
from tests.support.server import Server, wait_until

QUESTIONS = ["Write a short note about autumn.", "List three uses of copper.", "Describe a quiet harbour at dawn."]
KINDS = {"greedy": {"temperature": 0}, "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 11}}
PROBES = [(question, kind) for question in QUESTIONS for kind in KINDS]
NOISE = [("Tell me a story about a lighthouse keeper and the storm that changed everything. " * (1 + n % 3), 8 + 9 * n)
         for n in range(7)]


@pytest.fixture(scope="module")
def one_worker(model_path, logs_dir, tmp_path_factory):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, MAX_CONCURRENT_REQUESTS=16,
                BATCH_CONCURRENCY=3, BATCH_DIR=tmp_path_factory.mktemp("batches")) as running:
        yield running


def sdk(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def body(question: str, kind: str) -> dict:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": question}], "max_tokens": 32,
            "logprobs": True, **KINDS[kind]}


def ask(client: OpenAI, question: str, kind: str, request_id: str, stream: bool = False) -> list[tuple[str, float]]:
    """The answer's tokens and their log-probabilities."""
    headers = {"X-Request-Id": request_id}
    if not stream:
        answer = client.chat.completions.create(**body(question, kind), extra_headers=headers)
        return [(entry.token, entry.logprob) for entry in answer.choices[0].logprobs.content]
    tokens = []
    for chunk in client.chat.completions.create(**body(question, kind), stream=True, extra_headers=headers):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            tokens += [(entry.token, entry.logprob) for entry in chunk.choices[0].logprobs.content]
    return tokens


def noise(client: OpenAI, index: int) -> int:
    text, max_tokens = NOISE[index]
    answer = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": text}],
                                            max_tokens=max_tokens, temperature=0.7)
    return answer.usage.completion_tokens


def test_answers_beside_seven_other_requests_are_the_answers_alone(one_worker):
    client = sdk(one_worker)
    alone = [ask(client, question, kind, f"alone-{n}") for n, (question, kind) in enumerate(PROBES)]
    assert all(len(tokens) >= 8 for tokens in alone) and len({tuple(tokens) for tokens in alone}) == len(PROBES)
    for round_ in range(3):
        with ThreadPoolExecutor(len(PROBES) + len(NOISE)) as pool:
            others = [pool.submit(noise, client, index) for index in range(len(NOISE))]
            together = [pool.submit(ask, client, question, kind, f"round{round_}-{n}", stream=(n + round_) % 2 == 1)
                        for n, (question, kind) in enumerate(PROBES)]
            assert [future.result() for future in together] == alone, f"round {round_}"
            assert all(future.result() > 0 for future in others)
    rows = wait_until(lambda: (found := re.findall(r"\[round\d-\d\] .* batch_rows=([\d.]+)", one_worker.log()))
                      and len(found) == 3 * len(PROBES) and found, timeout=10, message="the probes' log lines")
    assert max(float(value) for value in rows) > 2  # they did share steps, with several others


def test_batch_api_answers_are_the_answers_sent_live(one_worker):
    client = sdk(one_worker)
    lines = [{"custom_id": f"p{n}", "method": "POST", "url": "/v1/chat/completions", "body": body(question, kind)}
             for n, (question, kind) in enumerate(PROBES)]
    batch = start_batch(client, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    done = finished(client, batch.id, timeout=300)
    assert done.status == "completed" and done.request_counts.completed == len(PROBES)
    answers = results(client, done.output_file_id)
    for n, (question, kind) in enumerate(PROBES):
        content = answers[f"p{n}"]["response"]["body"]["choices"][0]["logprobs"]["content"]
        assert [(entry["token"], entry["logprob"]) for entry in content] == ask(client, question, kind, f"live-{n}")
    ids = [answers[f"p{n}"]["response"]["request_id"] for n in range(len(PROBES))]
    rows = [float(value) for request_id in ids
            for value in re.findall(rf"\[{re.escape(request_id)}\] .* batch_rows=([\d.]+)", one_worker.log())]
    assert len(rows) == len(PROBES) and max(rows) > 1  # lines ran beside each other
