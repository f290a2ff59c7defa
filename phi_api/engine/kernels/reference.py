"""MatMulNBits' 4-bit weights repacked for :mod:`.native`'s kernel, and the kernel's product in numpy.

MatMulNBits (4 bits, blocks of 128, no zero points: the implicit zero point is 8) stores ``B`` as
``[N, K / 128, 64]`` bytes, byte ``i`` of a block holding ``K = 2i`` in its low nibble and ``2i + 1`` in its high
one, and one float scale per (column, block). The kernel wants, for each group of 16 columns, each block and each 8
values of ``K``, 64 bytes: byte ``4c + j`` holds column ``c``'s value ``8p + j`` (low nibble) and ``8p + 4 + j``
(high nibble); and the scales group by group, ``[N / 16, K / 128, 16]`` (a group's in the order its tiles are read).
"""

from __future__ import annotations

import numpy as np

BLOCK = 128


def unpack(packed: np.ndarray) -> np.ndarray:
    """MatMulNBits' ``[N, K / 128, 64]`` bytes as ``[N, K]`` values 0..15."""
    n = packed.shape[0]
    values = np.empty((n, packed.shape[1], BLOCK), dtype=np.uint8)
    values[..., 0::2] = packed & 0x0F
    values[..., 1::2] = packed >> 4
    return values.reshape(n, -1)


def repack(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' weights and scales (``[N, K / 128]`` or flat) in the kernel's layout."""
    values = unpack(packed)  # [N, K]
    n, k = values.shape
    if n % 16 or k % BLOCK:
        raise ValueError(f"the kernel takes N a multiple of 16 and K of {BLOCK}, not {n} x {k}")
    # [groups, 16 columns, K / 8 pieces, 2 halves, 4] -> [groups, pieces, 16 columns, 4] for each half
    pieces = values.reshape(n // 16, 16, k // 8, 2, 4)
    first = pieces[:, :, :, 0, :].transpose(0, 2, 1, 3)
    second = pieces[:, :, :, 1, :].transpose(0, 2, 1, 3)
    tiles = (first | (second << 4)).astype(np.uint8)  # [groups, K / 8, 16, 4]: 64 bytes a piece
    # scales [groups, K / 128, 16]: a group's scales in one run of bytes (read block after block as its tiles are)
    return np.ascontiguousarray(tiles.reshape(-1)), np.ascontiguousarray(
        scales.reshape(n // 16, 16, k // BLOCK).transpose(0, 2, 1).astype(np.float32))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``x`` as int8 per block of 128 (accuracy level 4): values and scales ``[M, K / 128]``."""
    m, k = x.shape
    blocks = x.astype(np.float32).reshape(m, k // BLOCK, BLOCK)
    largest = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore"):
        inverse = np.where(largest != 0, np.float32(127.0) / largest, np.float32(0.0)).astype(np.float32)
    q = np.rint(blocks * inverse[..., None]).astype(np.int32)
    return q.reshape(m, k), (largest / np.float32(127.0)).astype(np.float32)


def matmul(packed: np.ndarray, scales: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x [M, K]`` times the 4-bit weights, as the kernel computes it (float64 here: compare with a tolerance)."""
    values = unpack(packed).astype(np.int64) - 8  # [N, K]
    n, k = values.shape
    q, a_scales = quantize_rows(x)
    blocks = k // BLOCK
    sums = np.einsum("mbi,nbi->mnb", q.reshape(-1, blocks, BLOCK).astype(np.int64), values.reshape(n, blocks, BLOCK))
    weights = scales.reshape(n, blocks).astype(np.float64)
    return np.einsum("mnb,nb,mb->mn", sums.astype(np.float64), weights, a_scales.astype(np.float64))
