"""Who gets a generation slot: each key's own cap, the server's slots, and a bounded, fair waiting line.

A request takes a slot of its key (``max_concurrent_requests`` in the keys file: a byte-range lock file per key,
so the cap holds across workers, as the server's slots do) and one of the server's ``MAX_CONCURRENT_REQUESTS``.
When none is free, it waits in its worker's line (``MAX_QUEUED_REQUESTS``, at most ``QUEUE_TIMEOUT`` seconds), or
gets 429 at once when the line is off (0, the specification's default).

The line is fair across keys: whenever slots may have freed, the waiters are offered them in order of how many
requests their key already runs in this worker (fewest first), then of how long ago their key last got a slot
(round robin: a key with many waiters takes turns with the others), then of arrival; a waiter whose key is at its
cap is passed over, not waited for. And one key cannot fill it: when it is full, a newcomer whose key holds fewer
places than the key holding most takes the newest place of that key, which gets its 429 at once. A waiter whose
client leaves gives up its place within a quarter of a second, so a client that gave up never takes a slot.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gevent
from gevent.event import Event

from phi_api.limits.slots import ConcurrencyLimiter, Limiter, Slot

POLL_SECONDS = 0.02  # how soon a waiter looks again: a slot may free in another worker, which cannot wake it
GONE_SECONDS = 0.25  # how often a waiter looks whether its client is still there


class KeyCaps:
    """Each key's cap on its running requests (None: no cap), as lock files in the server's state ``folder``."""

    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder)
        self._limiters: dict[str, ConcurrencyLimiter] = {}

    def limiter(self, name: str, cap: int | None) -> Limiter | None:
        if cap is None:
            return None
        found = self._limiters.get(name)
        if found is None or found.limit != cap:
            digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
            found = self._limiters[name] = ConcurrencyLimiter(cap, os.path.join(self._folder, f"key-{digest}.lock"))
        return found


class _Both(Slot):
    """A key's slot and a server slot, given back together (and the key's count in this worker's line)."""

    def __init__(self, parts: list[Slot], done: Callable[[], None]) -> None:
        self._parts, self._done, self._held = parts, done, True

    def release(self) -> None:
        if self._held:
            self._held = False
            for part in self._parts:
                part.release()
            self._done()


@dataclass(eq=False)
class _Waiter:
    key: str
    take: Callable[[], Slot | None]
    order: int
    ready: Event = field(default_factory=Event)
    slot: Slot | None = None
    refused: bool = False


class WaitingLine:
    """One worker's line of requests waiting for a slot (``size`` places; 0: none), ``timeout`` seconds at most."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self.running: Counter[str] = Counter()  # requests each key runs in this worker
        self._granted: dict[str, int] = {}  # when each key last got a slot (a count of grants)
        self._grants = itertools.count(1)
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._dispatcher: gevent.Greenlet | None = None

    def acquire(self, key: str, server: Limiter, own: Limiter | None,
                gone: Callable[[], bool] = lambda: False) -> Slot | None:
        """A slot for a request of ``key`` (its own cap ``own`` and the ``server``'s), now or after waiting in
        line; None: none could be had (429), or the client left while it waited (``gone``, looked at every
        :data:`GONE_SECONDS`: a client that gave up leaves the line, rather than holding a place, and then a slot)."""
        take = self._taker(key, server, own)
        slot = take()
        if slot is not None or not self.size or not self._place_for(key):
            return slot
        waiter = _Waiter(key, take, next(self._arrivals))
        self._waiting.append(waiter)
        self._wake_dispatcher()
        deadline = time.monotonic() + self.timeout
        try:
            while not waiter.ready.wait(max(0.0, min(GONE_SECONDS, deadline - time.monotonic()))):
                if time.monotonic() >= deadline or gone():
                    break
        finally:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
        return waiter.slot

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _taker(self, key: str, server: Limiter, own: Limiter | None) -> Callable[[], Slot | None]:
        def take() -> Slot | None:
            mine = own.try_acquire() if own is not None else None
            if own is not None and mine is None:
                return None
            shared = server.try_acquire()
            if shared is None:
                if mine is not None:
                    mine.release()
                return None
            self.running[key] += 1
            self._granted[key] = next(self._grants)
            return _Both([part for part in (mine, shared) if part is not None], lambda: self._ended(key))

        return take

    def _ended(self, key: str) -> None:
        self.running[key] -= 1
        if self.running[key] <= 0:
            del self.running[key]
        if self._waiting:
            self._wake_dispatcher()

    def _place_for(self, key: str) -> bool:
        """Whether ``key`` may join the line: there is room, or it bumps the newest waiter of the key holding most
        places, when that key holds more than it will."""
        if len(self._waiting) < self.size:
            return True
        held = Counter(waiter.key for waiter in self._waiting)
        crowding, most = held.most_common(1)[0]
        if most <= held[key] + 1:
            return False
        bumped = max((waiter for waiter in self._waiting if waiter.key == crowding), key=lambda w: w.order)
        self._waiting.remove(bumped)
        bumped.refused = True
        bumped.ready.set()
        return True

    def _wake_dispatcher(self) -> None:
        if self._dispatcher is None or self._dispatcher.dead:
            self._dispatcher = gevent.spawn(self._dispatch)

    def _dispatch(self) -> None:
        """Offer slots to the waiters, fairest first, until the line is empty."""
        while self._waiting:
            for waiter in sorted(self._waiting, key=lambda w: (self.running[w.key], self._granted.get(w.key, 0),
                                                               w.order)):
                slot = waiter.take()
                if slot is None:
                    continue  # its key's cap, or no server slot: the next may still have one of its own
                waiter.slot = slot
                self._waiting.remove(waiter)
                waiter.ready.set()
                break  # the counts changed: the order is made again
            else:
                gevent.sleep(POLL_SECONDS)
