"""Waking a greenlet from the engine's OS thread.

gevent objects (``Event``, ``AsyncResult``, queues) must not be touched from
another OS thread. Each waiting greenlet owns a loop ``async_`` watcher: the
engine thread calls its thread-safe ``send()``, and the watcher's callback,
run by the hub on its own thread, sets the event the greenlet waits on. The
started watcher also keeps the hub's loop alive while the greenlet waits.
"""

from __future__ import annotations

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
