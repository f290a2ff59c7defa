"""Hostile request bodies against the real server: each gets a 4xx with an error object, and nothing breaks."""

from __future__ import annotations

import json
import random
import string

import pytest
import requests

from tests.integration.conftest import MODEL_ID

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
OLLAMA_CHAT = "/api/chat"
BASE = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
JSON_TYPE = "application/json"


def dump(body) -> bytes:
    return json.dumps(body).encode()


def with_content(content) -> bytes:
    return dump({**BASE, "messages": [{"role": "user", "content": content}]})


def random_letters(count: int) -> str:
    chooser = random.Random(6)
    return "".join(chooser.choice(string.ascii_letters) for _ in range(count))


def deep_schema(depth: int) -> str:
    """A JSON Schema nested ``depth`` objects deep, as JSON text (a string field's value)."""
    return '{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + "}}" * depth


def nested(depth: int) -> bytes:
    return b'{"model": "' + MODEL_ID.encode() + b'", "messages": ' + b"[" * depth + b"]" * depth + b"}"


FIELDS = ["model", "messages", "temperature", "top_p", "n", "stream", "stop", "max_tokens", "presence_penalty",
          "frequency_penalty", "logit_bias", "user", "seed", "tools", "tool_choice", "response_format"]

# (name, route, raw body, Content-Type)
HOSTILE = [
    ("invalid UTF-8", CHAT, b'{"model": "\xff\xfe", "messages": []}', JSON_TYPE),
    ("invalid UTF-8 in content", CHAT, with_content("hi").replace(b'"hi"', b'"\xc3\x28"'), JSON_TYPE),
    ("CESU-8 surrogate bytes", CHAT, with_content("hi").replace(b'"hi"', b'"\xed\xa0\x80"'), JSON_TYPE),
    ("lone surrogate escape", CHAT, with_content("hi").replace(b'"hi"', b'"\\ud800"'), JSON_TYPE),
    ("lone low surrogate escape", COMPLETIONS, b'{"model": "' + MODEL_ID.encode() + b'", "prompt": "\\udc00"}',
     JSON_TYPE),
    ("array body", CHAT, b"[]", JSON_TYPE),
    ("string body", CHAT, b'"hello"', JSON_TYPE),
    ("number body", COMPLETIONS, b"42", JSON_TYPE),
    ("null body", CHAT, b"null", JSON_TYPE),
    ("empty body", CHAT, b"", JSON_TYPE),
    ("null everywhere", CHAT, dump({name: None for name in FIELDS}), JSON_TYPE),
    ("null message", CHAT, dump({**BASE, "messages": [None]}), JSON_TYPE),
    ("null role and content", CHAT, dump({**BASE, "messages": [{"role": None, "content": None}]}), JSON_TYPE),
    ("null prompt", COMPLETIONS, dump({"model": MODEL_ID, "prompt": None}), JSON_TYPE),
    ("1e309 temperature", CHAT, dump(BASE)[:-1] + b', "temperature": 1e309}', JSON_TYPE),
    ("1e309 max_tokens", CHAT, dump(BASE)[:-1] + b', "max_tokens": 1e309}', JSON_TYPE),
    ("-1e309 top_p", COMPLETIONS, b'{"model": "' + MODEL_ID.encode() + b'", "prompt": "a", "top_p": -1e309}',
     JSON_TYPE),
    ("NaN", CHAT, dump(BASE)[:-1] + b', "temperature": NaN}', JSON_TYPE),
    ("Infinity", CHAT, dump(BASE)[:-1] + b', "seed": Infinity}', JSON_TYPE),
    ("a 5000-digit integer", CHAT, dump(BASE)[:-1] + b', "seed": ' + b"7" * 5000 + b"}", JSON_TYPE),
    ("max_tokens -1", CHAT, dump({**BASE, "max_tokens": -1}), JSON_TYPE),
    ("max_tokens -1 (completions)", COMPLETIONS, dump({"model": MODEL_ID, "prompt": "a", "max_tokens": -1}), JSON_TYPE),
    ("max_tokens 10**30", CHAT, dump({**BASE, "max_tokens": 10**30}), JSON_TYPE),
    ("max_tokens 8.0", CHAT, dump({**BASE, "max_tokens": 8.0}), JSON_TYPE),
    ("n 0", CHAT, dump({**BASE, "n": 0}), JSON_TYPE),
    ("n 1000", CHAT, dump({**BASE, "n": 1000}), JSON_TYPE),
    ("string temperature", CHAT, dump({**BASE, "temperature": "0.7"}), JSON_TYPE),
    ("string max_tokens", COMPLETIONS, dump({"model": MODEL_ID, "prompt": "a", "max_tokens": "10"}), JSON_TYPE),
    ("string n", CHAT, dump({**BASE, "n": "2"}), JSON_TYPE),
    ("string seed", CHAT, dump({**BASE, "seed": "42"}), JSON_TYPE),
    ("string logit_bias value", CHAT, dump({**BASE, "logit_bias": {"1": "lots"}}), JSON_TYPE),
    ("boolean stream as string", CHAT, dump({**BASE, "stream": "true"}), JSON_TYPE),
    ("top_logprobs 1000", CHAT, dump({**BASE, "logprobs": True, "top_logprobs": 1000}), JSON_TYPE),
    ("nested 100000 deep", CHAT, nested(100_000), JSON_TYPE),
    ("nested 900 deep messages", CHAT, nested(900), JSON_TYPE),
    ("a schema string nested 3000 deep", CHAT, dump({**BASE, "structured_outputs": {"json": deep_schema(3000)}}),
     JSON_TYPE),
    ("a guided_json string nested 900 deep", CHAT, dump({**BASE, "guided_json": deep_schema(900)}), JSON_TYPE),
    ("nested content parts", CHAT, with_content([[[[{"type": "text", "text": "hi"}]]]]), JSON_TYPE),
    ("10000 messages", CHAT, dump({**BASE, "messages": [{"role": "user", "content": "hi"}] * 10_000}), JSON_TYPE),
    ("a 20000-letter token", CHAT, with_content(random_letters(20_000)), JSON_TYPE),
    ("a 300000-letter token", COMPLETIONS, dump({"model": MODEL_ID, "prompt": random_letters(300_000)}), JSON_TYPE),
    ("a 2 MB prompt", COMPLETIONS, dump({"model": MODEL_ID, "prompt": "lorem ipsum " * 180_000}), JSON_TYPE),
    ("raw control characters", CHAT, with_content("hi").replace(b'"hi"', b'"a\x01b\x1bc"'), JSON_TYPE),
    ("NUL character", CHAT, with_content("before\u0000after"), JSON_TYPE),
    ("NUL in a key", CHAT, dump({**BASE, "metadata\u0000": 1}), JSON_TYPE),
    ("stop list of 100", CHAT, dump({**BASE, "stop": [f"stop{i}" for i in range(100)]}), JSON_TYPE),
    ("stop of an object", COMPLETIONS, dump({"model": MODEL_ID, "prompt": "a", "stop": {"a": 1}}), JSON_TYPE),
    ("content as an object", CHAT, with_content({"text": "hi"}), JSON_TYPE),
    ("unknown role", CHAT, dump({**BASE, "messages": [{"role": "root", "content": "hi"}]}), JSON_TYPE),
    ("text/plain", CHAT, dump(BASE), "text/plain"),
    ("form data", COMPLETIONS, b"model=x&prompt=hi", "application/x-www-form-urlencoded"),
    ("multipart", CHAT, b"--b\r\n\r\n--b--", "multipart/form-data; boundary=b"),
    ("XML", CHAT, b"<request/>", "application/xml"),
    ("Ollama: string num_predict", OLLAMA_CHAT,
     dump({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": "x"}}),
     JSON_TYPE),
    ("Ollama: array body", OLLAMA_CHAT, b"[]", JSON_TYPE),
    ("30 patterns one string must match at once", CHAT, dump({**BASE, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "allOf": [{"pattern": f"^.*a.{{{i}}}$"} for i in range(1, 31)]}}}}), JSON_TYPE),
    ("a strict schema of 120000 properties", CHAT, dump({**BASE, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
            "type": "object", "properties": {f"p{i}": {} for i in range(120_000)},
            "required": [f"p{i}" for i in range(119_999)], "additionalProperties": False}}}}), JSON_TYPE),

    ("Ollama: NUL in the prompt", "/api/generate", dump({"model": MODEL_ID, "prompt": "a\u0000b"}), JSON_TYPE),
]


@pytest.fixture(scope="module")
def log_mark(server) -> int:
    """Where the server's log stood before the first hostile body."""
    return len(server.log())


@pytest.mark.parametrize("name,route,raw,content_type", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_each_hostile_body_gets_a_4xx_with_an_error_object(server, log_mark, name, route, raw, content_type):
    response = requests.post(server.url + route, data=raw, headers={"Content-Type": content_type}, timeout=60)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    if route.startswith("/api/"):
        assert isinstance(error, str) and error
    else:
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert "Traceback" not in error["message"] and "/site-packages/" not in error["message"]


def test_after_the_hostile_bodies_the_server_is_whole(server, log_mark):
    healthy = requests.post(server.url + CHAT, json=BASE, timeout=60)
    assert healthy.status_code == 200
    log = server.log()[log_mark:]
    assert "Traceback" not in log and " 500 " not in log
    assert "Worker exiting" not in log and "WORKER TIMEOUT" not in log
    print(f"{len(HOSTILE)} hostile bodies refused with a 4xx; the server kept serving")


def test_an_answer_of_brackets_nested_past_any_call_is_text_streamed_and_whole(server):
    """Tools offered, and an answer of 1,200 '[' (what a grammar may force): the call parser finds no call in it
    (it raised RecursionError: the stream was cut without [DONE], the whole answer a 400 after the work)."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    asked = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Brackets, please."}], "max_tokens": 1300,
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
             "extra_body": {"guided_regex": r"\[{1200}"}}
    whole = client.chat.completions.create(**asked)
    assert whole.choices[0].message.content == "[" * 1200 and not whole.choices[0].message.tool_calls
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        **asked, stream=True) if chunk.choices)  # the SDK raises if the stream ends without [DONE] or in an error
    assert streamed == "[" * 1200

