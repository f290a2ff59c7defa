"""The server-wide limit on concurrent generations (``MAX_CONCURRENT_REQUESTS``).

Two layers, both non-blocking (a request over the limit gets 429 at once):

- a gevent ``BoundedSemaphore`` per worker, the cheap first check, which also
  catches a slot released twice;
- one byte-range lock per slot on a shared lock file (``fcntl``), which makes
  the limit hold across all gunicorn workers. The kernel drops a process's
  locks when it dies, so the slots of a killed worker come back by
  themselves, without the master having to clean up.

POSIX record locks belong to a process, not to a file descriptor or a
greenlet, so each worker also remembers which slot numbers it holds.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from typing import Any, Protocol

from gevent.lock import BoundedSemaphore


class Slot:
    """A held concurrency slot; ``release`` is idempotent."""

    def __init__(self, limiter: ConcurrencyLimiter, number: int) -> None:
        self._limiter = limiter
        self.number = number
        self._held = True

    def release(self) -> None:
        """Give the slot back."""
        if self._held:
            self._held = False
            self._limiter._release(self.number)


class Limiter(Protocol):
    """What the generation path asks of a limiter."""

    def try_acquire(self) -> Slot | None: ...


class Unlimited:
    """A limiter that always has a slot: batch lines run outside ``MAX_CONCURRENT_REQUESTS``."""

    def try_acquire(self) -> Slot:
        return _FreeSlot()


class _FreeSlot(Slot):
    def __init__(self) -> None:  # no limiter, no number: nothing to give back
        pass

    def release(self) -> None:
        pass


class ConcurrencyLimiter:
    """At most ``limit`` slots held at once by all the processes sharing ``lock_path``."""

    def __init__(self, limit: int, lock_path: str | None = None) -> None:
        self.limit = limit
        self._owner_pid = os.getpid()
        if lock_path is None:
            handle, lock_path = tempfile.mkstemp(prefix="phi-api-slots-")
            os.close(handle)
            self._owns_file = True
        else:
            self._owns_file = False
        self.lock_path = lock_path
        self._pid: int | None = None
        self._fd: int | None = None
        self._local: Any = None
        self._held: set[int] = set()

    def try_acquire(self) -> Slot | None:
        """A free slot, or None when the server is at its limit."""
        self._attach()
        if not self._local.acquire(blocking=False):
            return None
        for number in range(self.limit):
            if number not in self._held and self._lock_byte(number):
                self._held.add(number)
                return Slot(self, number)
        self._local.release()
        return None

    def remove_file(self) -> None:
        """Delete the lock file (by the process that created it, at shutdown)."""
        if self._owns_file and os.getpid() == self._owner_pid:
            try:
                os.unlink(self.lock_path)
            except FileNotFoundError:
                pass

    def _attach(self) -> None:
        # Locks are per process: after a fork, start from a clean slate of our own.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._local = BoundedSemaphore(self.limit)
            self._held = set()

    def _lock_byte(self, number: int) -> bool:
        assert self._fd is not None, "opened by _attach() first"
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, number)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def _release(self, number: int) -> None:
        if self._pid != os.getpid() or number not in self._held:
            return
        assert self._fd is not None
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, number)
        self._held.discard(number)
        self._local.release()
