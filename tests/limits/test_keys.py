"""Named API keys with limits (API_KEYS_FILE): refusals with OpenAI's headers, usage by key name, the keys file's
errors. The counts live in one SQLite file that every worker shares; two apps on one state folder stand for two
workers here (tests/integration/test_keys.py does it with gunicorn)."""

from __future__ import annotations

import json

import pytest

from phi_api.errors import ConfigError
from phi_api.limits.keys import Key, Usage, read_keys
from phi_api.storage.database import sqlite_url

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def keys_file(tmp_path, *entries) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": list(entries)}))
    return str(path)


def as_key(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def limited(make_app, tmp_path):
    path = keys_file(tmp_path, {"name": "team-a", "key": "sk-team-a-1", "requests_per_minute": 2},
                     {"name": "ops", "key": "sk-ops-admin", "admin": True})
    return make_app(API_KEYS_FILE=path)


def test_a_key_over_its_requests_per_minute_gets_429_with_openai_s_headers(limited):
    client = limited.test_client()
    answers = [client.post("/v1/chat/completions", json=CHAT, headers=as_key("sk-team-a-1")) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert [answer.headers["x-ratelimit-remaining-requests"] for answer in answers] == ["1", "0", "0"]
    assert all(answer.headers["x-ratelimit-limit-requests"] == "2" for answer in answers)
    refused = answers[2]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    error = refused.get_json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "team-a" in error["message"] and "sk-team" not in error["message"]
    other = client.post("/v1/chat/completions", json=CHAT, headers=as_key("sk-ops-admin"))
    assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers  # no limits of its own


def test_usage_by_key_name_for_admin_keys_only(limited):
    client = limited.test_client()
    answer = client.post("/v1/chat/completions", json=CHAT, headers=as_key("sk-team-a-1")).get_json()
    assert client.get("/v1/usage/keys", headers=as_key("sk-team-a-1")).status_code == 403
    report = client.get("/v1/usage/keys", headers=as_key("sk-ops-admin")).get_json()["data"]
    team = next(item for item in report if item["name"] == "team-a")
    assert team["requests"] == 1 and team["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert team["completion_tokens"] == answer["usage"]["completion_tokens"] > 0
    assert team["limits"]["requests_per_minute"] == 2 and team["now"]["requests_this_minute"] == 1
    assert "sk-team-a-1" not in json.dumps(report)
    metrics = client.get("/metrics", headers=as_key("sk-ops-admin")).get_data(as_text=True)
    assert 'phi_api_key_requests_total{key_name="team-a"} 1.0' in metrics and "sk-team-a-1" not in metrics


def test_tokens_per_minute_and_per_day_count_what_requests_used(tmp_path):
    usage = Usage(sqlite_url(tmp_path / "keys.sqlite3"))
    key = Key("k", "secret-key", tokens_per_minute=100, tokens_per_day=150)
    now = 999_999_980.0  # 20 s into a minute (999,999,960 is a multiple of 60), early in a UTC day
    assert usage.admit(key, now).allowed
    usage.record(key, prompt=60, cached=10, completion=40, now=now)
    refused = usage.admit(key, now + 1)
    assert not refused.allowed and refused.reason == "tokens_per_minute" and refused.headers["Retry-After"] == "39"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    assert usage.admit(key, now + 60).allowed  # a new minute ...
    usage.record(key, prompt=50, cached=0, completion=0, now=now + 60)
    late = usage.admit(key, now + 120)  # ... but the day's 150 tokens are used
    assert not late.allowed and late.reason == "tokens_per_day" and int(late.headers["Retry-After"]) > 60
    assert usage.totals()["k"] == {"requests": 2, "prompt_tokens": 110, "cached_tokens": 10, "completion_tokens": 40}


def test_two_workers_share_the_counts(tmp_path):
    key = Key("k", "secret-key", requests_per_minute=3)
    workers = [Usage(sqlite_url(tmp_path / "keys.sqlite3")) for _ in range(2)]  # a connection each
    decisions = [workers[index % 2].admit(key, 1_000_000_000.0).allowed for index in range(5)]
    assert decisions == [True, True, True, False, False]


@pytest.mark.parametrize("entry,words", [
    ({"key": "sk-12345678"}, "needs a name"),
    ({"name": "a", "key": "short"}, "at least 8"),
    ({"name": "a", "key": "sk-12345678", "rpm": 3}, "unknown fields rpm"),
    ({"name": "a", "key": "sk-12345678", "tokens_per_day": 0}, "positive integer"),
])
def test_a_bad_keys_file_stops_start_up_naming_the_problem_never_a_key(make_app, tmp_path, entry, words):
    with pytest.raises(ConfigError, match=words) as raised:
        make_app(API_KEYS_FILE=keys_file(tmp_path, entry))
    assert "sk-12345678" not in str(raised.value)


def test_names_and_keys_must_differ_and_plain_keys_are_named(tmp_path):
    path = keys_file(tmp_path, {"name": "a", "key": "sk-12345678"}, {"name": "a", "key": "sk-87654321"})
    with pytest.raises(ConfigError, match="different"):
        read_keys(path, ())
    assert [key.name for key in read_keys("", ("k1", "k2"))] == ["key-1", "key-2"]


def test_a_streamed_answer_counts_for_its_key_too(limited):
    client = limited.test_client()
    streamed = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=as_key("sk-team-a-1"))
    body = streamed.get_data(as_text=True)  # read to the end, after the request's context has gone
    assert body.rstrip().endswith("data: [DONE]")
    report = client.get("/v1/usage/keys", headers=as_key("sk-ops-admin")).get_json()["data"]
    team = next(item for item in report if item["name"] == "team-a")
    assert team["requests"] == 1 and team["completion_tokens"] > 0


def test_a_key_may_raise_priority_only_when_the_operator_says_so(make_app, tmp_path):
    path = keys_file(tmp_path, {"name": "team-a", "key": "sk-team-a-1"},
                     {"name": "urgent", "key": "sk-urgent-1", "raise_priority": True})
    client = make_app(API_KEYS_FILE=path).test_client()
    refused = client.post("/v1/chat/completions", json={**CHAT, "priority": -5}, headers=as_key("sk-team-a-1"))
    assert refused.status_code == 403 and refused.get_json()["error"]["param"] == "priority"
    header = client.post("/v1/chat/completions", json=CHAT, headers={**as_key("sk-team-a-1"), "X-Priority": "-1"})
    assert header.status_code == 403
    assert client.post("/v1/chat/completions", json={**CHAT, "priority": 5}, headers=as_key("sk-team-a-1")) \
        .status_code == 200  # later than others: anyone may
    assert client.post("/v1/chat/completions", json={**CHAT, "priority": -5}, headers=as_key("sk-urgent-1")) \
        .status_code == 200


def test_the_keys_file_s_new_fields_are_checked(tmp_path):
    keys = read_keys(keys_file(tmp_path, {"name": "a", "key": "sk-aaaaaaaa", "max_concurrent_requests": 2,
                                          "raise_priority": True}), ())
    assert (keys[0].max_concurrent_requests, keys[0].raise_priority, keys[0].admin) == (2, True, False)
    for bad in ({"max_concurrent_requests": 0}, {"raise_priority": "yes"}, {"admin": 1}):
        with pytest.raises(ConfigError):
            read_keys(keys_file(tmp_path, {"name": "a", "key": "sk-aaaaaaaa", **bad}), ())


def test_per_key_series_of_the_metrics_are_shown_to_admin_keys_only(limited):
    client = limited.test_client()
    client.post("/v1/chat/completions", json=CHAT, headers=as_key("sk-team-a-1"))
    ordinary = client.get("/metrics", headers=as_key("sk-team-a-1")).get_data(as_text=True)
    admin = client.get("/metrics", headers=as_key("sk-ops-admin")).get_data(as_text=True)
    assert 'phi_api_key_requests_total{key_name="team-a"}' in admin
    assert "phi_api_key_" not in ordinary and "phi_api_requests_total" in ordinary


def test_requests_are_reused_under_their_key_and_salt(make_app, tmp_path):
    from tests.support.fakes import fake_engine, text_pieces

    engine = fake_engine([1, 0], text_pieces(b"a"))
    model = engine.model
    path = keys_file(tmp_path, {"name": "team-a", "key": "sk-team-a-1"}, {"name": "team-b", "key": "sk-team-b-1"})
    client = make_app(engine=engine, API_KEYS_FILE=path).test_client()
    for secret, salt in (("sk-team-a-1", None), ("sk-team-a-1", None), ("sk-team-b-1", None), ("sk-team-a-1", "s")):
        body = {**CHAT, "cache_salt": salt} if salt else CHAT
        assert client.post("/v1/chat/completions", json=body, headers=as_key(secret)).status_code == 200
    keys = model.script.cache_keys
    assert keys[0] == keys[1] != "" and len({keys[1], keys[2], keys[3]}) == 3


def test_a_request_s_worst_case_is_held_while_it_runs_then_released(tmp_path):
    usage = Usage(sqlite_url(tmp_path / "keys.sqlite3"))
    key = Key("k", b"", tokens_per_minute=100, tokens_per_day=150)
    now = 999_999_980.0
    too_large = usage.reserve(key, 101, lasts=600, now=now)
    assert not too_large.allowed and too_large.reason == "too_large"
    held = usage.reserve(key, 60, lasts=600, now=now)
    assert held.allowed and held.held and held.headers["x-ratelimit-remaining-tokens"] == "40"
    refused = usage.reserve(key, 60, lasts=600, now=now + 1)  # fits alone, not beside the first
    assert not refused.allowed and refused.reason == "tokens_per_minute"
    assert usage.windows("k", now + 1)["tokens_reserved"] == 60
    usage.record(key, prompt=5, cached=0, completion=10, now=now + 2)
    usage.settle(held.held)
    assert usage.windows("k", now + 2)["tokens_reserved"] == 0
    assert usage.reserve(key, 60, lasts=5, now=now + 3).allowed  # 15 used, 60 held: 75 of 100
    assert usage.reserve(key, 30, lasts=600, now=now + 4).reason == "tokens_per_minute"
    # A reservation outlives its request's longest run at most (a worker that died holds nothing for long).
    assert usage.reserve(key, 30, lasts=600, now=now + 9).allowed
