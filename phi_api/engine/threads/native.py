"""Real OS threads and locks, even after gevent has monkey-patched ``threading``.

Under gunicorn's gevent worker ``threading.Thread`` becomes a greenlet and
``threading.Lock`` a gevent lock: a long native call inside such a "thread"
freezes the whole worker, and gevent primitives must not be touched from
another OS thread. The engine therefore uses the originals saved by gevent.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import gevent
from gevent import get_hub, monkey

_PR_SET_NAME = 15  # linux/prctl.h


ENGINE_THREAD_NAME = b"phi-api engine"  # what ``top -H`` and /proc/<pid>/task/*/comm show for it


def start_thread(target: Callable[[], Any], name: bytes = ENGINE_THREAD_NAME) -> int:
    """Start ``target`` on a new OS thread named ``name`` (at most 15 bytes); returns its identifier."""
    start_new_thread = monkey.get_original("_thread", "start_new_thread")

    def named() -> Any:
        prctl = getattr(ctypes.CDLL(None), "prctl", None)
        if prctl is not None:
            prctl(_PR_SET_NAME, name[:15], 0, 0, 0)
        return target()

    return start_new_thread(named, ())


def off_hub(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` on a pooled OS thread while the calling greenlet waits.

    For long native calls made on behalf of a request (tokenizing a long
    prompt): the hub, and every other request of the worker, keeps running.
    Exceptions are re-raised here (gevent's pool would also print them).
    """

    def call() -> tuple[bool, Any]:
        try:
            return True, function(*args)
        except BaseException as exc:  # handed to the caller, which raises it
            return False, exc

    ok, value = get_hub().threadpool.apply(call)
    if not ok:
        raise value
    return value


def spawn(function: Callable[..., Any], *args: Any) -> None:
    """``function(*args)`` on a greenlet of its own: for work a callback the hub runs (the engine's relay) hands
    on, which may wait (for a pooled thread, a database) where the hub itself must not."""
    gevent.spawn(function, *args)


def new_lock() -> Any:
    """A plain OS-level lock (``_thread.LockType``)."""
    return monkey.get_original("_thread", "allocate_lock")()


def new_rlock() -> Any:
    """A plain OS-level re-entrant lock (``_thread.RLock``): gevent's, which ``threading.RLock`` is in a
    monkey-patched process, hangs when native threads contend for it."""
    return monkey.get_original("_thread", "RLock")()


class Signal:
    """A wake-up flag one OS thread waits on and any thread sets.

    Built on a raw lock held while nothing is pending: ``set`` releases it,
    ``wait`` re-acquires it. Setting twice before a wait wakes it once.
    """

    def __init__(self) -> None:
        self._lock = new_lock()
        self._lock.acquire()

    def set(self) -> None:
        """Wake the waiter (or let its next wait return at once)."""
        try:
            self._lock.release()
        except RuntimeError:
            pass  # already set: one pending wake-up is enough

    def wait(self, timeout: float) -> bool:
        """Block this OS thread until set or ``timeout`` seconds; True if it was set."""
        return self._lock.acquire(timeout=timeout)


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``; nothing elsewhere), after an
    engine has ended and been freed (about 9 ms).

    Freeing a decoder session leaves most of its memory in glibc's arenas, still counted in the
    process's RSS. Measured side by side with two workers (tests/integration/test_models.py), after
    an unload of the default model (whose load had added 233-255 MB): without the trim the server's
    PSS stayed 174-181 MB above its level before the load; with it, between 48 MB below and 57 MB above.
    """
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
