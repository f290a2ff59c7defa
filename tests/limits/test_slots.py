"""The server-wide concurrency limit, across processes."""

from __future__ import annotations

import os
import signal

import pytest

from phi_api.limits.slots import ConcurrencyLimiter


@pytest.fixture
def limiter():
    shared = ConcurrencyLimiter(2)
    yield shared
    shared.remove_file()


def test_slots_up_to_the_limit_then_none(limiter):
    first, second = limiter.try_acquire(), limiter.try_acquire()
    assert first is not None and second is not None and first.number != second.number
    assert limiter.try_acquire() is None
    first.release()
    first.release()  # idempotent
    assert limiter.try_acquire() is not None


def _in_child(work) -> int:
    """Run ``work`` in a forked child; its exit status says what it saw."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        status = work(write_end)
        os._exit(status)
    os.close(write_end)
    return pid, read_end


def test_the_limit_holds_across_processes_and_a_dead_process_gives_its_slots_back(limiter):
    def hold_two(signal_fd):
        held = [limiter.try_acquire(), limiter.try_acquire()]
        os.write(signal_fd, b"1" if all(held) else b"0")
        signal.pause()  # hold them until killed
        return 0

    pid, ready = _in_child(hold_two)
    assert os.read(ready, 1) == b"1"
    assert limiter.try_acquire() is None  # the other process holds every slot
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert limiter.try_acquire() is not None  # the kernel dropped the dead process's locks
    assert limiter.try_acquire() is not None
