"""Waking a greenlet from another OS thread, and relaying items from the engine thread to the hub."""

from __future__ import annotations

import threading

import gevent

from phi_api.engine.threads.wakeup import HubRelay, HubWaker


def test_a_notification_from_another_os_thread_wakes_the_waiting_greenlet():
    waker = HubWaker()
    threading.Thread(target=waker.notify).start()
    assert waker.wait(5) is True
    assert waker.wait(0.01) is False  # woken once: the next wait times out
    waker.close()


def test_the_relay_delivers_every_item_on_the_hub_in_order():
    delivered: list[int] = []
    relay = HubRelay(delivered.append)
    sender = threading.Thread(target=lambda: [relay.send(i) for i in range(200)])
    sender.start()
    sender.join()
    with gevent.Timeout(5):
        while len(delivered) < 200:
            gevent.sleep(0.001)
    assert delivered == list(range(200))
    ended = []
    relay.close(then=lambda: ended.append(True))
    with gevent.Timeout(5):
        while not ended:
            gevent.sleep(0.001)
