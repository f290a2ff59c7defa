"""Background responses against real gunicorn (the real model) through the openai SDK: queued and answered at once,
polled to completion, cancelled mid-run (the engine stops: its usage is the part it did), a streamed one resumed with
``starting_after`` after the client dropped, one queued while its key's limits are used up, and each key's kept from
the others. Across replicas and restarts: tests/integration/test_shared_state.py."""

from __future__ import annotations

import json

import openai
import pytest
import requests
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

TEAM_A, TEAM_B, ADMIN, DAILY = "sk-background-a", "sk-background-b", "sk-background-admin", "sk-background-daily"
# A grammar that cannot end before 1,000 tokens (1,000 numbers, a token each at least), whatever the weights prefer.
FORCED_TOKENS = 1000
MANY = {"format": {"type": "json_schema", "name": "numbers", "strict": True, "schema": {
    "type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "integer"},
                                                 "minItems": FORCED_TOKENS}},
    "required": ["numbers"], "additionalProperties": False}}}
DAY_TOKENS = 1000
LONG = " ".join(f"Line {i}: the harbour master logged ship {i} at berth {i % 9}." for i in range(30))  # ~580 tokens


@pytest.fixture(scope="module")
def served(model_path, logs_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("background")
    keys = root / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "team-a", "key": TEAM_A}, {"name": "team-b", "key": TEAM_B}, {"name": "admin", "key": ADMIN,
                                                                                "admin": True},
        {"name": "daily", "key": DAILY, "tokens_per_day": DAY_TOKENS}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, API_KEYS_FILE=str(keys),
                DATA_DIR=str(root / "data")) as running:
        yield running


def client(server: Server, key: str = TEAM_A) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=300)


def settled(server: Server, response_id: str, key: str = TEAM_A, timeout: float = 300):
    return wait_until(lambda: (found := client(server, key).responses.retrieve(response_id)).status
                      not in ("queued", "in_progress") and found, timeout=timeout, interval=0.1,
                      message=f"background response {response_id} to end")


def usage_of(server: Server, name: str) -> dict:
    report = client(server, ADMIN).get("/usage/keys", cast_to=object)
    return next(item for item in report["data"] if item["name"] == name)


def test_a_background_response_is_queued_at_once_and_polled_to_completion(served):
    sdk = client(served)
    queued = sdk.responses.create(model=MODEL_ID, input="Name three colors.", background=True, max_output_tokens=24)
    assert queued.status == "queued" and queued.background and queued.output == []
    done = settled(served, queued.id)
    assert done.status in ("completed", "incomplete") and done.id == queued.id and done.background
    assert done.output_text and done.usage.output_tokens > 0
    # stored as any response: a follow-up continues from it
    follow = sdk.responses.create(model=MODEL_ID, input="And one more.", previous_response_id=done.id,
                                  max_output_tokens=8)
    assert follow.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens - 1
    with pytest.raises(openai.BadRequestError, match=f"Cannot cancel a {done.status} response"):
        sdk.responses.cancel(done.id)


def test_a_cancelled_response_stops_mid_run_and_counts_only_what_ran(served):
    sdk = client(served)
    before = usage_of(served, "team-a")
    stopped = metric(served, "phi_api_background_runs_total", outcome="stopped")
    stream = sdk.responses.create(model=MODEL_ID, input="List numbers.", background=True, stream=True, text=MANY,
                                  max_output_tokens=4 * FORCED_TOKENS)
    seen = []
    for event in stream:  # a few tokens in: it runs
        seen.append(event)
        if sum(one.type == "response.output_text.delta" for one in seen) >= 5:
            break
    cancelled = sdk.responses.cancel(seen[0].response.id)
    assert cancelled.status == "cancelled"
    stream.close()
    # its run ended (the runner counts it stopped): its usage is what the engine did before it stopped, far below
    # the grammar's minimum
    wait_until(lambda: metric(served, "phi_api_background_runs_total", outcome="stopped") > stopped, timeout=120,
               interval=0.1, message="the cancelled run to stop")
    after = wait_until(lambda: (now := usage_of(served, "team-a"))["completion_tokens"] > before["completion_tokens"]
                       and now, timeout=60, interval=0.1, message="the cancelled run's usage")
    assert 5 <= after["completion_tokens"] - before["completion_tokens"] < FORCED_TOKENS
    assert sdk.responses.retrieve(cancelled.id).status == "cancelled"
    assert sdk.responses.cancel(cancelled.id).status == "cancelled"  # cancelling again: as it is


def test_a_streamed_response_resumed_after_the_client_dropped_gets_the_events_it_missed(served):
    sdk = client(served)
    stream = sdk.responses.create(model=MODEL_ID, input="Describe the sea in two sentences.", background=True,
                                  stream=True, max_output_tokens=48)
    before = []
    for event in stream:
        before.append(event)
        if len(before) == 6:
            break
    stream.close()  # the client drops; the run goes on without it
    response_id, cursor = before[0].response.id, before[-1].sequence_number
    resumed = list(sdk.responses.retrieve(response_id, stream=True, starting_after=cursor))
    whole = list(sdk.responses.retrieve(response_id, stream=True))  # the same stream, from its start
    assert [event.sequence_number for event in whole] == list(range(len(whole)))
    assert [event.model_dump() for event in whole[:6]] == [event.model_dump() for event in before]
    assert [event.model_dump() for event in whole[6:]] == [event.model_dump() for event in resumed]
    assert [event.type for event in whole[:3]] == ["response.created", "response.queued", "response.in_progress"]
    last = resumed[-1]
    assert last.type in ("response.completed", "response.incomplete")
    deltas = "".join(event.delta for event in whole if event.type == "response.output_text.delta")
    assert deltas == last.response.output_text == sdk.responses.retrieve(response_id).output_text


def metric(server: Server, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels`` in the server's /metrics (its one worker's)."""
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items()))


def requeued(server: Server) -> float:
    """Background responses the runner took and the gate could not take yet."""
    return metric(server, "phi_api_background_runs_total", outcome="requeued")


def test_a_response_waits_in_the_queue_while_its_key_s_limits_are_used_up(served):
    daily = client(served, DAILY)
    spent = daily.responses.create(model=MODEL_ID, input=LONG, max_output_tokens=1)  # most of the key's day
    assert DAY_TOKENS / 3 < spent.usage.total_tokens < DAY_TOKENS * 0.8
    tried = requeued(served)
    # its worst case fits the key's day, but not what is left of it today
    left = DAY_TOKENS - spent.usage.total_tokens
    queued = daily.responses.create(model=MODEL_ID, input="Hi.", background=True, max_output_tokens=left + 1)
    # taken, refused by the key's limit, queued again: it waits, neither refused nor failed
    wait_until(lambda: requeued(served) > tried, timeout=30, interval=0.1, message="the gate to refuse it once")
    assert daily.responses.retrieve(queued.id).status == "queued"
    assert daily.responses.cancel(queued.id).status == "cancelled"


def test_another_key_neither_reads_nor_cancels_nor_streams_it(served):
    mine = client(served).responses.create(model=MODEL_ID, input="Hi.", background=True, stream=False,
                                           max_output_tokens=4)
    other = client(served, TEAM_B)
    for attempt in (lambda: other.responses.retrieve(mine.id), lambda: other.responses.cancel(mine.id),
                    lambda: list(other.responses.retrieve(mine.id, stream=True)),
                    lambda: other.responses.delete(mine.id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    settled(served, mine.id)


def test_what_cannot_be_done_is_a_clear_400(served):
    sdk = client(served)
    with pytest.raises(openai.BadRequestError, match="store"):
        sdk.responses.create(model=MODEL_ID, input="Hi.", background=True, store=False)
    sync = sdk.responses.create(model=MODEL_ID, input="Hi.", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        sdk.responses.cancel(sync.id)
    with pytest.raises(openai.BadRequestError, match="stream"):
        list(sdk.responses.retrieve(sync.id, stream=True))
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="no-such-model", input="Hi.", background=True)
