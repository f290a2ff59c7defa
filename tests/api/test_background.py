"""Background responses with a fake engine: queued at once, run by a worker's job (the runner's one step, called here),
polled, streamed and resumed from the store, cancelled, bounded per key (queued and running ones, and ended ones),
and refused where they cannot be; every object and event checked against OpenAI's published schemas."""

from __future__ import annotations

import json

from phi_api.background.job import run_job
from phi_api.background.runner import background_runner_of
from phi_api.web.resources import get_background, get_limiter, get_models, get_resources
from tests.api.test_responses import create, scripted
from tests.support.openai_schemas import validate
from tests.support.server import wait_until
from tests.support.sse import parse_named_sse


def run_next(app) -> str:
    """Claim the next queued response and run it, as a worker's runner does; how it ended."""
    job = get_background(app).claim("test-worker")
    assert job is not None, "a queued response"
    return run_job(get_resources(app), job).kind


def events(client, path: str) -> list[dict]:
    answer = client.get(path)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    found = [data for _, data in parse_named_sse(answer.get_data(as_text=True))]
    for data in found:
        validate("ResponseStreamEvent", data)
    return found


def test_a_worker_shutting_down_claims_no_background_response(make_app):
    app_client, _ = scripted(make_app, b"Hello")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True).get_json()
    runner = background_runner_of(get_resources(app))
    get_models(app).drain()
    assert runner.next_job() is None  # (it used to claim, get a 503, queue it again, and claim it again)
    assert get_background(app).claim("another worker").id == queued["id"]


def test_a_background_response_is_queued_then_run_and_polled(make_app):
    app_client, _ = scripted(make_app, b"Hello", b" there")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True).get_json()
    assert (queued["status"], queued["background"], queued["output"]) == ("queued", True, [])
    assert app_client.get(f"/v1/responses/{queued['id']}").get_json()["status"] == "queued"
    assert run_next(app) == "ended"
    done = app_client.get(f"/v1/responses/{queued['id']}").get_json()
    validate("Response", done)
    assert (done["id"], done["status"], done["background"]) == (queued["id"], "completed", True)
    assert done["output"][0]["content"][0]["text"] == "Hello there" and done["usage"]["output_tokens"] >= 2
    follow = create(app_client, input="More", previous_response_id=queued["id"])  # stored as any response
    assert follow.status_code == 200


def test_a_streamed_one_is_replayed_whole_and_after_any_sequence_number(make_app):
    app_client, _ = scripted(make_app, b"Hello", b" there")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True, stream=False).get_json()
    not_streamed = app_client.get(f"/v1/responses/{queued['id']}?stream=true")  # not made to stream
    assert not_streamed.status_code == 400 and not_streamed.get_json()["error"]["param"] == "stream"
    run_next(app)
    streamed = app_client.post("/v1/responses", json={"model": "test-model", "input": "Hi", "background": True,
                                                      "stream": True}, buffered=False)
    # the stream follows the store; run it before reading (no runner in a test app)
    first = next(streamed.response)
    assert b"response.created" in first
    assert run_next(app) == "ended"
    rest = b"".join(streamed.response).decode()
    told = [data for _, data in parse_named_sse(first.decode() + rest)]
    response_id = told[0]["response"]["id"]
    assert [event["type"] for event in told[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert told[-1]["type"] == "response.completed"
    assert [event["sequence_number"] for event in told] == list(range(len(told)))
    assert events(app_client, f"/v1/responses/{response_id}?stream=true") == told
    assert events(app_client, f"/v1/responses/{response_id}?stream=true&starting_after=4") == told[5:]
    for bad in ("x", "-2", "1e3", str(2**63), "%C2%B2"):  # ("²": a digit to isdigit(), not to int())
        refused = app_client.get(f"/v1/responses/{response_id}?stream=true&starting_after={bad}")
        assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "starting_after"


def test_cancel_answers_as_openai_does(make_app):
    app_client, _ = scripted(make_app, b"ok")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True).get_json()
    cancelled = app_client.post(f"/v1/responses/{queued['id']}/cancel").get_json()
    validate("Response", cancelled)
    assert cancelled["status"] == "cancelled" and get_background(app).claim("w") is None  # never run
    assert app_client.post(f"/v1/responses/{queued['id']}/cancel").get_json()["status"] == "cancelled"
    done = create(app_client, input="Hi", background=True).get_json()
    run_next(app)
    late = app_client.post(f"/v1/responses/{done['id']}/cancel")
    assert late.status_code == 400 and "Cannot cancel a completed response" in late.get_json()["error"]["message"]
    sync = create(app_client, input="Hi").get_json()
    refused = app_client.post(f"/v1/responses/{sync['id']}/cancel")
    assert refused.status_code == 400 and "synchronous" in refused.get_json()["error"]["message"]
    assert app_client.post("/v1/responses/resp_nothing/cancel").status_code == 404


def test_a_running_response_cancelled_stops_and_its_end_is_not_recorded(make_app):
    app_client, _ = scripted(make_app, b"ok")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True).get_json()
    job = get_background(app).claim("test-worker")
    app_client.post(f"/v1/responses/{queued['id']}/cancel")
    assert run_job(get_resources(app), job).kind == "stopped"
    assert app_client.get(f"/v1/responses/{queued['id']}").get_json()["status"] == "cancelled"


def test_a_response_waits_in_the_queue_while_the_server_is_full_then_runs(make_app):
    app_client, _ = scripted(make_app, b"ok", MAX_CONCURRENT_REQUESTS=1, QUEUE_TIMEOUT=0.05)
    app = app_client.application
    held = get_limiter(app).try_acquire()  # a live request holds the only slot
    queued = create(app_client, input="Hi", background=True).get_json()
    assert run_next(app) == "requeued"  # the gate's line timed out: back in the queue, not failed
    assert app_client.get(f"/v1/responses/{queued['id']}").get_json()["status"] == "queued"
    held.release()
    job = wait_until(lambda: get_background(app).claim("test-worker"), timeout=10, message="its turn again")
    assert job.id == queued["id"] and run_job(get_resources(app), job).kind == "ended"
    assert app_client.get(f"/v1/responses/{queued['id']}").get_json()["status"] == "completed"


def test_a_worker_that_stopped_before_the_gate_took_it_leaves_it_queued_for_another(make_app):
    app_client, _ = scripted(make_app, b"ok")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True).get_json()
    assert get_background(app).claim("worker-that-stopped").id == queued["id"]  # and then it stopped
    assert app_client.get(f"/v1/responses/{queued['id']}").get_json()["status"] == "queued"
    assert get_background(app).recover(lambda claimant: claimant != "worker-that-stopped", lambda r: r) == (1, 0)
    assert run_next(app) == "ended"  # another worker runs it: it had not started, so it is not lost
    assert app_client.get(f"/v1/responses/{queued['id']}").get_json()["status"] == "completed"


def test_a_request_the_gate_refuses_for_good_fails_the_response(make_app):
    app_client, _ = scripted(make_app, b"ok")
    app = app_client.application
    queued = create(app_client, input="Hi", background=True, max_output_tokens=10**6).get_json()
    assert run_next(app) == "ended"
    failed = app_client.get(f"/v1/responses/{queued['id']}").get_json()
    validate("Response", failed)
    assert failed["status"] == "failed" and failed["error"]["code"] == "invalid_prompt"


def test_each_key_has_a_bound_and_the_server_may_refuse_them_all(make_app):
    app_client, _ = scripted(make_app, b"ok", BACKGROUND_MAX_PER_KEY=1)
    assert create(app_client, input="Hi", background=True).status_code == 200
    full = create(app_client, input="Hi", background=True)
    assert full.status_code == 429 and full.get_json()["error"]["type"] == "rate_limit_error"
    off, _ = scripted(make_app, b"ok", BACKGROUND_CONCURRENCY=0)
    refused = create(off, input="Hi", background=True)
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "background"


def answered(client, method: str, path: str, response_id: str) -> tuple[int, dict]:
    """The status and body of an answer about ``response_id``, its id written ``ID`` (to compare two ids' answers)."""
    answer = client.open(path.format(response_id), method=method)
    return answer.status_code, json.loads(answer.get_data(as_text=True).replace(response_id, "ID"))


def test_an_ended_response_past_its_key_s_bound_is_not_found_as_one_never_made(make_app):
    app_client, _ = scripted(make_app, b"ok", BACKGROUND_ENDED_MAX_PER_KEY=1)
    app = app_client.application
    completed = create(app_client, input="Hi", background=True).get_json()["id"]
    run_next(app)
    polled = app_client.get(f"/v1/responses/{completed}").get_json()
    cancelled = create(app_client, input="Hi", background=True).get_json()["id"]
    app_client.post(f"/v1/responses/{cancelled}/cancel")  # the key's second ended one: the completed one goes
    assert get_background(app).get(completed) is None
    # ... but a completed response is also a stored one (for previous_response_id): kept as long as those are
    assert app_client.get(f"/v1/responses/{completed}").get_json() == polled
    other = create(app_client, input="Hi", background=True).get_json()["id"]
    app_client.post(f"/v1/responses/{other}/cancel")  # the cancelled one goes: it was never a stored response
    for method, path in (("GET", "/v1/responses/{}"), ("GET", "/v1/responses/{}?stream=true"),
                         ("POST", "/v1/responses/{}/cancel"), ("DELETE", "/v1/responses/{}")):
        gone = answered(app_client, method, path, cancelled)
        assert gone[0] == 404 and gone == answered(app_client, method, path, "resp_never_made"), (method, path)
    assert app_client.get(f"/v1/responses/{other}").get_json()["status"] == "cancelled"


def test_what_the_body_gets_wrong_is_a_400_before_anything_is_queued(make_app):
    app_client, _ = scripted(make_app, b"ok")
    app = app_client.application
    for body, param in (({"store": False}, "background"), ({"tools": [{"type": "web_search"}]}, "tools"),
                        ({"previous_response_id": "resp_nothing"}, "previous_response_id")):
        answer = create(app_client, input="Hi", background=True, **body)
        assert answer.status_code == 400 and answer.get_json()["error"]["param"] == param, answer.get_json()
    assert create(app_client, input="Hi", background=True, model="elsewhere").status_code == 404
    assert get_background(app).claim("w") is None


def test_the_openapi_document_names_the_query_parameters(client):
    document = client.get("/openapi.json").get_json()
    retrieve = document["paths"]["/v1/responses/{response_id}"]["get"]["parameters"]
    assert [(item["name"], item["in"]) for item in retrieve] == [
        ("response_id", "path"), ("stream", "query"), ("starting_after", "query")]
    listed = document["paths"]["/v1/conversations/{conversation_id}/items"]["get"]["parameters"]
    assert [item["name"] for item in listed if item["in"] == "query"] == ["after", "limit", "order"]
    assert "post" in document["paths"]["/v1/responses/{response_id}/cancel"]
