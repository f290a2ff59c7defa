"""Long native calls made for a request run off the gevent hub."""

from __future__ import annotations

import threading
import time

import gevent
import pytest

from phi_api.engine.threads.native import off_hub


def test_the_call_runs_on_another_os_thread_and_returns_its_value():
    assert off_hub(lambda a, b: (a + b, threading.get_ident()), 1, 2)[0] == 3
    assert off_hub(threading.get_ident) != threading.get_ident()


def test_its_exception_reaches_the_caller():
    def fail():
        raise ValueError("bad prompt")

    with pytest.raises(ValueError, match="bad prompt"):
        off_hub(fail)


def test_other_greenlets_run_while_it_blocks():
    ticks = []

    def tick():
        while True:
            ticks.append(1)
            gevent.sleep(0.01)

    ticker = gevent.spawn(tick)
    gevent.sleep(0)
    before = len(ticks)
    off_hub(time.sleep, 0.3)  # a blocking call: on the hub's thread it would stop the ticker
    ticker.kill()
    assert len(ticks) > before + 3
