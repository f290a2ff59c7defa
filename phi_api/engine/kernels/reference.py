"""MatMulNBits' 4-bit and 8-bit weights repacked for :mod:`.native`'s kernel, and the kernel's product in numpy.

MatMulNBits (blocks of 128, no zero points: the implicit zero point is 8 for 4 bits, 128 for 8) stores ``B`` as
``[N, blocks, 128 * bits / 8]`` bytes, ``blocks`` being ``K / 128`` rounded up (the last block may be partial, its
bytes padded), and one float scale per (column, block). With 4 bits, byte ``i`` of a block holds ``K = 2i`` in its
low nibble and ``2i + 1`` in its high one; with 8, byte ``i`` holds ``K = i``.

The kernel reads 64-byte tiles: for each group of 16 columns, the values of ``K`` in pieces of 8 (4 bits) or 4 (8
bits), a piece holding each of the 16 columns' values in turn. With 4 bits, byte ``4c + j`` of piece ``p`` holds
column ``c``'s value ``8p + j`` (low nibble) and ``8p + 4 + j`` (high nibble); with 8 bits, byte ``4c + j`` holds
its value ``4p + j``. The scales go group by group, ``[N / 16, blocks, 16]`` (a group's in the order its tiles
are read).
"""

from __future__ import annotations

import numpy as np

BLOCK = 128
BITS = (4, 8)


def zero_point(bits: int) -> int:
    """The implicit zero point of MatMulNBits without zero points."""
    return 1 << (bits - 1)


def block_count(k: int) -> int:
    """Blocks of 128 along ``k``, the last one possibly partial."""
    return -(-k // BLOCK)


def unpack(packed: np.ndarray, bits: int = 4, k: int | None = None) -> np.ndarray:
    """MatMulNBits' ``[N, blocks, 128 * bits / 8]`` bytes as ``[N, K]`` values (``K`` by default: every block
    whole)."""
    n = packed.shape[0]
    packed = packed.reshape(n, -1, BLOCK * bits // 8)
    if bits == 8:
        values = packed.astype(np.uint8)
    else:
        values = np.empty((n, packed.shape[1], BLOCK), dtype=np.uint8)
        values[..., 0::2] = packed & 0x0F
        values[..., 1::2] = packed >> 4
    return values.reshape(n, -1)[:, :k]


def repack(packed: np.ndarray, scales: np.ndarray, bits: int = 4, k: int | None = None) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """MatMulNBits' weights and scales (``[N, blocks]`` or flat) in the kernel's layout."""
    values = unpack(packed, bits, k)  # [N, K]
    n, k = values.shape
    if n % 16 or k % 16:
        raise ValueError(f"the kernel takes N and K multiples of 16, not {n} x {k}")
    if bits == 8:  # [groups, 16 columns, K / 4 pieces, 4] -> [groups, pieces, 16 columns, 4]
        tiles = values.reshape(n // 16, 16, k // 4, 4).transpose(0, 2, 1, 3)
    else:  # [groups, 16 columns, K / 8 pieces, 2 halves, 4] -> [groups, pieces, 16 columns, 4] for each half
        pieces = values.reshape(n // 16, 16, k // 8, 2, 4)
        first = pieces[:, :, :, 0, :].transpose(0, 2, 1, 3)
        second = pieces[:, :, :, 1, :].transpose(0, 2, 1, 3)
        tiles = first | (second << 4)
    blocks = block_count(k)
    # scales [groups, blocks, 16]: a group's scales in one run of bytes (read block after block as its tiles are)
    return np.ascontiguousarray(tiles.astype(np.uint8).reshape(-1)), np.ascontiguousarray(
        scales.reshape(n // 16, 16, blocks).transpose(0, 2, 1).astype(np.float32))


def _whole_blocks(a: np.ndarray, dtype: type) -> np.ndarray:
    """``a [rows, K]`` with zeros after ``K`` up to whole blocks: zeros change neither a block's largest value nor
    its sums."""
    rows, k = a.shape
    padded: np.ndarray = np.zeros((rows, block_count(k) * BLOCK), dtype=dtype)
    padded[:, :k] = a
    return padded


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``x`` as int8 per block of 128, the last one possibly partial (accuracy level 4): values and scales
    ``[M, blocks]``."""
    m, k = x.shape
    blocks = block_count(k)
    padded = _whole_blocks(x, np.float32)
    largest = np.abs(padded.reshape(m, blocks, BLOCK)).max(axis=2)
    with np.errstate(divide="ignore"):
        inverse = np.where(largest != 0, np.float32(127.0) / largest, np.float32(0.0)).astype(np.float32)
    q = np.rint(padded.reshape(m, blocks, BLOCK) * inverse[..., None]).astype(np.int32)
    return q.reshape(m, -1)[:, :k], (largest / np.float32(127.0)).astype(np.float32)


def matmul(packed: np.ndarray, scales: np.ndarray, x: np.ndarray, bits: int = 4) -> np.ndarray:
    """``x [M, K]`` times the weights, as the kernel computes it (float64 here: compare with a tolerance)."""
    m, k = x.shape
    values = unpack(packed, bits, k).astype(np.int64) - zero_point(bits)  # [N, K]
    n = values.shape[0]
    q, a_scales = quantize_rows(x)
    blocks = block_count(k)
    sums = np.einsum("mbi,nbi->mnb", _whole_blocks(q, np.int64).reshape(m, blocks, BLOCK),
                     _whole_blocks(values, np.int64).reshape(n, blocks, BLOCK))
    weights = scales.reshape(n, blocks).astype(np.float64)
    return np.einsum("mnb,nb,mb->mn", sums.astype(np.float64), weights, a_scales.astype(np.float64))


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to bfloat16 (to nearest even, as ``vcvtne2ps2bf16``): their top 16 bits, uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16(values: np.ndarray) -> np.ndarray:
    """bfloat16 ``values`` (uint16) as float32."""
    return (values.astype(np.uint32) << 16).view(np.float32)


def pack_bf16(weights: np.ndarray) -> np.ndarray:
    """A float32 ``[K, N]`` matrix (MatMul's B) in the BF16 kernel's layout: for each group of 16 columns, each pair of
    ``K`` values, 16 columns' pairs (``K = 2p`` first), as bfloat16."""
    k, n = weights.shape
    if n % 16 or k % 16:
        raise ValueError(f"the BF16 kernel takes K and N multiples of 16, not {k} x {n}")
    # [K / 2 pairs, 2, groups, 16 columns] -> [groups, pairs, 16 columns, 2]
    tiles = to_bf16(weights).reshape(k // 2, 2, n // 16, 16).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(tiles.reshape(-1))


def bf16_matmul(packed: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """``x [M, K]`` times :func:`pack_bf16`'s weights as the kernel computes it: the weights as bfloat16, ``x`` as it
    is (float64 sums here: compare with a tolerance)."""
    k = x.shape[1]
    weights = from_bf16(packed.reshape(n // 16, k // 2, 16, 2).transpose(1, 3, 0, 2).reshape(k, n))
    return x.astype(np.float64) @ weights.astype(np.float64)
