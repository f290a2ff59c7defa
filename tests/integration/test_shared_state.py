"""Past one machine, from the client's side: two real servers sharing one real PostgreSQL (a throwaway cluster on
loopback), each with its own empty folders, as two replicas behind a load balancer; and the same suite on SQLite
with one server, the embedded default.

A response stored on one is retrieved and continued on the other; a background response started on one is polled
and its stream resumed on the other; a key's limit holds across both together; usage read on one counts requests sent
to the other; a file uploaded to one feeds a batch created on the other, each line running once; all of it survives
restarting both (on PostgreSQL with new, empty folders, as new containers would), a queued background response too;
killing a replica mid-batch leaves no line lost or run twice, and its running background response failed, not in
progress forever.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from pathlib import Path

import openai
import pytest

from phi_api.bench.postgres import Postgres
from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

KEYS = [{"name": "admin", "key": "sk-shared-admin", "admin": True},
        {"name": "limited", "key": "sk-shared-limited", "requests_per_minute": 3},
        {"name": "team", "key": "sk-shared-team"},
        {"name": "daily", "key": "sk-shared-daily", "tokens_per_day": 1000}]
LEASE_SECONDS = 3
LONG = " ".join(f"Line {i}: the harbour master logged ship {i} at berth {i % 9}." for i in range(30))  # ~580 tokens
# A grammar that cannot end before ~600 tokens, whatever the weights prefer: a run still going when its replica dies.
MANY = {"format": {"type": "json_schema", "name": "numbers", "strict": True, "schema": {
    "type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 300}},
    "required": ["numbers"], "additionalProperties": False}}}


class Replicas:
    """Servers ``a`` and ``b`` on one database (on SQLite: one server, both names)."""

    def __init__(self, model_path: str, logs_dir: Path, work: Path, database_url: str) -> None:
        self.model_path, self.logs_dir, self.work, self.database_url = model_path, logs_dir, work, database_url
        self.keys_file = work / "keys.json"
        self.keys_file.write_text(json.dumps({"keys": KEYS}))
        self.folders = itertools.count()
        self.a = self.b = self._server()
        if database_url:
            self.b = self._server()

    def _server(self) -> Server:
        folder = self.work / ("data" if not self.database_url else f"data-{next(self.folders)}")  # new: empty
        return Server(self.logs_dir, MODEL_PATH=self.model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1,
                      API_KEYS_FILE=self.keys_file, DATABASE_URL=self.database_url, DATA_DIR=folder,
                      BATCH_LEASE_SECONDS=LEASE_SECONDS, BACKGROUND_LEASE_SECONDS=LEASE_SECONDS,
                      DEFAULT_MAX_TOKENS=8)

    @property
    def servers(self) -> list[Server]:
        return [self.a] if self.a is self.b else [self.a, self.b]

    def start(self) -> None:
        for server in self.servers:
            server.start()

    def restart(self) -> None:
        """Both stopped, then started again: on PostgreSQL as new servers with new, empty folders."""
        for server in self.servers:
            server.stop()
        if self.database_url:
            self.a, self.b = self._server(), self._server()
        self.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def replicas(request, model_path, logs_dir, tmp_path_factory):
    postgres = Postgres().start() if request.param == "postgresql" else None
    cluster = Replicas(model_path, logs_dir, tmp_path_factory.mktemp(f"shared-{request.param}"),
                       postgres.url if postgres else "")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if postgres is not None:
            postgres.remove()


def client(server: Server, key: str = "sk-shared-team") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def usage_of(server: Server, name: str) -> dict:
    report = client(server, "sk-shared-admin").get("/usage/keys", cast_to=object)
    return next(item for item in report["data"] if item["name"] == name)


def finished(server: Server, batch_id: str, timeout: float = 240) -> openai.types.Batch:
    return wait_until(lambda: (found := client(server).batches.retrieve(batch_id)).status == "completed" and found,
                      timeout=timeout, interval=0.2, message=f"batch {batch_id} to complete")


def batch_file(count: int, max_tokens: int = 4, **body) -> bytes:
    lines = [{"custom_id": f"line-{index}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL_ID, "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Count to {index + 2}."}], **body}}
             for index in range(count)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def custom_ids(server: Server, file_id: str) -> list[str]:
    text = client(server).files.content(file_id).text
    return [json.loads(line)["custom_id"] for line in text.splitlines()]


def test_a_response_stored_on_one_is_retrieved_and_continued_on_the_other(replicas):
    first = client(replicas.a).responses.create(model=MODEL_ID, input="Name a color.", max_output_tokens=8,
                                                store=True)
    assert client(replicas.b).responses.retrieve(first.id).id == first.id
    follow = client(replicas.b).responses.create(model=MODEL_ID, input="Another one.", max_output_tokens=8,
                                                 previous_response_id=first.id)
    assert follow.previous_response_id == first.id and follow.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError):  # another key neither reads it on either replica
        client(replicas.b, "sk-shared-limited").responses.retrieve(first.id)


def test_a_conversation_made_on_one_is_continued_on_the_other(replicas):
    conversation = client(replicas.a).conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}])
    answered = client(replicas.b).responses.create(model=MODEL_ID, conversation=conversation.id,
                                                   input="What is my name?", max_output_tokens=8)
    assert answered.conversation.id == conversation.id
    items = client(replicas.a).conversations.items.list(conversation.id, order="asc").data
    assert [item.role for item in items] == ["user", "user", "assistant"]
    with pytest.raises(openai.NotFoundError):  # another key neither reads it on either replica
        client(replicas.b, "sk-shared-limited").conversations.retrieve(conversation.id)


def test_a_background_response_started_on_one_is_polled_and_resumed_on_the_other(replicas):
    stream = client(replicas.a).responses.create(model=MODEL_ID, input="Name a color.", background=True, stream=True,
                                                 max_output_tokens=16)
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 3:
            break
    stream.close()  # dropped on a; resumed on b
    response_id = first[0].response.id
    rest = list(client(replicas.b).responses.retrieve(response_id, stream=True,
                                                       starting_after=first[-1].sequence_number))
    assert [event.sequence_number for event in first + rest] == list(range(len(first) + len(rest)))
    assert rest[-1].type in ("response.completed", "response.incomplete")
    polled = client(replicas.b).responses.retrieve(response_id)
    assert (polled.status, polled.output_text) == (rest[-1].response.status, rest[-1].response.output_text)
    with pytest.raises(openai.NotFoundError):  # another key neither reads it on either replica
        client(replicas.a, "sk-shared-limited").responses.retrieve(response_id)


def test_a_key_s_limit_holds_across_both_together(replicas):
    # the limit counts in the current minute: start early in one, so that the four requests share it
    wait_until(lambda: time.time() % 60 < 40, timeout=25, interval=0.2, message="an early second of a minute")
    answers = []
    for server in (replicas.a, replicas.b, replicas.a, replicas.b):
        try:
            client(server, "sk-shared-limited").completions.create(model=MODEL_ID, prompt="Hi", max_tokens=1)
            answers.append(200)
        except openai.RateLimitError:
            answers.append(429)
    assert answers == [200, 200, 200, 429]


def test_usage_read_on_one_counts_requests_sent_to_the_other(replicas):
    before = usage_of(replicas.a, "team")
    sent = [client(replicas.b).completions.create(model=MODEL_ID, prompt="Hello", max_tokens=3) for _ in range(2)]
    after = usage_of(replicas.a, "team")
    assert after["requests"] - before["requests"] == 2
    assert after["completion_tokens"] - before["completion_tokens"] == sum(one.usage.completion_tokens
                                                                           for one in sent)


def test_a_file_uploaded_to_one_feeds_a_batch_created_on_the_other_and_each_line_runs_once(replicas):
    uploaded = client(replicas.a).files.create(file=("lines.jsonl", batch_file(4)), purpose="batch")
    batch = client(replicas.b).batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                              completion_window="24h")
    done = finished(replicas.a, batch.id)
    assert done.request_counts.completed == 4 and done.request_counts.failed == 0
    assert sorted(custom_ids(replicas.b, done.output_file_id)) == [f"line-{index}" for index in range(4)]


def test_everything_survives_restarting_both(replicas):
    response = client(replicas.a).responses.create(model=MODEL_ID, input="Hi.", max_output_tokens=4, store=True)
    uploaded = client(replicas.b).files.create(file=("kept.jsonl", batch_file(1)), purpose="batch")
    batch = client(replicas.a).batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                              completion_window="24h")
    finished(replicas.a, batch.id)
    used = usage_of(replicas.b, "team")
    daily = client(replicas.a, "sk-shared-daily")
    spent = daily.responses.create(model=MODEL_ID, input=LONG, max_output_tokens=1)
    # its worst case fits the key's day, but not what is left of it today: queued until tomorrow
    queued = daily.responses.create(model=MODEL_ID, input="Hi.", background=True,
                                    max_output_tokens=1000 - spent.usage.total_tokens + 1)
    replicas.restart()
    assert client(replicas.b, "sk-shared-daily").responses.retrieve(queued.id).status == "queued"
    assert client(replicas.a, "sk-shared-daily").responses.cancel(queued.id).status == "cancelled"
    assert client(replicas.b).responses.retrieve(response.id).id == response.id
    assert client(replicas.a).files.content(uploaded.id).content == batch_file(1)
    assert client(replicas.a).batches.retrieve(batch.id).status == "completed"
    assert usage_of(replicas.a, "team")["requests"] == used["requests"]


def test_killing_a_replica_mid_batch_leaves_no_line_lost_or_run_twice(replicas):
    # only a works on the batch: b (if there is one) is stopped, so a holds lines when it dies
    if replicas.b is not replicas.a:
        replicas.b.stop()
    uploaded = client(replicas.a).files.create(file=("long.jsonl", batch_file(4, max_tokens=200, ignore_eos=True)),
                                               purpose="batch")
    batch = client(replicas.a).batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                              completion_window="24h")
    wait_until(lambda: client(replicas.a).batches.retrieve(batch.id).status == "in_progress", timeout=60,
               message="a to take lines of the batch")
    running = client(replicas.a).responses.create(model=MODEL_ID, input="List numbers.", background=True, text=MANY,
                                                  max_output_tokens=2000)
    wait_until(lambda: client(replicas.a).responses.retrieve(running.id).status == "in_progress", timeout=60,
               message="a to run the background response")
    os.killpg(replicas.a.master.pid, signal.SIGKILL)  # the whole replica: master and workers, mid-line
    replicas.a.master.wait()
    survivor = replicas.b if replicas.b is not replicas.a else replicas.a
    survivor.start()  # b takes the lines a held once their lease runs out (the same machine: at once)
    done = finished(survivor, batch.id, timeout=400)
    assert done.request_counts.completed == 4 and done.request_counts.failed == 0
    assert sorted(custom_ids(survivor, done.output_file_id)) == [f"line-{index}" for index in range(4)]
    # the background response a ran is not left in progress: failed, once b noticed a gone
    failed = wait_until(lambda: (found := client(survivor).responses.retrieve(running.id)).status != "in_progress"
                        and found, timeout=60, interval=0.2, message="the dead replica's response to fail")
    assert failed.status == "failed" and failed.error.code == "server_error"
    if replicas.b is not replicas.a:
        replicas.a = replicas.b  # (the module's last test: the fixture stops what still runs)


def test_a_database_that_is_down_gives_503s_where_it_is_needed_generation_goes_on_and_it_is_reconnected_to(
        model_path, logs_dir, tmp_path):
    with Postgres() as postgres, Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1,
                                        DATABASE_URL=postgres.url, DATA_DIR=tmp_path / "data") as server:
        keyless = client(server)
        assert keyless.files.create(file=("a.jsonl", batch_file(1)), purpose="batch").id
        postgres.stop()
        with pytest.raises(openai.InternalServerError) as raised:
            keyless.files.create(file=("b.jsonl", batch_file(1)), purpose="batch")
        assert raised.value.status_code == 503 and raised.value.body["code"] == "database_unavailable"
        assert raised.value.response.headers["Retry-After"] == "1"
        answer = keyless.chat.completions.create(model=MODEL_ID, max_tokens=4,
                                                 messages=[{"role": "user", "content": "Hi"}])
        assert answer.choices[0].finish_reason in ("stop", "length")  # no key: no database on the way
        postgres.start()
        assert keyless.files.create(file=("c.jsonl", batch_file(1)), purpose="batch").id  # reconnected by itself
