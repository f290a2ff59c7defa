"""The waiting line and each key's cap: a bounded wait for a slot, fair across keys, that no key can fill."""

from __future__ import annotations

import gevent
import gevent.event
import pytest

from phi_api.limits.line import KeyCaps, WaitingLine
from phi_api.limits.slots import ConcurrencyLimiter


@pytest.fixture
def server():
    shared = ConcurrencyLimiter(1)
    yield shared
    shared.remove_file()


def test_without_a_line_a_request_over_the_limit_is_refused_at_once(server):
    line = WaitingLine(0, 5.0)
    held = line.acquire("a", server, None)
    assert held is not None and line.acquire("b", server, None) is None and line.waiting == 0


def test_a_waiter_gets_the_slot_given_back(server):
    line = WaitingLine(4, 5.0)
    held = line.acquire("a", server, None)
    waiter = gevent.spawn(line.acquire, "b", server, None)
    gevent.wait([waiter], timeout=0.1)
    assert not waiter.ready() and line.waiting == 1
    held.release()
    assert waiter.get(timeout=5) is not None and line.waiting == 0


def test_a_waiter_past_its_timeout_is_refused(server):
    line = WaitingLine(4, 0.2)
    held = line.acquire("a", server, None)
    assert line.acquire("b", server, None) is None and line.waiting == 0
    held.release()


def test_a_waiter_whose_client_left_gives_up_its_place_and_never_takes_the_slot(server):
    line = WaitingLine(1, 30.0)
    held = line.acquire("a", server, None)
    left = gevent.event.Event()
    ghost = gevent.spawn(line.acquire, "b", server, None, left.is_set)
    gevent.wait([ghost], timeout=0.1)
    assert not ghost.ready() and line.waiting == 1
    left.set()  # its client closes the connection
    assert ghost.get(timeout=5) is None and line.waiting == 0  # long before the line's 30 s
    waiter = gevent.spawn(line.acquire, "c", server, None)  # the place is free for another ...
    gevent.wait([waiter], timeout=0.1)
    assert not waiter.ready() and line.waiting == 1
    held.release()
    assert waiter.get(timeout=5) is not None  # ... which gets the slot


def test_slots_go_first_to_the_key_running_least():
    server = ConcurrencyLimiter(2)
    line = WaitingLine(8, 5.0)
    running, held = line.acquire("busy", server, None), line.acquire("busy", server, None)
    order: list[str] = []

    def wait(key: str) -> None:
        slot = line.acquire(key, server, None)
        order.append(key)
        gevent.sleep(0)
        slot.release()

    waiters = [gevent.spawn(wait, "busy")]
    gevent.sleep(0.05)  # the busy key's second request arrives first ...
    waiters.append(gevent.spawn(wait, "quiet"))
    gevent.sleep(0.05)
    held.release()  # ... but the quiet key, running nothing, is served first (the busy key still runs one)
    gevent.joinall(waiters, timeout=5)
    running.release()
    server.remove_file()
    assert order == ["quiet", "busy"]


def test_one_key_cannot_fill_the_line(server):
    line = WaitingLine(2, 5.0)
    held = line.acquire("flood", server, None)
    flood = [gevent.spawn(line.acquire, "flood", server, None) for _ in range(2)]
    gevent.sleep(0.05)
    assert line.waiting == 2
    newcomer = gevent.spawn(line.acquire, "other", server, None)
    gevent.sleep(0.05)
    assert flood[1].ready() and flood[1].value is None  # the flood's newest place went to the other key
    assert line.waiting == 2 and not newcomer.ready()
    assert line.acquire("flood", server, None) is None  # and the flood gets no more places
    held.release()
    assert newcomer.get(timeout=5) is not None or flood[0].get(timeout=5) is not None


def test_a_key_s_cap_holds_and_its_waiter_does_not_hold_up_others(server, tmp_path):
    roomy = ConcurrencyLimiter(2)
    try:
        caps = KeyCaps(tmp_path)
        line = WaitingLine(4, 5.0)
        capped = caps.limiter("capped", 1)
        first = line.acquire("capped", roomy, capped)
        second = gevent.spawn(line.acquire, "capped", roomy, capped)  # a server slot is free, the key's is not
        gevent.sleep(0.05)
        assert first is not None and not second.ready()
        other = line.acquire("other", roomy, caps.limiter("other", None))
        assert other is not None  # not held up by the capped key's waiter
        first.release()
        assert second.get(timeout=5) is not None
    finally:
        roomy.remove_file()
