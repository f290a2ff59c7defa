"""One key/value budget for every model a worker serves: the running requests and kept prefixes of all of them.

Each model has its own engine thread, pool and ledger (:mod:`engine.kv.ledger`);
the ledgers of one worker share a :class:`SharedBudget`. A request is admitted
when the running requests of every model, with it, fit the worker's budget
(and its own model's cap, ``KV_CACHE_MB``). Kept prefixes of every model fill
what is left and leave least recently used first, whichever model they
belong to: a ledger gives up its own at once, and asks the other engines to
give up theirs (:meth:`SharedBudget.ask`); each does so at its next iteration
(:meth:`Account.take_asked`) and wakes the engines waiting for room. A
running request is never evicted: a request that does not fit waits, in
order, until the memory it needs is given back.

Kept prefixes that no request has used for ``idle_seconds`` leave too, so
that an idle model's memory goes back to the system.

Engine threads call this from their own threads: every change of the books
and every decision on them is made under one lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phi_api.engine.kv.sequence import Kept
from phi_api.engine.threads.native import new_rlock


@dataclass(eq=False)
class Account:
    """One engine's part of the books: its running requests' bytes and its kept prefixes."""

    shared: SharedBudget
    name: str
    wake: Callable[[], None]  # makes the engine's thread look at its books soon (it may be asleep)
    size: Callable[[Kept], int]  # bytes a kept prefix holds
    reserved: int = 0
    kept: list[Kept] = field(default_factory=list)
    asked: list[Kept] = field(default_factory=list)  # kept prefixes another engine asked this one to give up
    waiting_for_room: bool = False
    evictions: int = 0  # kept prefixes given up to make room, all told

    @property
    def kept_bytes(self) -> int:
        return sum(self.size(kept) for kept in self.kept)

    def take_asked(self) -> list[Kept]:
        """The kept prefixes other engines asked this one to give up (still kept), to be evicted now."""
        with self.shared.lock:
            asked, self.asked = [kept for kept in self.asked if kept in self.kept], []
        return asked


class SharedBudget:
    """``budget`` bytes of keys and values for every engine of a worker (settable: it is measured after start)."""

    def __init__(self, budget: int, idle_seconds: float = 600.0) -> None:
        self.budget = budget
        self.idle_seconds = idle_seconds
        self.lock = new_rlock()  # engine threads are native threads: never gevent's lock
        self.accounts: list[Account] = []
        self.staged = 0  # bytes beside the rows: copies on their way to disk, draft models' rows (engine.sched.drafts)
        self._ticks = itertools.count(1)

    def open(self, name: str, wake: Callable[[], None], size: Callable[[Kept], int]) -> Account:
        """An engine's account (close it when the engine ends)."""
        with self.lock:
            account = Account(self, name, wake, size)
            self.accounts.append(account)
            return account

    def close(self, account: Account) -> None:
        with self.lock:
            if account in self.accounts:
                self.accounts.remove(account)
        self.room_freed()

    def tick(self) -> int:
        """A new time for least-recently-used order, across every engine."""
        with self.lock:
            return next(self._ticks)

    @property
    def reserved(self) -> int:
        with self.lock:
            return sum(account.reserved for account in self.accounts)

    @property
    def kept_bytes(self) -> int:
        with self.lock:
            return sum(account.kept_bytes for account in self.accounts)

    def held(self) -> int:
        """Bytes the books hold: running requests' reservations, kept prefixes, and what is staged beside them."""
        with self.lock:
            return self.reserved + self.kept_bytes + self.staged

    def resize(self, budget: int) -> None:
        """A new budget: kept prefixes beyond a smaller one are asked to leave at once, least recently used first,
        rather than when the next request needs their room. Running requests are never cut short: the budget
        stays at what they hold until they end (the next resize lowers it)."""
        with self.lock:
            self.budget = max(budget, self.reserved)
            over = self.short(0)
            chosen = self.victims(over, lambda kept: False) if over else []
        for owner, kept in chosen:
            self.ask(owner, kept)

    def short(self, extra: int) -> int:
        """Bytes that kept prefixes must give back before ``extra`` more bytes of running requests fit."""
        with self.lock:
            return max(0, self.held() + extra - self.budget)

    def stage(self, nbytes: int) -> bool:
        """Book ``nbytes`` beside the rows (a copy on its way to disk, :mod:`engine.kv.disk`; a draft model's row,
        :mod:`engine.sched.drafts`), if the budget has room beside the running requests and kept prefixes; such
        bytes never make anything else leave."""
        with self.lock:
            if self.held() + nbytes > self.budget:
                return False
            self.staged += nbytes
            return True

    def unstage(self, nbytes: int) -> None:
        """Bytes booked with :meth:`stage` are free again (a copy written or given up, a draft row given back)."""
        with self.lock:
            self.staged -= nbytes
        self.room_freed()

    def victims(self, bytes_needed: int, spare: Callable[[Kept], bool]) -> list[tuple[Account, Kept]]:
        """Kept prefixes of any engine, least recently used first (``spare``: last), that free ``bytes_needed``."""
        with self.lock:
            order = sorted(((account, kept) for account in self.accounts for kept in account.kept
                            if kept not in account.asked), key=lambda item: (spare(item[1]), item[1].used_at))
            chosen, freed = [], 0
            for account, kept in order:
                if freed >= bytes_needed:
                    break
                chosen.append((account, kept))
                freed += account.size(kept)
            return chosen

    def ask(self, owner: Account, kept: Kept) -> None:
        """Ask ``owner``'s engine to give ``kept`` up at its next iteration."""
        with self.lock:
            if kept not in owner.asked:
                owner.asked.append(kept)
        owner.wake()

    def room_freed(self) -> None:
        """Memory was given back: wake the engines that wait for room."""
        with self.lock:
            waiting = [account for account in self.accounts if account.waiting_for_room]
        for account in waiting:
            account.wake()

    def usage(self) -> dict[str, Any]:
        """The books, for metrics: the budget, what is staged beside the rows, and each engine's running and kept
        bytes and evictions."""
        with self.lock:
            return {"budget": self.budget, "staged": self.staged,
                    "engines": {account.name: (account.reserved, account.kept_bytes, account.evictions)
                                for account in self.accounts}}
