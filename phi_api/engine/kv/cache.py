"""The key/value memory manager of one engine: rows of the pool, the budget's books, and kept prefixes.

The batch (:mod:`engine.sched.continuous`) decides what runs and runs it; this module
says where a request's keys and values come from and whether they fit:

- which row gives a new prompt the longest reusable prefix
  (:mod:`engine.kv.reuse` says what may be reused);
- whether a request fits the budget (:mod:`engine.kv.ledger`), and which kept
  prefixes leave, least recently used first, to make it fit: running
  sequences are never evicted;
- which finished rows are kept for later requests, and which kept rows they
  replace;
- with a disk tier (:mod:`engine.kv.disk`): which prompts start from
  chunks stored on disk, and which computed chunks are stored.

Everything here runs on the engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from phi_api.engine.kv.disk import PrefixStore
from phi_api.engine.kv.ledger import Ledger
from phi_api.engine.kv.reuse import MIN_REUSED_TOKENS, Occupant, ReusePolicy
from phi_api.engine.kv.rows import RowTable
from phi_api.engine.kv.sequence import Kept, Request, Sequence, row_of
from phi_api.engine.runtime.pool import KVPool
from phi_api.errors import RowsFull


@dataclass(frozen=True)
class OnDisk:
    """A prompt's first ``tokens`` tokens, stored on disk: a source a request starts from by reading it."""

    tokens: int


def disk_scope(holder: Request | Sequence) -> str:
    """What a prompt's chunks on disk are filed under besides their tokens: the LongRoPE regime, and the cache key
    when there is one (none: the names files had before keys were part of them)."""
    return f"{holder.regime};key={holder.cache_key}" if holder.cache_key else holder.regime


class KVCache:
    """The pool's rows, the budget they are booked in, what the reuse mode keeps of finished rows, and the disk tier
    under them (``disk``; None: none)."""

    def __init__(self, pool: KVPool, ledger: Ledger, policy: ReusePolicy, disk: PrefixStore | None = None) -> None:
        self.rows = RowTable(pool)
        self.pool = pool
        self.ledger = ledger
        self.policy = policy
        self.disk = disk if policy.enabled else None

    # Where a prompt starts ---------------------------------------------------------------------------

    def source(self, request: Request, better_than: int = 0, exclude: Occupant | None = None
               ) -> tuple[Occupant | None, int]:
        """The row giving ``request``'s prompt its longest reusable prefix, and where it would resume; (None, 0)
        when none gives more than ``better_than`` tokens (a prompt whose own tokens' log-probabilities are asked
        for reuses nothing)."""
        if request.prompt_logprobs is not None:
            return None, 0
        rows = (row for row in self.rows.occupants() if row is not exclude)
        return self.policy.best_source(request.prompt, request.regime, request.first_chunk, rows, better_than,
                                       request.cache_key)

    def stored(self, request: Request, better_than: int) -> int:
        """Where ``request`` would resume from the chunks of its prompt stored on disk; 0 unless more than
        ``better_than`` tokens."""
        disk, prompt = self.disk, request.prompt
        if disk is None or request.prompt_logprobs is not None or len(prompt) - 1 < max(better_than + 1, disk.block):
            return 0
        count = disk.stored(prompt, disk_scope(request), (len(prompt) - 1) // disk.block)
        point = self.policy.resume_point(count * disk.block, len(prompt), request.first_chunk, count * disk.block)
        return point if point > better_than else 0

    def start_from(self, leader: Sequence, source: Occupant | OnDisk | None, point: int) -> int:
        """Give a starting request's ``leader`` a row holding ``source``'s first ``point`` tokens (a kept row is
        taken over as it is, another is copied, chunks on disk are read); returns the tokens it starts with (0:
        none)."""
        if isinstance(source, OnDisk):
            return self._read(leader, point)
        if source is not None and source.slot is None:
            source = None  # evicted to make room after all
        if isinstance(source, Kept):
            self.ledger.forget(source)
            self.rows.take(source, leader, point)  # its row as it is: no copy
        else:
            self.rows.place(leader, self.rows.entry_slot())
            if source is not None:
                self.pool.copy(row_of(source), row_of(leader), point)
        if source is None:
            leader.resume(0, 0, self.policy)
            return 0
        leader.resume(point, point if point <= source.exact_upto else 0, self.policy)
        return point

    def _read(self, leader: Sequence, point: int) -> int:
        """Start ``leader`` from its prompt's first ``point`` tokens stored on disk, or from as many as could be
        read (a file missing or bad: the rest is computed)."""
        assert self.disk is not None
        self.rows.place(leader, self.rows.entry_slot())
        prompt = leader.choice.prompt
        read, exact = self.disk.load(self.pool, row_of(leader), prompt, disk_scope(leader), point // self.disk.block)
        floor = point if leader.long else 0  # LongRoPE: a long prompt's first chunk is never split, so all or nothing
        start = self.policy.resume_point(read, len(prompt), floor, exact) if read else 0
        if start < read:
            self.pool.release(row_of(leader), start)
        leader.resume(start, min(start, exact), self.policy)
        return start

    def store(self, request: Request) -> None:
        """Store the chunks of ``request``'s prompt its leader's row now holds (in ``exact`` mode, those computed as a
        cold prompt alone computes them), and that are not stored yet (the disk tier's writer writes them off this
        thread); those it has no room to stage now are tried again after the next chunk."""
        disk, leader = self.disk, request.leader
        if disk is None or request.prompt_logprobs is not None:
            return
        exact_end = leader.exact_upto // disk.block
        end = exact_end if self.policy.exact else leader.length // disk.block  # what reuse from memory would take
        if end > request.stored_chunks:
            request.stored_chunks = disk.save(self.pool, row_of(leader), request.prompt, disk_scope(request),
                                              request.stored_chunks, end, request.arrived_ns, exact_end)

    def catch_up(self, request: Request) -> None:
        """Copy a longer prefix than ``request``'s leader has, if a row now holds one."""
        leader = request.leader
        source, point = self.source(request, better_than=request.prefilled, exclude=leader)
        if source is None:
            return
        if isinstance(source, Kept):
            self.ledger.touch(source)
        self.pool.copy(row_of(source), row_of(leader), point)
        leader.resume(point, point if point <= source.exact_upto else 0, self.policy)
        request.prefilled = point

    # Room ------------------------------------------------------------------------------------------

    def make_room(self, request: Request, source: Occupant | OnDisk | None, promised: int = 0) -> bool:
        """Give up kept prefixes (the request's own source last) until ``request`` fits this engine's cap and the
        worker's budget; whether it does now. Kept prefixes of other engines, least recently used first, are asked
        for (:mod:`engine.kv.budget`): their engines give them up at their next iteration, and wake this one. Call it
        with the shared budget's lock held until the request is booked. ``promised``: free rows already promised to
        the other choices of requests still prefilling (they take them when their prompt is in); the request's own
        choices need rows beyond those."""
        ledger, rows, reserve = self.ledger, len(request.choices), request.reserve
        account = ledger.account
        assert account is not None
        if not ledger.could_fit(rows, reserve):
            account.waiting_for_room = True
            return False
        short_bytes, short_rows = ledger.room_short(rows, reserve, self.rows.free - promised)
        if short_bytes or short_rows:
            for kept in ledger.evictions(short_bytes, short_rows, spare=lambda kept: kept is source):
                self.evict(kept)
        shared_short = ledger.shared_short(rows, reserve)
        for owner, kept in ledger.shared.victims(shared_short, spare=lambda kept: kept is source) \
                if shared_short else []:
            if owner is account:
                self.evict(kept)
            else:
                ledger.shared.ask(owner, kept)
        fits = (ledger.room_short(rows, reserve, self.rows.free - promised) == (0, 0)
                and not ledger.shared_short(rows, reserve))
        account.waiting_for_room = not fits
        return fits

    def evict(self, kept: Kept) -> None:
        """Give a kept prefix up: its row's pages go back to the system, and engines waiting for room look again."""
        self.ledger.forget(kept)
        self.rows.remove(kept)
        if self.ledger.account is not None:
            self.ledger.account.evictions += 1
        self.ledger.shared.room_freed()

    def upkeep(self, now: float) -> None:
        """Give up the kept prefixes other engines asked for, and those unused for too long."""
        account = self.ledger.account
        for kept in [*(account.take_asked() if account is not None else []), *self.ledger.idle_kept(now)]:
            if kept.slot is not None and kept in self.ledger.kept:
                self.evict(kept)

    def evict_all(self) -> None:
        for kept in list(self.ledger.kept):
            self.evict(kept)

    # Finished rows ---------------------------------------------------------------------------------

    def release(self, row: Sequence, keep: bool) -> None:
        """A sequence has ended: its booking goes back, and its row is kept for reuse (when ``keep`` and worth
        it) or freed."""
        self.ledger.give_back(row.booked)
        if not keep or not self._keep(row):
            self.rows.remove(row)

    def _keep(self, row: Sequence) -> bool:
        """Keep a finished row's reusable prefix for later requests; False when it is not worth a row."""
        if row.reusable < MIN_REUSED_TOKENS or row.slot is None:
            return False
        prefix = row.prefix()
        same = [kept for kept in self.ledger.kept if kept.cache_key == row.cache_key]  # another key's serve not it
        if any(self.policy.covers(prefix, kept.prefix()) for kept in same):
            return False  # another kept row already serves whatever this one would
        for kept in [kept for kept in same if self.policy.covers(kept.prefix(), prefix)]:
            self.evict(kept)  # this one serves what they did
        if row.slot < self.rows.running and not self._leave_running(row):
            return False
        kept = Kept(prefix, row.regime, row_of(row), self.ledger.tick(), row.exact_upto, row.cache_key)
        self.rows.take(row, kept, len(prefix))
        self.ledger.keep(kept)
        over, _ = self.ledger.room_short(0, 0, self.rows.free)
        for old in self.ledger.evictions(over, 0, spare=lambda candidate: candidate is kept) if over else []:
            self.evict(old)
        return True

    def _leave_running(self, row: Sequence) -> bool:
        """Take a finished running row out of the running ones (in place, else to a free or evicted row); or False."""
        if self.rows.stays_on_leaving(row):
            self.rows.leave_running(row, None)
            return True
        try:
            target = self.rows.free_slot(self.rows.running)
        except RowsFull:
            oldest = self.ledger.evictions(0, 1, spare=lambda _: False)
            if not oldest:
                return False
            self.evict(oldest[0])
            target = self.rows.free_slot(self.rows.running)
        self.rows.leave_running(row, target)
        return True

    # Invariants ------------------------------------------------------------------------------------

    def check(self, active: list[Sequence]) -> None:
        """Raise AssertionError unless the rows' layout and the budget's books hold, ``active`` being every running
        or prefilling sequence."""
        self.rows.check()
        assert self.ledger.active_rows == len(active), (self.ledger.active_rows, len(active))
        assert self.ledger.reserved == sum(sequence.booked for sequence in active)
        assert self.ledger.reserved <= self.ledger.budget
        kept = [item for item in self.rows.occupants() if isinstance(item, Kept)]
        assert sorted(map(id, kept)) == sorted(map(id, self.ledger.kept)), "a kept prefix without its row"
