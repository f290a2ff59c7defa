"""The disk tier of prefix reuse on the fake model: keys, reading back, eviction order, bad files, concurrent writers.

A batch is built as the engine loop builds one, with a :class:`PrefixStore` in a temporary folder; "a restart" is a
new batch (a new pool, nothing kept in memory) over the same folder. The fake decoder writes each position's token
into its row's values, so a row read from disk can be told from one computed, or one left empty.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from phi_api.engine.choice import Choice, TextDelta
from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.kv.disk import BlockLayout, PrefixStore, chain, store_key
from phi_api.engine.kv.ledger import Ledger
from phi_api.engine.kv.reuse import ReusePolicy
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.sched.continuous import ContinuousBatch
from phi_api.engine.sched.prefill import ChunkPlanner
from phi_api.engine.sched.stepcost import StepCosts
from tests.engine.sched.test_continuous import PIECES, Bench
from tests.support.fakes import FakeModel, Script
from tests.support.server import wait_until

CHUNK = 4


def store(root: Path, *, identity: str = "fake model", threads: int = 1, max_bytes: int = 1 << 30,
          budget: SharedBudget | None = None, chunk: int = CHUNK) -> PrefixStore:
    spec = FakeModel(Script([1]), PIECES).spec
    shared = budget if budget is not None else SharedBudget(1 << 30)
    return PrefixStore(root, store_key(identity, spec, chunk, threads, "cpu"), BlockLayout(spec, chunk), max_bytes,
                       stage=shared.stage, unstage=shared.unstage)


def disk_bench(root: Path, mode: str = "on", *, budget: int = 1 << 20, chunk: int = CHUNK, **options) -> Bench:
    """A batch over a disk tier in ``root`` (as EngineLoop._new_batch builds one)."""
    script = Script([1, 2, 3])
    model = FakeModel(script, PIECES)
    decoder = model.new_decoder(1)
    shared = SharedBudget(budget)
    ledger = Ledger(decoder.spec, budget, 8, model.info.context_length, shared=shared)
    pool = KVPool(decoder.spec, 17, ledger.row_tokens)
    policy = ReusePolicy(mode, chunk)
    planner = ChunkPlanner(chunk, grid=policy.exact, slice_seconds=0.2, costs=StepCosts(script.clock))
    disk = store(root, budget=shared, chunk=chunk, **options)
    made = Bench(None, script, chunk)  # type: ignore[arg-type]
    made.batch = ContinuousBatch(model, decoder, pool, ledger, policy, planner,
                       lambda choice, finished: made.finished.append((choice, finished)), disk=disk)
    return made


def written(bench: Bench) -> PrefixStore:
    disk = bench.batch.kv.disk
    assert disk is not None
    wait_until(lambda: disk.idle, 10, message="the writer to write what was queued")
    return disk


def files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kv"))


PROMPT = np.arange(1, 43)  # 42 tokens: chunks [0, 4) ... [36, 40) whole, then 2 tokens


@pytest.mark.parametrize("mode", ["on", "exact"])
def test_a_prompt_stored_before_a_restart_is_read_not_computed_and_answers_the_same(tmp_path, mode):
    cold = disk_bench(tmp_path, mode)
    cold.submit(PROMPT, max_tokens=3)
    cold.run()
    assert written(cold).stats.tokens_written == 40 and len(files(tmp_path)) == 10
    warm = disk_bench(tmp_path, mode)  # a new pool: nothing kept in memory
    warm.submit(PROMPT, max_tokens=3)
    warm.iterate()  # read, then the rest computed: it runs
    [leader] = warm.batch.rows.group(0, warm.batch.rows.running)
    row = warm.batch.kv.pool.values[0][leader.slot, 0, :, 0]
    assert list(row[:42]) == list(PROMPT + 1)  # the keys and values of every prompt token: 40 read, 2 computed
    warm.run()
    assert warm.script.chunks == [(40, 2)]  # only the rest was computed
    [(choice, finished)] = warm.finished
    assert finished.cached_tokens == 40 and warm.batch.kv.disk.stats.tokens_read == 40
    assert answer(choice) == answer(cold.finished[0][0]) != "" and finished.reason == cold.finished[0][1].reason


def answer(choice: Choice) -> str:
    return "".join(event.text for event in choice.drain() if isinstance(event, TextDelta))


def test_a_prompt_sharing_only_its_start_reads_the_chunks_it_shares(tmp_path):
    first = disk_bench(tmp_path)
    first.submit(PROMPT, max_tokens=1)
    first.run()
    written(first)
    other = disk_bench(tmp_path)
    other.submit(np.concatenate([PROMPT[:22], [60, 61, 62, 63, 60, 61, 62]]), max_tokens=1)
    other.run()
    assert other.finished[0][1].cached_tokens == 20 and other.script.chunks[0] == (20, 4)


def test_a_prompt_stored_for_one_cache_key_is_not_read_for_another(tmp_path):
    first = disk_bench(tmp_path)
    first.submit(PROMPT, max_tokens=1, cache_key="team-a")
    first.run()
    written(first)
    other = disk_bench(tmp_path)
    other.submit(PROMPT, max_tokens=1, cache_key="team-b")
    other.run()
    assert other.finished[0][1].cached_tokens == 0 and other.batch.kv.disk.stats.tokens_read == 0
    same = disk_bench(tmp_path)
    same.submit(PROMPT, max_tokens=1, cache_key="team-a")
    same.run()
    assert same.finished[0][1].cached_tokens == 40


def test_chunks_are_keyed_by_the_model_the_layout_the_threads_and_the_tokens(tmp_path):
    first = disk_bench(tmp_path)
    first.submit(PROMPT, max_tokens=1)
    first.run()
    written(first)
    for changed in ({"identity": "another graph"}, {"threads": 2}):
        other = disk_bench(tmp_path, **changed)
        other.submit(PROMPT, max_tokens=1)
        other.run()
        assert other.finished[0][1].cached_tokens == 0, changed
    names = chain(PROMPT, CHUNK, "salt", 5)
    assert chain(PROMPT, CHUNK, "salt", 3) == names[:3] and chain(PROMPT, CHUNK, "other salt", 5)[0] != names[0]
    changed_late = PROMPT.copy()
    changed_late[13] = 50
    assert chain(changed_late, CHUNK, "salt", 5)[:3] == names[:3] and chain(changed_late, CHUNK, "salt", 5)[3:] \
        != names[3:]


def test_a_request_asking_for_its_prompts_logprobs_neither_reads_nor_stores(tmp_path):
    b = disk_bench(tmp_path)
    b.submit(PROMPT, max_tokens=1, prompt_logprobs=0)
    b.run()
    assert files(tmp_path) == []


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_truncated_or_corrupt_file_is_not_read_and_is_removed(tmp_path, damage):
    first = disk_bench(tmp_path)
    first.submit(PROMPT, max_tokens=1)
    first.run()
    written(first)
    bad = next(path for path in files(tmp_path) if path.name.startswith("00005-"))
    data = bytearray(bad.read_bytes())
    bad.write_bytes(data[:-7] if damage == "truncate" else data[:-7] + bytes([data[-7] ^ 1]) + data[-6:])
    again = disk_bench(tmp_path)
    again.submit(PROMPT, max_tokens=1)
    again.run()
    assert again.batch.kv.disk.stats.corrupt == 1
    assert again.finished[0][1].cached_tokens == 20  # the chunks before the bad one were read
    assert again.script.chunks[0] == (20, 4)
    written(again)
    assert bad.read_bytes() == data  # removed, and stored again whole once computed


def test_the_least_recently_used_prompts_leave_first_and_their_deepest_chunks_first(tmp_path):
    disk = store(tmp_path, max_bytes=10 * (32 + disk_layout_bytes()))  # ten chunks
    spec = FakeModel(Script([1]), PIECES).spec
    pool = KVPool(spec, 2, 64)
    prompts = [np.arange(start, start + 16) for start in (1, 21, 41)]
    for when, prompt in enumerate(prompts):  # four chunks each, used at times 1, 2, 3
        disk.save(pool, 0, prompt, "short", 0, 4, used_ns=(when + 1) * 10**9)
        wait_until(lambda: disk.idle, 10)
    assert [disk.stored(prompt, "short", 4) for prompt in prompts] == [2, 4, 4]
    assert disk.stats.bytes_on_disk == 10 * (32 + disk_layout_bytes())


def disk_layout_bytes() -> int:
    return BlockLayout(FakeModel(Script([1]), PIECES).spec, CHUNK).nbytes


def test_two_workers_writing_the_same_chunks_at_once_leave_whole_files(tmp_path):
    spec = FakeModel(Script([1]), PIECES).spec
    pool = KVPool(spec, 2, 64)
    pool.values[0][0, 0, :16, 0] = np.arange(1, 17)
    stores = [store(tmp_path) for _ in range(2)]
    prompt = np.arange(1, 17)
    start = threading.Barrier(2)

    def write(disk: PrefixStore) -> None:
        start.wait()
        for _ in range(5):
            disk.save(pool, 0, prompt, "short", 0, 4, used_ns=10**9)

    threads = [threading.Thread(target=write, args=(disk,)) for disk in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for disk in stores:
        wait_until(lambda disk=disk: disk.idle, 10)
    assert len(files(tmp_path)) == 4 and not [p for p in tmp_path.rglob(".tmp-*")]
    reader = KVPool(spec, 2, 64)
    assert stores[0].load(reader, 1, prompt, "short", 4) == (16, 0)
    assert list(reader.values[0][1, 0, :16, 0]) == list(range(1, 17)) and stores[0].stats.corrupt == 0


def test_a_write_that_fails_is_counted_and_the_request_still_answers(tmp_path):
    blocked = tmp_path / "not a folder"
    blocked.write_text("a file where the store's folder would be")
    b = disk_bench(blocked)
    b.submit(PROMPT, max_tokens=2)
    b.run()
    disk = written(b)
    assert b.reasons() == ["length"] and disk.stats.write_failures == 10 and disk.stats.tokens_written == 0
    assert "Error" in disk.stats.last_error


def test_chunks_without_room_in_the_memory_budget_to_stage_are_not_stored(tmp_path):
    spec = FakeModel(Script([1]), PIECES).spec
    pool = KVPool(spec, 2, 64)
    full = SharedBudget(disk_layout_bytes() - 1)  # not even one chunk's copy fits
    disk = store(tmp_path, budget=full)
    assert disk.save(pool, 0, PROMPT, "short", 0, 4, used_ns=10**9) == 0
    wait_until(lambda: disk.idle, 10)
    assert files(tmp_path) == [] and disk.stats.not_staged == 1 and full.staged == 0


def test_staged_copies_are_booked_in_the_shared_budget_until_written(tmp_path):
    shared = SharedBudget(1 << 20)
    gate = threading.Event()
    disk = store(tmp_path, budget=shared)
    original = disk._write

    def held(*args):
        gate.wait(10)
        original(*args)

    disk._write = held  # type: ignore[method-assign]
    spec = FakeModel(Script([1]), PIECES).spec
    disk.save(KVPool(spec, 2, 64), 0, PROMPT, "short", 0, 2, used_ns=10**9)
    assert shared.staged == 2 * disk_layout_bytes() and shared.short(0) == 0
    assert shared.short((1 << 20) - disk_layout_bytes()) == disk_layout_bytes()
    gate.set()
    wait_until(lambda: disk.idle, 10)
    assert shared.staged == 0 and len(files(tmp_path)) == 2


def test_a_request_is_not_affected_by_a_missing_store_folder(tmp_path):
    b = disk_bench(tmp_path / "made on first write")
    b.submit(PROMPT, max_tokens=1)
    b.run()
    written(b)
    assert len(files(tmp_path / "made on first write")) == 10 and os.path.isdir(tmp_path / "made on first write")


def test_each_chunk_says_whether_it_was_computed_as_a_cold_prompt_s(tmp_path):
    """In ``on`` mode a prompt prefilled in time slices is stored too; only its leading exact chunks count as
    exact when read."""
    spec = FakeModel(Script([1]), PIECES).spec
    pool = KVPool(spec, 2, 64)
    disk = store(tmp_path)
    prompt = np.arange(1, 17)
    assert disk.save(pool, 0, prompt, "short", 0, 4, used_ns=10**9, exact_end=2) == 4
    wait_until(lambda: disk.idle, 10)
    assert disk.load(KVPool(spec, 2, 64), 1, prompt, "short", 4) == (16, 8)


def test_the_reuse_mode_is_part_of_the_key():
    spec = FakeModel(Script([1]), PIECES).spec
    assert store_key("m", spec, 4, 1, "cpu", "on") != store_key("m", spec, 4, 1, "cpu", "exact")


def test_in_on_mode_a_prompt_prefilled_in_time_slices_is_stored_and_read_as_not_exact(tmp_path):
    cold = disk_bench(tmp_path, "on", chunk=16)
    cold.script.step_seconds, cold.script.token_seconds = 0.1, 0.01  # a 0.2 s slice holds 10 prompt tokens
    cold.submit(np.arange(1, 21) % 60 + 1, max_tokens=2)  # the batch learns its step costs
    cold.run()
    [running] = cold.submit(np.arange(5, 9), max_tokens=60)  # keeps the batch crowded: prompts go in slices
    cold.submit(PROMPT, max_tokens=1)
    cold.iterate(12)
    running.cancel()
    cold.run()
    assert (16, 10) in cold.script.chunks  # its second chunk was a slice of 10, off the grid of 16
    assert written(cold).stats.tokens_written == 16 + 32  # the first request's chunk, and this prompt's two
    warm = disk_bench(tmp_path, "on", chunk=16)
    warm.submit(PROMPT, max_tokens=3)
    warm.iterate()
    [leader] = warm.batch.rows.group(0, warm.batch.rows.running)
    assert leader.cached == 32 and leader.exact_upto == 16  # the first chunk exact, the second not
