"""The background responses' store: a queue claimed once, a claim that stops when cancelled or deleted, events kept
for resuming and bounded, owners kept apart, responses of a worker that died marked failed, never left running, and
ended ones kept without their request bodies and bounded per key (on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from phi_api.storage.background import BackgroundFull, BackgroundStore, EventsGone, Job


def queued(number: int, stream: bool = False) -> tuple[dict, dict]:
    response = {"id": f"resp_{number}", "created_at": int(time.time()), "status": "queued", "output": []}
    return response, {"model": "m", "input": str(number), "background": True, "stream": stream}


def events(first: int, last: int) -> list[dict]:
    return [{"type": "response.output_text.delta", "sequence_number": number, "delta": str(number)}
            for number in range(first, last + 1)]


def ended(status: str) -> dict:
    return {"id": "resp_1", "status": status, "output": [{"type": "message"}]}


def failed(response: dict) -> dict:
    return {**response, "status": "failed", "error": {"code": "server_error", "message": "gone"}}


@pytest.fixture
def make_store(database_url):
    """A store on each engine's database, with small bounds unless told others."""

    def make(**bounds: float) -> BackgroundStore:
        return BackgroundStore(database_url, **{"max_active": 2, "max_ended": 2, "max_events": 16,
                                                "events_seconds": 3600, "max_age": 3600, "lease": 30, **bounds})

    return make


@pytest.fixture
def store(make_store):
    return make_store()


def put(store: BackgroundStore, number: int, owner: str = "team", priority: int = 0, stream: bool = False) -> None:
    response, body = queued(number, stream)
    store.create(response, body, owner, priority, events(0, 1) if stream else [])


def test_a_response_is_claimed_once_run_and_ended(store):
    put(store, 1)
    assert store.get("resp_1", "team").state == "queued"
    job = store.claim("worker-1")
    assert job.id == "resp_1" and job.body["input"] == "1" and store.claim("worker-2") is None
    assert store.get("resp_1").state == "in_progress" and store.get("resp_1").response["status"] == "queued"
    assert store.start(job) and store.get("resp_1").response["status"] == "in_progress"  # the gate took it
    assert store.renew(job)
    assert store.finish(job, ended("completed"))
    found = store.get("resp_1", "team")
    assert (found.state, found.response["output"]) == ("completed", [{"type": "message"}])
    assert not store.renew(job)  # ended: nothing left to hold


def test_the_soonest_priority_then_the_oldest_is_claimed_first(store):
    put(store, 1, priority=5)
    put(store, 2, owner="other", priority=0)
    put(store, 3, owner="other", priority=5)
    assert [store.claim("w").id for _ in range(3)] == ["resp_2", "resp_1", "resp_3"]


def test_each_key_has_a_bound_of_its_own(store):
    put(store, 1)
    put(store, 2)
    with pytest.raises(BackgroundFull):
        put(store, 3)
    put(store, 4, owner="other")  # another key's room is its own
    store.finish(store.claim("w"), ended("completed"))  # one of team's ended: room again
    put(store, 5)


def test_another_owner_neither_reads_nor_cancels_nor_deletes_it(store):
    put(store, 1, stream=True)
    assert store.get("resp_1", "other") is None and store.events("resp_1", -1, "other") == []
    assert store.cancel("resp_1", failed, "other") is None and not store.delete("resp_1", "other")
    assert store.get("resp_1", "team").state == "queued" and len(store.events("resp_1", -1, "team")) == 2


def test_a_cancelled_response_stops_its_worker_and_its_end_is_not_recorded(store):
    put(store, 1)
    job = store.claim("w")
    cancelled = store.cancel("resp_1", lambda response: {**response, "status": "cancelled"}, "team")
    assert cancelled.state == "cancelled" and cancelled.response["status"] == "cancelled"
    assert not store.renew(job) and not store.add_events(job, events(2, 3))
    assert not store.finish(job, ended("completed"))
    assert store.get("resp_1").state == "cancelled"
    # cancelling what has ended leaves it as it is
    assert store.cancel("resp_1", failed).response["status"] == "cancelled"


def test_a_queued_response_cancelled_is_never_claimed(store):
    put(store, 1)
    store.cancel("resp_1", lambda response: {**response, "status": "cancelled"})
    assert store.claim("w") is None


def test_a_deleted_response_stops_its_worker(store):
    put(store, 1, stream=True)
    job = store.claim("w")
    assert store.delete("resp_1", "team")
    assert store.get("resp_1") is None and store.events("resp_1", -1) == [] and not store.renew(job)


def test_a_released_response_waits_until_its_time(store):
    put(store, 1)
    put(store, 2)
    first, second = store.claim("w"), store.claim("w")
    store.release(first, time.time() + 3600)
    store.release(second, time.time() - 1)
    assert store.claim("w").id == second.id  # its time has come
    assert store.claim("w") is None and store.get(first.id).state == "queued"  # the other's has not
    store.release(Job(first.id, "team", {}, 0, False, 0.0, "nobody"), time.time() - 1)  # a claim that holds nothing
    assert store.claim("w") is None


def test_events_are_kept_in_order_for_a_resume_and_bounded(store):
    put(store, 1, stream=True)
    job = store.claim("w")
    assert store.add_events(job, events(2, 9))
    assert [event["sequence_number"] for event in store.events("resp_1", 4)] == [5, 6, 7, 8, 9]
    assert store.add_events(job, events(10, 39))
    with pytest.raises(EventsGone):  # only the newest 16 are kept
        store.events("resp_1", 4)
    assert [event["sequence_number"] for event in store.events("resp_1", 23)] == list(range(24, 40))
    assert store.finish(job, ended("completed"), events(40, 40))
    assert store.events("resp_1", 39)[0]["sequence_number"] == 40


def test_a_response_whose_worker_died_is_marked_failed_with_a_last_event(store):
    put(store, 1, stream=True)
    put(store, 2)
    claims = [store.claim("dead-worker"), store.claim("live-worker")]
    assert all(store.start(claim) for claim in claims)
    store.add_events(claims[0], events(2, 4))
    assert store.recover(lambda claimant: claimant == "live-worker", failed) == (0, 1)
    gone = store.get("resp_1")
    assert gone.state == "failed" and gone.response["error"]["message"] == "gone"
    last = store.events("resp_1", 4)
    assert [(event["type"], event["sequence_number"]) for event in last] == [("response.failed", 5)]
    assert store.get("resp_2").state == "in_progress"
    assert not store.finish(claims[0], ended("completed"))  # its worker, were it alive, could not undo that


def test_a_lease_that_ran_out_is_a_dead_worker(make_store):
    store = make_store(lease=-1.0)  # a lease that has run out once taken
    put(store, 1)
    store.start(store.claim("far-away"))
    assert store.recover(lambda claimant: True, failed) == (0, 1) and store.get("resp_1").state == "failed"


def test_a_response_whose_worker_died_before_the_gate_took_it_waits_for_another(store):
    put(store, 1, stream=True)
    put(store, 2)
    claims = [store.claim("dead-worker"), store.claim("dead-worker")]
    store.start(claims[1])
    assert store.recover(lambda claimant: False, failed) == (1, 1)  # only the one that had started is lost
    waiting = store.get("resp_1")
    assert (waiting.state, waiting.response["status"]) == ("queued", "queued") and store.events("resp_1", 1) == []
    assert store.get("resp_2").state == "failed"
    assert not store.start(claims[0])  # the dead worker's claim holds nothing now
    again = store.claim("live-worker")
    assert again.id == "resp_1" and store.start(again) and store.get("resp_1").response["status"] == "in_progress"


def test_a_cancelled_response_cannot_start(store):
    put(store, 1)
    job = store.claim("w")
    store.cancel("resp_1", failed)
    assert not store.start(job) and store.get("resp_1").state == "cancelled"


def test_events_go_after_their_time_and_responses_after_their_age(make_store):
    store = make_store(events_seconds=-1.0)  # events past their time as soon as their response ends
    put(store, 1, stream=True)
    store.finish(store.claim("w"), ended("completed"), events(2, 3))
    assert len(store.events("resp_1", -1)) == 4
    store.expire()
    assert store.events("resp_1", -1) == [] and store.get("resp_1").state == "completed"
    store.max_age = -1.0
    store.expire()
    assert store.get("resp_1") is None


def rows(store: BackgroundStore, query: str) -> dict:
    """The database's rows for ``query`` (two columns: a key, a value), as they are kept."""
    with store.database.read() as db:
        return dict(db.execute(sa.text(query)).all())


def bodies(store: BackgroundStore) -> dict[str, dict]:
    return {id_: json.loads(body) for id_, body in rows(store, "SELECT id, body FROM background_responses").items()}


def test_an_ended_response_keeps_no_request_body_however_it_ended(make_store):
    store = make_store(max_active=8, max_ended=8)
    for number in range(1, 6):
        put(store, number, stream=number == 5)
    store.cancel("resp_1", failed)  # cancelled while queued
    finished, failing, cancelled = (store.claim("worker") for _ in range(3))
    dying = store.claim("dead-worker")
    assert all(store.start(job) for job in (finished, failing, cancelled, dying))
    assert store.finish(finished, ended("completed")) and store.fail(failing, failed)
    store.cancel(cancelled.id, failed)  # cancelled while running
    assert store.recover(lambda claimant: claimant != "dead-worker", failed) == (0, 1)
    put(store, 6)  # still queued: its body is what its worker will run
    assert bodies(store) == {**{f"resp_{number}": {} for number in range(1, 6)}, "resp_6": queued(6)[1]}
    assert store.get(finished.id).response["output"] == [{"type": "message"}]  # its object stays whole
    assert {store.get(f"resp_{number}").state for number in range(1, 6)} == {"completed", "failed", "cancelled"}


def test_a_key_keeps_its_newest_ended_responses_and_never_evicts_another_key_s(store):
    put(store, 9, owner="other")
    store.cancel("resp_9", failed)  # ended before any of team's
    put(store, 1, stream=True)
    put(store, 2)
    store.cancel("resp_2", failed)  # ended before resp_1, though made after it
    first = store.claim("w")
    assert first.id == "resp_1" and store.add_events(first, events(2, 3)) and store.finish(first, ended("completed"))
    put(store, 3)
    store.cancel("resp_3", failed)  # team's third ended one: its oldest-ended goes
    assert store.get("resp_2") is None and store.get("resp_1").state == "completed"
    assert store.get("resp_3").state == "cancelled" and store.get("resp_9", "other").state == "cancelled"
    put(store, 4, priority=5)
    put(store, 5)
    assert store.fail(store.claim("w"), failed)  # resp_5 (the sooner priority): resp_1 goes, and its events
    assert store.get("resp_1") is None and store.get("resp_5").state == "failed"
    assert store.get("resp_4").state == "queued"  # queued or running ones are not counted, nor dropped
    assert rows(store, "SELECT response_id, COUNT(*) FROM background_events GROUP BY response_id") == {}
    assert set(bodies(store)) == {"resp_3", "resp_4", "resp_5", "resp_9"}


def test_an_earlier_release_s_ended_responses_lose_their_bodies_at_the_upgrade(make_store):
    store = make_store()
    put(store, 1)
    put(store, 2)
    store.cancel("resp_1", failed)
    with store.database.begin() as db:  # as an earlier release left it: an ended response with its body
        db.execute(sa.text("UPDATE background_responses SET body = :body WHERE id = 'resp_1'"),
                   {"body": json.dumps(queued(1)[1])})
        db.execute(sa.text("DROP INDEX IF EXISTS background_ended"))
        db.execute(sa.text("UPDATE schema_versions SET version = 1 WHERE store = 'background'"))
    upgraded = make_store()
    assert upgraded.get("resp_1").state == "cancelled"  # its first use migrates it
    assert bodies(upgraded) == {"resp_1": {}, "resp_2": queued(2)[1]}
    with upgraded.database.read() as db:
        assert "background_ended" in {index["name"] for index in sa.inspect(db).get_indexes("background_responses")}
