"""Batch invariance on the real model: with an even row count, a row's logits are the same bits whatever rows share
its step (their number, tokens and lengths), through the whole graph: the 4-bit matrices, attention, the norms and
the last projection (engine.sched.padding pads odd steps to an even count)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.session import Decoder
from phi_api.engine.runtime.spec import DecoderSpec

ROWS = 8
TARGET = [5, 8, 17, 29, 101, 7, 64, 12, 300, 41, 9, 77]  # the row under test: its prompt, then its next token


def prefill(decoder: Decoder, pool: KVPool, row: int, tokens: np.ndarray) -> None:
    decoder.step(pool, row, tokens[None, :].astype(np.int64), np.array([0]), True)


def test_a_row_s_logits_do_not_depend_on_its_neighbours_in_even_steps(model_path):
    folder = Path(model_path)
    spec = DecoderSpec.read(folder)
    decoder = Decoder(folder / "model.onnx", spec, threads=2)
    pool = KVPool(decoder.spec, ROWS, 256)
    rng = np.random.default_rng(3)
    try:
        prompt, token = np.array(TARGET[:-1]), TARGET[-1]
        lengths = {}
        for row in range(ROWS):  # the target's prompt in rows 0 and 3; the others, prompts of other lengths
            tokens = prompt if row in (0, 3) else rng.integers(10, spec.vocab_size - 10, size=4 + 13 * row)
            prefill(decoder, pool, row, tokens)
            lengths[row] = len(tokens)
        seen = []
        # (first row, row count, the target's index in the step): two to eight rows, the target first or inside.
        for first, count, at in ((0, 2, 0), (0, 4, 0), (0, 8, 0), (2, 2, 1), (2, 6, 1), (0, 6, 3)):
            for _ in range(2):  # the neighbours feed other tokens each time
                ids = rng.integers(10, spec.vocab_size - 10, size=(count, 1))
                ids[at, 0] = token
                past = np.array([lengths[first + index] for index in range(count)])
                logits = decoder.step(pool, first, ids, past, False)
                seen.append(logits[at].copy())
        assert all(np.array_equal(seen[0], logits) for logits in seen[1:])
        assert np.isfinite(seen[0]).all() and seen[0].std() > 0
    finally:
        decoder.unbind()
        pool.close()
