"""Waking a greenlet from the engine's OS thread.

gevent objects (``Event``, ``AsyncResult``, queues) must not be touched from
another OS thread. Each waiting greenlet owns a loop ``async_`` watcher: the
engine thread calls its thread-safe ``send()``, and the watcher's callback,
run by the hub on its own thread, sets the event the greenlet waits on. The
started watcher also keeps the hub's loop alive while the greenlet waits.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import gevent
from gevent.event import Event


class HubWaker:
    """Made by a greenlet; ``notify`` may be called from any OS thread."""

    def __init__(self) -> None:
        self._event = Event()
        self._watcher = gevent.get_hub().loop.async_()
        self._watcher.start(self._event.set)

    def notify(self) -> None:
        """Wake the greenlet (thread-safe; several notifications before it runs wake it once)."""
        self._watcher.send()

    def wait(self, timeout: float | None) -> bool:
        """Greenlet side: sleep until notified or ``timeout``; True if notified."""
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken

    def close(self) -> None:
        """Greenlet side: stop watching (idempotent)."""
        self._watcher.stop()


class HubRelay:
    """Hands items from the engine's OS thread to a callback run on the hub's thread.

    The engine thread must not log or touch anything gevent has patched (a
    logging handler's lock becomes a gevent lock): it ``send``s plain data
    here, and ``deliver`` — logging, say — runs where that is safe. Made on
    the hub's thread; the watcher does not keep an idle loop alive.
    """

    def __init__(self, deliver) -> None:
        self._deliver = deliver
        self._items: collections.deque = collections.deque()
        self._watcher = gevent.get_hub().loop.async_()
        self._watcher.ref = False
        self._watcher.start(self._drain)

    def send(self, item) -> None:
        """Queue ``item`` for delivery (thread-safe)."""
        self._items.append(item)
        self._watcher.send()

    def close(self, then: Callable[[], Any] | None = None) -> None:
        """Hub side: stop watching, then call ``then`` on the hub once the running callback has returned.

        The loop holds a started watcher, and with it ``deliver`` and everything ``deliver`` reaches:
        an engine that has ended must close its relay to be freed; ``then`` runs when it can be.
        """
        self._watcher.stop()
        if then is not None:
            gevent.get_hub().loop.run_callback(then)

    def _drain(self) -> None:
        while self._items:
            self._deliver(self._items.popleft())
