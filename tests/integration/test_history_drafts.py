"""Drafts from a key's own earlier answers (real gunicorn, one worker, the real model, API keys, BATCH_INVARIANT
false): a key's repeated questions are drafted from its first answers, and other keys asking the same questions,
whose answers match, are never drafted from them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

KEYS = {name: f"sk-history-{name}" for name in ("team-a", "team-b", "team-c", "team-d", "ops")}
QUESTIONS = ["List five facts about the planet Mars.", "Describe how bread is made, step by step.",
             "Write a short poem about the sea."]


@pytest.fixture(scope="module")
def server(model_path, logs_dir, tmp_path_factory) -> Iterator[Server]:
    keys = tmp_path_factory.mktemp("history") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": name, "key": key, "admin": name == "ops"}
                                         for name, key in KEYS.items()]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, API_KEYS_FILE=keys,
                BATCH_INVARIANT="false") as running:
        yield running


def counted(server: Server) -> dict[str, float]:
    """Generations finished, and history draft tokens kept, as /metrics says."""
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEYS['ops']}"},
                        timeout=30).text
    found = {"generations": 0.0, "history": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "phi_api_generations_total":
                found["generations"] += sample.value
            elif sample.name == "phi_api_draft_source_tokens_total" and sample.labels == {
                    "model_name": MODEL_ID, "source": "history", "outcome": "kept"}:
                found["history"] += sample.value
    return found


def after(server: Server, generations: int) -> float:
    """History draft tokens kept, once ``generations`` generations have been counted (each generation's drafts are
    counted with it, on the hub, just after its answer is sent)."""
    return wait_until(lambda: (now := counted(server))["generations"] >= generations and now, 30,
                      message=f"{generations} generations in the metrics")["history"]


def ask(server: Server, key: str, question: str) -> str:
    client = OpenAI(base_url=server.url + "/v1", api_key=KEYS[key], max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": question}],
                                            max_tokens=48, temperature=0)
    return answer.choices[0].message.content


def test_a_key_s_history_drafts_its_repeated_questions_and_never_another_key_s(server):
    firsts = [ask(server, "team-a", question) for question in QUESTIONS]
    before = after(server, 3)
    # Each question once from a key of its own: no history of theirs, and team-a's is never theirs.
    strangers = [ask(server, key, question) for key, question in zip(("team-b", "team-c", "team-d"), QUESTIONS,
                                                                     strict=True)]
    # The first question's answers are computed alike (no history on either side): the same answer, which team-a's
    # history would have drafted well (the later ones may part at a near-tie: a check computes in another shape).
    assert strangers[0] == firsts[0]
    assert after(server, 6) == before
    again = [ask(server, "team-a", question) for question in QUESTIONS]
    assert after(server, 9) - before >= 12 * len(QUESTIONS)  # team-a's own first answers drafted its repeats
    assert all(len(answer) > 20 for answer in firsts + strangers + again)
