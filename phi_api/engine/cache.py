"""Prompt reuse: finished generations kept with their KV cache, for the next turn of a conversation.

A chat client's next request repeats the whole conversation so far plus a
new message. If a kept generator holds a prefix of that prompt, the
scheduler rewinds it to the shared prefix and prefills only the rest.

Exactness by construction: the only numerical guarantee ONNX Runtime gives
on every CPU is that identical shapes and inputs give identical numbers (its
int4 matmul picks kernels by the number of rows, differently on AVX2,
AVX-512 and VNNI machines). A cold prompt is prefilled in chunks of
``chunk`` tokens laid on a fixed grid (``[0, c)``, ``[c, 2c)``, ...). A
reused generator therefore resumes only at a multiple of ``chunk``: every
key and value it keeps came from a full chunk of that same grid, and every
chunk it still computes has the very offset, length and past length the
cold request's chunk has. So a reused prompt gives the cold prompt's logits
bit for bit, on any CPU.

A generator is reusable only by a request with the same search options (they
are fixed when ONNX Runtime GenAI creates it) and only if its KV buffer (also
fixed, ``max_length`` tokens) has room for the new prompt and answer. The
kept generators are bounded by the memory of their KV buffers and evicted
least recently used first. The scheduler's engine threads share one, each
call under a lock (see ``scheduler._SharedCache``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

MIN_REUSED_TOKENS = 16  # below this, reuse saves nothing worth a lookup


@dataclass
class Kept:
    """A finished generation's generator, and the tokens its KV cache holds."""

    generator: Any
    tokens: np.ndarray
    capacity: int
    key: Hashable


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    length = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:length] != b[:length])
    return int(mismatch[0]) if mismatch.size else length


def resume_point(shared: int, prompt_length: int, chunk: int) -> int:
    """Where a kept generator sharing ``shared`` tokens with a prompt may resume: the largest multiple
    of ``chunk`` within the shared prefix that still leaves a prompt token to compute (see above)."""
    return (min(shared, prompt_length - 1) // chunk) * chunk


class PromptCache:
    """Kept generators, at most ``budget_bytes`` of KV buffers in all."""

    def __init__(self, budget_bytes: int, bytes_per_token: int, chunk: int = 1) -> None:
        self._budget = budget_bytes
        self._chunk = max(1, chunk)
        self._bytes_per_token = max(1, bytes_per_token)
        self._kept: OrderedDict[int, Kept] = OrderedDict()
        self._next_id = 0
        self._used = 0

    @property
    def enabled(self) -> bool:
        return self._budget > 0

    @property
    def held_bytes(self) -> int:
        """KV memory the kept generators hold."""
        return self._used

    def take(self, prompt: np.ndarray, needed_capacity: int, key: Hashable) -> tuple[Any, int, int] | None:
        """The kept generator sharing the longest prefix with ``prompt`` and able to hold ``needed_capacity``
        tokens, rewound to that prefix; with how many prompt tokens it already holds, and its capacity."""
        best_id, best_length = None, MIN_REUSED_TOKENS - 1
        for kept_id, kept in self._kept.items():
            if kept.key != key or kept.capacity < needed_capacity:
                continue
            length = resume_point(common_prefix(kept.tokens, prompt), len(prompt), self._chunk)
            if length > best_length:
                best_id, best_length = kept_id, length
        if best_id is None:
            return None
        kept = self._pop(best_id)
        kept.generator.rewind_to(best_length)
        return kept.generator, best_length, kept.capacity

    def put(self, generator: Any, tokens: np.ndarray, capacity: int, key: Hashable) -> bool:
        """Keep ``generator`` (whose KV cache holds ``tokens``); False, and nothing kept, if it cannot fit."""
        size = capacity * self._bytes_per_token
        if size > self._budget:
            return False
        while self._used + size > self._budget:
            self._pop(next(iter(self._kept))).generator.close()
        self._kept[self._next_id] = Kept(generator, tokens, capacity, key)
        self._next_id += 1
        self._used += size
        return True

    def clear(self) -> None:
        """Free every kept generator."""
        while self._kept:
            self._pop(next(iter(self._kept))).generator.close()

    def _pop(self, kept_id: int) -> Kept:
        kept = self._kept.pop(kept_id)
        self._used -= kept.capacity * self._bytes_per_token
        return kept
