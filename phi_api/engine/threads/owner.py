"""The life of a per-process worker thread fed through an inbox, as the generators' engine thread and the encoders'
thread both live it: started once per process (after a fork, anew), fed from the hub, stopped (what runs is
cancelled) or retired (what runs finishes, nothing new is taken), and reporting to the hub through a relay because
it never logs itself."""

from __future__ import annotations

import collections
import os
from typing import Any, Generic, TypeVar

from phi_api.engine.threads.native import ENGINE_THREAD_NAME, Signal, start_thread
from phi_api.engine.threads.wakeup import HubRelay
from phi_api.errors import RetiredError

Item = TypeVar("Item")


class ThreadOwner(Generic[Item]):
    """Owns this process's thread: its inbox, the signal that wakes it, the relay back to the hub, and the flags
    the hub and the thread share. A subclass gives the thread's body (:meth:`_run`) and what the hub does with
    what the thread sends (:meth:`_deliver`)."""

    def __init__(self, thread_name: bytes = ENGINE_THREAD_NAME) -> None:
        self._thread_name = thread_name
        self._inbox: collections.deque[Item] = collections.deque()
        self._signal = Signal()
        self._relay: HubRelay | None = None
        self._started_pid: int | None = None
        self._ready = self._stopping = self._retiring = False

    @property
    def running(self) -> bool:
        """Whether this process's thread is up and ready to work."""
        return self._started_pid == os.getpid() and self._ready and not self._stopping

    def start(self) -> None:
        """Start the thread in this process (after a fork, a new one); call from the hub's thread."""
        if self._started_pid != os.getpid():
            self._started_pid = os.getpid()
            self._stopping = self._ready = False
            self._inbox.clear()
            self._on_start()
            self._relay = HubRelay(self._deliver)
            start_thread(self._run, name=self._thread_name)

    def stop(self) -> None:
        """Ask the thread to cancel what it runs and exit."""
        self._stopping = True
        self._signal.set()

    def retire(self) -> None:
        """Take nothing new; let what runs finish, then exit."""
        self._retiring = True
        self._signal.set()

    def _admit(self) -> None:
        """Before an item is queued: refused once retired; the thread started in this process."""
        if self._retiring:
            raise RetiredError("this model has been unloaded")
        self.start()

    def _push(self, item: Item) -> None:
        """Queue an item and wake the thread."""
        self._inbox.append(item)
        self._signal.set()

    def _send(self, message: Any) -> None:
        """To the hub's thread, from this thread (the relay is closed only once the thread has ended)."""
        assert self._relay is not None
        self._relay.send(message)

    def _on_start(self) -> None:
        """What else a new process's thread starts from (nothing by default)."""

    def _run(self) -> None:
        raise NotImplementedError

    def _deliver(self, message: Any) -> None:
        raise NotImplementedError
