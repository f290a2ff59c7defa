"""The key/value pool: memory only for the tokens written, given back on release, no huge pages."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine.kv.ledger import row_bytes
from phi_api.engine.runtime.pool import PAGE, KVPool
from phi_api.engine.runtime.spec import DecoderSpec

SPEC = DecoderSpec(layers=2, kv_heads=4, head_size=64, vocab_size=8)  # 256 bytes a token and head


def resident(array: np.ndarray) -> int:
    """Bytes of the mapping behind ``array`` that are in memory (from /proc/self/smaps)."""
    address = array.ctypes.data
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                low, high = (int(part, 16) for part in fields[0].split("-"))
                inside = low <= address < high
            elif inside and fields[0] == "Rss:":
                return int(fields[1]) * 1024
    raise AssertionError("no mapping holds the array")


@pytest.fixture
def pool():
    made = KVPool(SPEC, rows=8, tokens=4096)
    yield made
    made.close()


def test_a_reservation_costs_nothing_until_written(pool):
    assert pool.reserved_bytes >= 2 * 2 * 8 * 4 * 4096 * 256
    assert resident(pool.keys[0]) == 0


def test_a_row_costs_the_pages_of_its_own_tokens_whatever_the_longest_row(pool):
    pool.keys[0][3, :, :100] = 1.0  # 100 tokens: 25,600 bytes a head, 7 pages
    assert resident(pool.keys[0]) == 4 * 7 * PAGE  # not huge pages, not the row's whole length
    assert row_bytes(SPEC, 100) == 2 * 2 * 4 * 7 * PAGE  # what the budget books: every layer's keys and values


def test_release_gives_pages_back_and_keeps_what_is_asked(pool):
    pool.keys[0][2, :, :1000] = 2.0
    pool.release(2, keep=100)
    assert resident(pool.keys[0]) == 4 * 7 * PAGE
    assert (pool.keys[0][2, :, :100] == 2.0).all() and (pool.keys[0][2, :, 112:1000] == 0).all()
    pool.release(2)
    assert resident(pool.keys[0]) == 0


def test_copy_moves_a_prefix_between_rows(pool):
    pool.values[1][0, :, :50] = np.arange(50, dtype=np.float32)[None, :, None]
    pool.copy(0, 5, 30)
    assert (pool.values[1][5, :, :30] == pool.values[1][0, :, :30]).all()
    assert (pool.values[1][5, :, 30:50] == 0).all()


def test_a_model_with_sliding_window_layers_gets_buffers_of_at_least_a_window():
    windowed = DecoderSpec(layers=1, kv_heads=1, head_size=64, vocab_size=8, window=1000)
    short, plain = KVPool(windowed, rows=1, tokens=16), KVPool(SPEC, rows=1, tokens=16)
    try:
        assert short.tokens >= 1000 and short.keys[0].shape[2] == short.tokens
        assert plain.tokens < 1000
    finally:
        short.close()
        plain.close()


def test_in_the_attention_operator_s_layout_rows_are_copied_and_kept_in_whole_tiles_of_16_tokens():
    """A token's bytes are spread over its tile of 16 (engine/kernels/attention_kernel.h): a prefix is copied and
    kept tile by tile, so that none of its tokens loses a byte."""
    tiled = KVPool(DecoderSpec(layers=1, kv_heads=2, head_size=96, vocab_size=8, kv_dtype=np.int8,
                               kv_layout="tiles16"), rows=2, tokens=4096)
    try:
        tiled.keys[0][0, :, :64] = 7
        tiled.copy(0, 1, 20)  # tokens 0..19: the bytes of tiles 0 and 1
        assert (tiled.keys[0][1, :, :32] == 7).all() and (tiled.keys[0][1, :, 32:64] == 0).all()
        tiled.keys[0][1] = 3
        tiled.release(1, keep=40)  # tile 2 (tokens 32..47) ends 512 bytes into the second page: that page stays
        assert (tiled.keys[0][1, :, :48] == 3).all()
        assert (tiled.keys[0][1, :, 8192 // 96 + 1:] == 0).all()  # past it, pages went back
    finally:
        tiled.close()
