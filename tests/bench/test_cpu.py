"""phi-api bench cpu's reading of per-thread CPU time from /proc."""

from __future__ import annotations

import os
import threading
import time

from phi_api.bench.cpu import thread_seconds
from phi_api.engine.threads.native import ENGINE_THREAD_NAME, start_thread


def test_a_named_thread_s_cpu_time_is_counted_under_its_name():
    stop = threading.Event()
    done = threading.Event()

    def spin() -> None:
        deadline = time.monotonic() + 5
        while not stop.is_set() and time.monotonic() < deadline:
            pass
        done.set()

    before = thread_seconds(os.getpid()).get(ENGINE_THREAD_NAME.decode(), 0.0)
    start_thread(spin)
    started = time.monotonic()
    while thread_seconds(os.getpid()).get(ENGINE_THREAD_NAME.decode(), 0.0) < before + 0.05:
        assert time.monotonic() - started < 5, "the named thread's CPU time never showed"
    stop.set()
    done.wait(5)
