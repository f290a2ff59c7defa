"""How an encoder thread cuts the inputs waiting into session calls: soonest request first (priority, then arrival),
each request's inputs by length so that a call pads little, as many rows as fit ``max_rows`` and ``max_tokens``
(rows times the longest: the padded batch's size, which bounds a call's memory and time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from phi_api.engine.encoder.tokens import Tokens


@dataclass(frozen=True)
class Pending:
    """One input waiting: its request (``job``), its place in the request's answer, its tokens."""

    job: Any
    index: int
    tokens: Tokens
    priority: int
    arrival: int

    def order(self) -> tuple[int, int, int, int]:
        return self.priority, self.arrival, len(self.tokens), self.index


def next_batch(pending: list[Pending], max_rows: int, max_tokens: int) -> list[Pending]:
    """The inputs of the next session call (at least one, if any waits, however long)."""
    batch: list[Pending] = []
    longest = 0
    for item in sorted(pending, key=Pending.order):
        wider = max(longest, len(item.tokens))
        if batch and (len(batch) + 1 > max_rows or (len(batch) + 1) * wider > max_tokens):
            break
        batch.append(item)
        longest = wider
    return batch


def padded(batch: list[Pending], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's token ids, attention mask and token types, each ``[rows, longest]`` (int64), padded at the end."""
    longest = max(len(item.tokens) for item in batch)
    ids = np.full((len(batch), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), longest), dtype=np.int64)
    types = np.zeros((len(batch), longest), dtype=np.int64)
    for row, item in enumerate(batch):
        length = len(item.tokens)
        ids[row, :length] = item.tokens.ids
        mask[row, :length] = 1
        if item.tokens.types is not None:
            types[row, :length] = item.tokens.types
    return ids, mask, types
