"""Prompt reuse: finished prompts' keys and values, kept for the next turn of a conversation.

A chat client's next request repeats the whole conversation so far plus a
new message. When a kept prompt shares a prefix with the new one, the
engine copies that prefix's keys and values into the new sequence's row and
prefills only the rest. Only prompts are kept, not answers: keys and values
computed one token at a time while decoding differ in the last bits from
those a prefill computes, so re-prefilling the answer keeps a reused
conversation exactly as a cold one.

Exactness by construction: the only numerical guarantee ONNX Runtime gives
on every CPU is that identical shapes and inputs give identical numbers (its
int4 matmul picks kernels by the number of rows, differently on AVX2,
AVX-512 and VNNI machines). A cold prompt is prefilled in chunks of
``chunk`` tokens laid on a fixed grid (``[0, c)``, ``[c, 2c)``, ...). So a
prefix is kept, and resumed, only up to a multiple of ``chunk``: every key
and value it holds came from a full chunk of that same grid, and every chunk
the new request still computes has the very offset, length and past length
the cold request's chunk has. A reused prompt therefore gives the cold
prompt's logits bit for bit, on any CPU.

Entries are bounded by their memory and evicted least recently used first.
Only the engine thread touches this object.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable

import numpy as np

MIN_REUSED_TOKENS = 16  # below this, reuse saves nothing worth a copy


@dataclass
class Kept:
    """A prompt prefix's tokens and its keys and values (``[layers, 2, kv_heads, tokens, head_size]``)."""

    tokens: np.ndarray
    kv: np.ndarray
    regime: Hashable  # what the values were computed under (LongRoPE's short or long factors)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    length = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:length] != b[:length])
    return int(mismatch[0]) if mismatch.size else length


def resume_point(shared: int, prompt_length: int, chunk: int) -> int:
    """Where a sequence sharing ``shared`` tokens with a kept prefix may resume: the largest multiple of
    ``chunk`` within the shared prefix that still leaves a prompt token to compute (see above)."""
    return (min(shared, prompt_length - 1) // chunk) * chunk


class PromptCache:
    """Kept prompt prefixes, at most ``budget_bytes`` of keys and values in all."""

    def __init__(self, budget_bytes: int, chunk: int = 1) -> None:
        self._budget = budget_bytes
        self._chunk = max(1, chunk)
        self._kept: OrderedDict[int, Kept] = OrderedDict()
        self._next_id = 0
        self._used = 0

    @property
    def enabled(self) -> bool:
        return self._budget > 0

    @property
    def held_bytes(self) -> int:
        """Memory the kept prefixes hold."""
        return self._used

    def keepable(self, prompt_length: int, floor: int = 0) -> int:
        """How much of a prompt of ``prompt_length`` tokens is worth keeping: its whole chunks (0: none).
        ``floor``: the first grid point a resume may use (LongRoPE's first long chunk)."""
        length = (prompt_length // self._chunk) * self._chunk
        return length if length >= max(MIN_REUSED_TOKENS, floor) and self.enabled else 0

    def take(self, prompt: np.ndarray, regime: Hashable, floor: int = 0) -> tuple[int, np.ndarray | None]:
        """The longest kept prefix of ``prompt`` computed under ``regime``, cut to a resume point at or past
        ``floor``: (its length, its keys and values); (0, None) when none serves."""
        best, best_length = None, max(MIN_REUSED_TOKENS, floor) - 1
        for kept_id, kept in self._kept.items():
            if kept.regime != regime:
                continue
            length = resume_point(common_prefix(kept.tokens, prompt), len(prompt), self._chunk)
            if length > best_length:
                best, best_length = kept_id, length
        if best is None:
            return 0, None
        self._kept.move_to_end(best)
        return best_length, self._kept[best].kv[:, :, :, :best_length]

    def put(self, tokens: np.ndarray, kv: np.ndarray, regime: Hashable) -> bool:
        """Keep ``kv`` (the keys and values of ``tokens``); False, and nothing kept, if it cannot fit.

        A prefix of an entry already kept replaces nothing; a kept entry that
        is a prefix of the new one is dropped (the new one serves it too).
        """
        size = kv.nbytes
        if size > self._budget:
            return False
        for kept_id, kept in list(self._kept.items()):
            if kept.regime != regime:
                continue
            shared = common_prefix(kept.tokens, tokens)
            if shared == len(tokens) and len(kept.tokens) >= len(tokens):
                self._kept.move_to_end(kept_id)
                return True
            if shared == len(kept.tokens):
                self._pop(kept_id)
        while self._used + size > self._budget:
            self._pop(next(iter(self._kept)))
        self._kept[self._next_id] = Kept(tokens, kv, regime)
        self._next_id += 1
        self._used += size
        return True

    def clear(self) -> None:
        """Forget every kept prefix."""
        self._kept.clear()
        self._used = 0

    def _pop(self, kept_id: int) -> Kept:
        kept = self._kept.pop(kept_id)
        self._used -= kept.kv.nbytes
        return kept
