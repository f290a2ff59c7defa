"""Prefix reuse: which rows' keys and values a new request may start from, by the server's ``PREFIX_CACHE`` mode.

A chat client's next request repeats the whole conversation so far plus a
new message; many users share a system prompt. Any row of the pool whose
tokens begin like a new prompt (a kept prefix of a finished request, or a
request still running or prefilling) can give the new request that prefix:
its keys and values are copied (or, from a kept prefix, taken over as they
are) and only the rest of the prompt is computed.

- ``on`` (the default, as vLLM, llama.cpp's server and Ollama do): prompts
  and answers are reused. The answer's keys and values were computed one
  token at a time while decoding, and differ in the last bits from those a
  prefill computes; a reused conversation may therefore answer slightly
  otherwise than a cold one (log-probabilities differ in the last digits; a
  greedy near-tie may flip). Reuse that stays within what was computed as a
  cold prompt alone is computed (``exact_upto``: chunks on the grid) resumes
  on the grid, as ``exact`` does: the same request sent twice gets the same
  answer. On a graph that computes each token on its own (``row_wise``: phi-api's operators, where the CPU runs
  them), a prompt's tokens are the same bits however its chunks are cut, and a prefilled token's keys and values
  those a decode step writes: a request resumes wherever its prefix ends, off the grid too (the grid there would
  only compute up to a chunk of tokens again, and a whole step of the model for the few before the grid's line).
- ``exact``: a reused prompt answers bit for bit as a cold one, on any CPU.
  The only numerical promise ONNX Runtime keeps on every CPU is that
  identical shapes and inputs give identical numbers (its int4 matmul picks
  kernels by row count, differently on AVX2, AVX-512 and AMX machines). So
  prompts are prefilled in chunks on a fixed grid (``[0, c)``, ``[c, 2c)``,
  ...), only prompt tokens are reused, and a request resumes only at a
  multiple of ``c``: every key it reuses came from a full chunk of that same
  grid, and every chunk it still computes has the offset, length and past
  length of the cold request's chunk.
- ``off``: nothing is reused or kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np


class Occupant(Protocol):
    """Anything that holds a row: its place, how many tokens its row holds, and which of them can be reused."""

    slot: int | None
    length: int
    reusable: int
    exact_upto: int  # leading tokens computed exactly as a cold prompt alone is (prefill chunks on the grid)
    cache_key: str  # only a request of the same cache key may reuse its keys and values

    @property
    def regime(self) -> str: ...

    def prefix(self) -> np.ndarray: ...


MODES = ("on", "exact", "off")
MIN_REUSED_TOKENS = 16  # below this, reuse saves nothing worth a copy


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    length = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:length] != b[:length])
    return int(mismatch[0]) if mismatch.size else length


class ReusePolicy:
    """What the mode allows: which tokens of a row are reusable, and where a request may resume."""

    def __init__(self, mode: str, chunk: int, row_wise: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"PREFIX_CACHE must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.chunk = max(1, chunk)
        self.row_wise = row_wise

    @property
    def free_cuts(self) -> bool:
        """Whether a prompt may be cut anywhere, into chunks and where it resumes: the graph computes each token on
        its own (``row_wise``), so every cut gives the same bits. ``exact`` mode keeps its grid: its promise holds on
        every CPU, whatever graph serves there."""
        return self.row_wise and not self.exact

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def exact(self) -> bool:
        return self.mode == "exact"

    def prompt_reusable(self, prefilled: int, exact_upto: int) -> int:
        """Reusable tokens of a row whose first ``prefilled`` prompt tokens are in, ``exact_upto`` of them computed
        as a cold prompt alone is (``exact`` mode reuses only those)."""
        if not self.enabled:
            return 0
        return exact_upto if self.exact else prefilled

    def exact_after(self, exact_upto: int, start: int, end: int, prompt_length: int) -> int:
        """How much of a row is computed as a cold prompt alone is, after a prefill chunk ``[start, end)``: chunks on
        the grid (ending on it, or at the prompt's end) extend it."""
        on_grid = start == exact_upto and start % self.chunk == 0
        if on_grid and (end % self.chunk == 0 or end == prompt_length):
            return end
        return exact_upto

    def decoded_reusable(self, length: int, exact_upto: int) -> int:
        """Reusable tokens of a running row holding ``length`` tokens, ``exact_upto`` of them computed as a cold
        prompt is: all of them, or in ``exact`` mode only those (answers are computed otherwise than a prefill)."""
        if not self.enabled:
            return 0
        return min(length, exact_upto) if self.exact else length

    def resume_point(self, shared: int, prompt_length: int, floor: int = 0, exact_upto: int | None = None) -> int:
        """Where a request sharing ``shared`` tokens with a source may resume (0: nowhere worth it): a token of the
        prompt must be left to compute; within the source's exactly computed part (``exact_upto``; all of it when
        not given), and always in ``exact`` mode, only on the grid (unless cuts are free: :attr:`free_cuts`);
        LongRoPE's first long chunk (``floor``) is never split."""
        point = min(shared, prompt_length - 1)
        if self.exact or (not self.free_cuts and (exact_upto is None or point <= exact_upto)):
            point = point // self.chunk * self.chunk
        return point if point >= max(MIN_REUSED_TOKENS, floor) else 0

    def best_source(self, prompt: np.ndarray, regime: str, floor: int, rows: Iterable[Occupant],
                    better_than: int = 0, cache_key: str = "") -> tuple[Occupant | None, int]:
        """The row of ``cache_key`` giving ``prompt`` the longest usable prefix computed under ``regime``, and where
        the request would resume with it; (None, 0) when no row gives more than ``better_than`` tokens."""
        best, best_point = None, better_than
        if not self.enabled:
            return None, 0
        for row in rows:
            if row.regime != regime or row.cache_key != cache_key or row.reusable <= best_point:
                continue
            point = self.resume_point(common_prefix(row.prefix(), prompt), len(prompt), floor, row.exact_upto)
            if point > best_point:
                best, best_point = row, point
        return (best, best_point) if best is not None else (None, 0)

    def covers(self, kept: np.ndarray, other: np.ndarray) -> bool:
        """Whether ``other`` (a kept prefix) already serves whatever ``kept`` would: ``kept`` is a prefix of it."""
        return len(kept) <= len(other) and common_prefix(kept, other) == len(kept)
