"""A conversation's items as the Responses API types them: a reasoning item keeps the shape OpenAI's SDK reads back
(``summary`` a list of ``summary_text`` parts, ``content`` of ``reasoning_text`` parts), and one that does not is a
400 before anything is stored, in a conversation and in a response's input alike."""

from __future__ import annotations

import pytest

from tests.support.fakes import fake_engine, text_pieces

THOUGHT = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Adding the two numbers."}],
           "content": [{"type": "reasoning_text", "text": "2 and 2 make 4."}]}
MALFORMED = [
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": 42}]},
    {"type": "reasoning", "summary": [{"type": "summary_text"}]},
    {"type": "reasoning", "summary": [{"type": "output_text", "text": "wrong kind"}]},
    {"type": "reasoning", "summary": "a string, not parts"},
    {"type": "reasoning"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": ["not", "a", "string"]}]},
]


@pytest.fixture
def client(make_app):
    return make_app(fake_engine([1, 0], text_pieces(b"ok"))).test_client()


def test_a_reasoning_item_is_kept_and_listed_in_its_shape(client):
    made = client.post("/v1/conversations", json={"items": [THOUGHT]})
    assert made.status_code == 200, made.get_data(as_text=True)
    [kept] = client.get(f"/v1/conversations/{made.get_json()['id']}/items").get_json()["data"]
    assert kept["id"].startswith("rs_")
    assert (kept["summary"], kept["content"]) == (THOUGHT["summary"], THOUGHT["content"])


@pytest.mark.parametrize("item", MALFORMED)
def test_a_malformed_reasoning_item_is_a_400_wherever_it_is_sent(client, item):
    made = client.post("/v1/conversations", json={"items": [{"type": "message", "role": "user", "content": "Hi"}]})
    conversation = made.get_json()["id"]
    for path, body in ((f"/v1/conversations/{conversation}/items", {"items": [item]}),
                       ("/v1/conversations", {"items": [item]}),
                       ("/v1/responses", {"model": "test-model", "input": [item]})):
        refused = client.post(path, json=body)
        assert refused.status_code == 400, (path, refused.get_data(as_text=True))
        assert refused.get_json()["error"]["type"] == "invalid_request_error"
    assert len(client.get(f"/v1/conversations/{conversation}/items").get_json()["data"]) == 1
