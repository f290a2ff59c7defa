"""The key/value memory of one decoder session: reserved once, paid for by the page as rows fill it.

Per layer there is one key and one value buffer, ``[rows, kv_heads, tokens,
width]`` (``DecoderSpec.kv_token_width``: the head size, or int4's bytes),
each a reservation of anonymous memory made once, when the engine starts: no
swap is reserved for it (``MAP_NORESERVE``) and none of it exists until
written. A row holding ``n`` tokens therefore costs, in every
layer and head, only the pages its ``n`` tokens touch, whatever the longest
row: no row pays for another's length, and nothing is ever copied to grow.
Huge pages are refused for the reservation (``MADV_NOHUGEPAGE``): with
transparent huge pages set to ``always``, writing one token of a head would
make 2 MB of it resident. When a row is released, or cut to fewer tokens,
its pages go back to the system (``MADV_DONTNEED``); a released row reads as
zeros again.

The graph binds rows ``[first, first + count)`` of every buffer as both its
past and present keys and values (see :mod:`engine.runtime`): the rows a
step advances must be contiguous, and their place never changes, so the
bindings made once stay valid for the life of the pool.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.errors import PoolError

PAGE = mmap.PAGESIZE
_MAP_NORESERVE = 0x4000  # linux/mman.h (Python 3.11's mmap module does not name it)
TOKEN_GRANULE = 256  # the buffers' length is a multiple of this many tokens


class KVPool:
    """``rows`` rows of up to ``tokens`` tokens of keys and values for a decoder of ``spec``'s layout."""

    def __init__(self, spec: DecoderSpec, rows: int, tokens: int) -> None:
        self.spec = spec
        self.rows = rows
        self.itemsize = np.dtype(spec.kv_dtype).itemsize
        self._token_bytes = spec.kv_head_token_bytes  # one token of one head
        # Each head's run of tokens starts on a page, so that a head's tail can be given back on its own.
        granule = math.lcm(TOKEN_GRANULE, PAGE // math.gcd(PAGE, self._token_bytes))
        self.tokens = -(-max(1, tokens, spec.window) // granule) * granule
        self._head_bytes = self.tokens * self._token_bytes
        self.row_span = spec.kv_heads * self._head_bytes  # one row of one buffer
        self._maps: list[mmap.mmap] = []
        try:
            self.keys = [self._reserve() for _ in range(spec.layers)]
            self.values = [self._reserve() for _ in range(spec.layers)]
        except (OSError, ValueError) as exc:
            self.close()
            raise PoolError(f"cannot reserve {rows} rows of {self.tokens} tokens of keys and values "
                            f"({self.reserved_bytes / 2**30:.1f} GiB of address space): {exc}") from exc

    @property
    def reserved_bytes(self) -> int:
        """Address space the pool reserves (none of it is memory until written)."""
        return 2 * self.spec.layers * self.rows * self.row_span

    def copy(self, source: int, target: int, length: int) -> None:
        """Copy row ``source``'s first ``length`` tokens over row ``target``'s (and whatever else shares their last
        granule: tokens past a row's length are never read)."""
        if source == target or length <= 0:
            return
        length = self._whole(length)
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[target, :, :length] = buffer[source, :, :length]

    def release(self, row: int, keep: int = 0) -> None:
        """Give back the pages of ``row`` past its first ``keep`` tokens (they read as zeros afterwards)."""
        keep_bytes = -(-self._whole(keep) * self._token_bytes // PAGE) * PAGE if keep > 0 else 0
        if keep_bytes >= self._head_bytes:
            return
        start = row * self.row_span
        for area in self._maps:
            if keep_bytes == 0:  # the whole row at once
                area.madvise(mmap.MADV_DONTNEED, start, self.row_span)
                continue
            for head in range(self.spec.kv_heads):
                offset = start + head * self._head_bytes + keep_bytes
                area.madvise(mmap.MADV_DONTNEED, offset, self._head_bytes - keep_bytes)

    def _whole(self, tokens: int) -> int:
        """``tokens`` rounded up to the layout's granule (whole tiles of the attention operator's layout)."""
        granule = self.spec.kv_granule
        return -(-tokens // granule) * granule

    def close(self) -> None:
        """Unmap the reservations (the buffers must no longer be bound or used)."""
        self.keys, self.values = [], []
        maps, self._maps = self._maps, []
        for area in maps:
            try:
                area.close()
            except BufferError:  # a view is still alive: the mapping goes when it does
                pass

    def _reserve(self) -> np.ndarray:
        size = self.rows * self.row_span
        area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        self._maps.append(area)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            area.madvise(mmap.MADV_NOHUGEPAGE)
        shape = (self.rows, self.spec.kv_heads, self.tokens, self.spec.kv_token_width)
        return np.frombuffer(area, dtype=self.spec.kv_dtype, count=size // self.itemsize).reshape(shape)
