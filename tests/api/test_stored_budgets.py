"""The stores' byte budgets per key as a client meets them: a response too large to store is answered but not kept
(a follow-up naming it is answered as one naming an evicted response), and a conversation's key past its budget
gets a 400 while nothing it holds is dropped."""

from __future__ import annotations

from phi_api.web.resources import get_store
from tests.support.fakes import fake_engine, text_pieces


def client_of(make_app, **config):
    """A client of an app whose fake model reads a few thousand characters (one token each) at once."""
    engine = fake_engine([1, 0], text_pieces(b"ok"), context_length=8192, prefill_chunk=1024)
    return make_app(engine, **config).test_client()


def create(client, **body):
    return client.post("/v1/responses", json={"model": "test-model", **body})


def said(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_a_follow_up_naming_a_response_too_large_to_store_is_answered_as_one_evicted(make_app):
    client = client_of(make_app, RESPONSES_STORE_MB_PER_KEY=0.004)  # 4,194 bytes a key: "Hi" takes some 1,000
    small = create(client, input="Hi").get_json()
    big = create(client, input="x " * 2500)
    assert big.status_code == 200 and big.get_json()["output"][0]["content"][0]["text"] == "ok"  # answered
    gone = create(client, input="Again", previous_response_id=big.get_json()["id"])
    assert gone.status_code == 400, gone.get_data(as_text=True)
    assert (gone.get_json()["error"]["code"], gone.get_json()["error"]["param"]) == \
        ("previous_response_not_found", "previous_response_id")
    assert client.get(f"/v1/responses/{small['id']}").status_code == 200  # and evicted nothing


def test_conversations_past_their_key_s_budget_are_refused_with_a_400_and_nothing_dropped(make_app):
    client = client_of(make_app, CONVERSATIONS_MB_PER_KEY=0.004)  # 4,194 bytes a key
    conversation = client.post("/v1/conversations", json={"items": [said("x " * 1250)]}).get_json()["id"]
    refused = client.post("/v1/conversations", json={"items": [said("y " * 1250)]})
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "items"
    added = client.post(f"/v1/conversations/{conversation}/items", json={"items": [said("z " * 1250)]})
    assert added.status_code == 400 and added.get_json()["error"]["param"] == "items"
    answer = create(client, input="w " * 1000, conversation=conversation)
    assert answer.status_code == 400 and answer.get_json()["error"]["param"] == "conversation"
    kept = client.get(f"/v1/conversations/{conversation}/items").get_json()["data"]
    assert [item["content"][0]["text"][:1] for item in kept] == ["x"]


def test_a_stored_history_holds_what_one_request_may_carry_trimmed_only_where_truncation_allows(make_app):
    """A chain of follow-ups stores its whole history at every link: past MAX_REQUEST_SIZE_MB (what a follow-up
    would read), ``truncation: "auto"`` keeps its newest messages (its oldest would be dropped when read anyway), and
    without it the response is answered but not kept."""
    client = client_of(make_app, MAX_REQUEST_SIZE_MB=0.005)  # 5,242 bytes
    first = create(client, input="a " * 1000, truncation="auto").get_json()["id"]
    second = create(client, input="b " * 1000, truncation="auto", previous_response_id=first).get_json()["id"]
    third = create(client, input="c " * 1000, truncation="auto", previous_response_id=second).get_json()["id"]
    history = get_store(client.application).messages(third)
    texts = [str(message["content"])[:1] for message in history if message["role"] == "user"]
    assert texts == ["b", "c"]  # the oldest went, the newest stayed
    kept = create(client, input="d", truncation="auto", previous_response_id=third)
    assert kept.status_code == 200, kept.get_data(as_text=True)
    first = create(client, input="a " * 1000).get_json()["id"]
    second = create(client, input="b " * 1000, previous_response_id=first).get_json()["id"]
    third = create(client, input="c " * 1000, previous_response_id=second)
    assert third.status_code == 200  # answered, but its history (past the bound) not kept
    gone = create(client, input="d", previous_response_id=third.get_json()["id"])
    assert gone.status_code == 400 and gone.get_json()["error"]["code"] == "previous_response_not_found"


def test_a_conversation_holds_at_most_what_one_request_may_carry(make_app):
    client = client_of(make_app, MAX_REQUEST_SIZE_MB=0.01)  # 10,485 bytes
    conversation = client.post("/v1/conversations", json={"items": [said("x " * 2000)]}).get_json()["id"]
    added = client.post(f"/v1/conversations/{conversation}/items", json={"items": [said("y " * 2000)]})
    assert added.status_code == 200, added.get_data(as_text=True)
    refused = client.post(f"/v1/conversations/{conversation}/items", json={"items": [said("z " * 2000)]})
    assert refused.status_code == 400 and "MAX_REQUEST_SIZE_MB" in refused.get_json()["error"]["message"]
    other = client.post("/v1/conversations", json={"items": [said("w " * 2000)]})
    assert other.status_code == 200  # the bound is one conversation's, not the key's
