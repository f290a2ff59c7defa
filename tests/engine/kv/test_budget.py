"""One key/value budget for every model of a worker (engine.memory): the engines' batches driven synchronously on
the fake model, booking from one shared budget."""

from __future__ import annotations

import time

import numpy as np

from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.kv.ledger import row_bytes
from phi_api.engine.kv.sequence import Kept
from tests.engine.sched.test_continuous import Bench, bench
from tests.support.fakes import EOS, FakeDecoder, Script

SPEC = FakeDecoder(Script([])).spec


def rows(tokens: int) -> int:
    return row_bytes(SPEC, tokens)


def models(budget: int, *names: str, tokens=(EOS,)) -> tuple[SharedBudget, dict[str, Bench]]:
    """Engines of one worker, each with no cap of its own: the shared budget bounds them all."""
    shared = SharedBudget(budget)
    return shared, {name: bench(tokens, budget=1 << 30, shared=shared, name=name, mode="on") for name in names}


def keep_a_conversation(engine: Bench, first: int, length: int = 30) -> None:
    engine.submit(np.arange(first, first + length) % 60 + 1, max_tokens=1)
    engine.run()


def run_all(engines: dict[str, Bench], limit: int = 1000) -> None:
    """Iterate every engine in turn until all are idle (as their threads would, each woken when asked)."""
    for _ in range(limit):
        if all(engine.batch.idle for engine in engines.values()):
            return
        for engine in engines.values():
            engine.iterate()
    raise AssertionError("the engines never went idle")


def kept_firsts(engine: Bench) -> list[int]:
    return [int(item.tokens[0]) for item in engine.batch.ledger.kept]


def test_a_request_of_one_model_makes_another_model_give_up_its_kept_prefix():
    shared, engines = models(rows(40) * 2, "a", "b")
    keep_a_conversation(engines["a"], 1)
    keep_a_conversation(engines["b"], 31)
    assert kept_firsts(engines["a"]) and kept_firsts(engines["b"])
    engines["b"].submit(np.arange(1, 21), max_tokens=40)  # needs 60 tokens: more than b's own kept prefix frees
    engines["b"].iterate()
    assert engines["b"].batch.waiting and shared.accounts[0].asked  # a was asked; b waits for it
    engines["a"].iterate()  # a's next iteration gives it up
    assert kept_firsts(engines["a"]) == [] and shared.accounts[0].evictions == 1
    engines["b"].iterate()
    assert not engines["b"].batch.waiting and engines["b"].batch.prefilling  # b starts
    engines["b"].run()
    assert shared.reserved == 0


def test_running_requests_are_never_evicted_a_request_waits_until_they_end():
    shared, engines = models(rows(100), "a", "b", tokens=(1, 2, 3))
    engines["a"].submit(np.arange(1, 11), max_tokens=60)  # books 70 tokens' pages
    engines["a"].iterate(3)
    assert engines["a"].batch.rows.running == 1
    engines["b"].submit(np.arange(11, 21), max_tokens=60)
    engines["b"].iterate(2)
    assert engines["b"].batch.waiting and engines["b"].reasons() == []  # waits; not refused, not started
    engines["a"].run()
    assert engines["a"].reasons() == ["length"] and engines["b"].batch.waiting
    run_all(engines)  # a gives its kept prefix up when b asks for the room
    assert engines["b"].reasons() == ["length"]
    assert shared.reserved == 0


def test_kept_prefixes_of_every_model_leave_least_recently_used_first():
    shared, engines = models(rows(40) * 3, "a", "b", "c")
    keep_a_conversation(engines["a"], 1)
    keep_a_conversation(engines["b"], 31)
    keep_a_conversation(engines["c"], 11)
    engines["b"].batch.ledger.touch(engines["b"].batch.ledger.kept[0])  # b's is now the most recently used
    victims = shared.victims(rows(40), spare=lambda kept: False)
    assert [account.name for account, _ in victims] == ["a"]
    victims = shared.victims(rows(40) * 2, spare=lambda kept: False)
    assert [account.name for account, _ in victims] == ["a", "c"]


def test_the_books_add_up_across_engines_and_a_request_over_the_whole_budget_is_refused():
    shared, engines = models(rows(64) * 2, "a", "b", tokens=(1, 2, 3))  # two rows of a page of each head
    engines["a"].submit(np.arange(1, 11), max_tokens=20)
    engines["b"].submit(np.arange(11, 21), max_tokens=20)
    engines["a"].iterate()
    engines["b"].iterate()
    assert shared.reserved == rows(30) * 2 == sum(engine.batch.ledger.reserved for engine in engines.values())
    run_all(engines)
    engines["a"].submit(np.arange(1, 11), max_tokens=200)  # 210 tokens: more than the whole worker's budget
    engines["a"].iterate()
    assert engines["a"].reasons()[-1] == "capacity"


def test_kept_prefixes_unused_for_the_idle_time_give_their_memory_back():
    shared, engines = models(rows(100), "a")
    shared.idle_seconds = 60
    keep_a_conversation(engines["a"], 1)
    [kept] = engines["a"].batch.ledger.kept
    assert isinstance(kept, Kept) and kept.slot is not None
    engines["a"].batch.kv.upkeep(time.monotonic() + 30)
    assert engines["a"].batch.ledger.kept == [kept]
    engines["a"].batch.kv.upkeep(time.monotonic() + 61)
    assert engines["a"].batch.ledger.kept == [] and kept.slot is None
    assert shared.accounts[0].evictions == 1


def test_a_smaller_budget_asks_kept_prefixes_beyond_it_to_leave_at_once_least_recently_used_first():
    shared, engines = models(rows(40) * 3, "a", "b", "c", tokens=(1, 2, 3))
    keep_a_conversation(engines["a"], 1)
    keep_a_conversation(engines["b"], 31)
    engines["c"].submit(np.arange(11, 21), max_tokens=20)
    engines["c"].iterate()
    running = shared.reserved
    assert running == engines["c"].batch.ledger.reserved > 0  # c's request is admitted: its row is booked
    shared.resize(shared.held())  # no smaller than what is held: nothing leaves
    assert not any(account.asked for account in shared.accounts)
    shared.resize(shared.held() - 1)  # a byte short: the least recently used kept prefix (a's) is asked
    assert [account.name for account in shared.accounts if account.asked] == ["a"]
    engines["a"].iterate()
    assert kept_firsts(engines["a"]) == [] and kept_firsts(engines["b"]) == [32]
    assert shared.reserved == running  # a running request is never asked
    shared.resize(0)  # below the running request alone: every kept prefix leaves, the request runs on
    assert shared.budget == running and [account.name for account in shared.accounts if account.asked] == ["b"]
    run_all(engines)
    assert kept_firsts(engines["b"]) == [] and engines["c"].reasons() == ["length"]
