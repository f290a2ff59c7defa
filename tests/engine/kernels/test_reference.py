"""The 4-bit and 8-bit kernel's numpy side: MatMulNBits' weights repacked into its tiles, and its product."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine.kernels.reference import BLOCK, block_count, matmul, quantize_rows, repack, unpack


def random_weights(n: int, k: int, seed: int = 0, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, size=(n, block_count(k), BLOCK * bits // 8), dtype=np.uint8)
    return packed, (rng.random((n, block_count(k)), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)


def test_each_tile_holds_16_columns_and_8_values_of_k_in_the_kernel_s_order():
    packed, scales = random_weights(32, 256)
    values = unpack(packed)
    tiles, block_scales = repack(packed, scales)
    assert tiles.size == packed.size and block_scales.shape == (2, 2, 16)  # [groups, blocks, 16 columns]
    tile = tiles.reshape(2, 256 // 8, 16, 4)  # [groups, pieces of 8 values, columns, 4]
    for group, piece, column, j in [(0, 0, 0, 0), (1, 17, 5, 3), (0, 31, 15, 2), (1, 16, 0, 1)]:
        byte = int(tile[group, piece, column, j])
        n = group * 16 + column
        assert byte & 0x0F == values[n, 8 * piece + j] and byte >> 4 == values[n, 8 * piece + 4 + j]
    for group, block, column in [(0, 0, 0), (1, 1, 5), (0, 1, 15), (1, 0, 9)]:
        assert block_scales[group, block, column] == scales[group * 16 + column, block]


def test_an_8_bit_tile_holds_16_columns_and_4_values_of_k_and_a_partial_block_only_its_values():
    packed, scales = random_weights(32, 576, bits=8)  # 4 blocks and a half: the last block's bytes are half padding
    tiles, block_scales = repack(packed, scales, 8, 576)
    assert tiles.size == 32 * 576 and block_scales.shape == (2, 5, 16)
    tile = tiles.reshape(2, 576 // 4, 16, 4)  # [groups, pieces of 4 values, columns, 4]
    for group, piece, column, j in [(0, 0, 0, 0), (1, 17, 5, 3), (0, 143, 15, 2), (1, 130, 0, 1)]:
        n, position = group * 16 + column, 4 * piece + j
        assert tile[group, piece, column, j] == packed[n, position // BLOCK, position % BLOCK]


def test_unpacking_reads_low_nibbles_as_even_positions():
    packed = np.array([[[0x21] + [0] * 63]], dtype=np.uint8)  # K = 128, one column
    assert unpack(packed)[0, :2].tolist() == [1, 2]


@pytest.mark.parametrize("rows", [1, 2, 7, 16])
def test_the_product_is_the_dequantized_weights_times_the_rows_within_their_quantization(rows):
    packed, scales = random_weights(48, 384, seed=rows)
    x = np.random.default_rng(rows).standard_normal((rows, 384), dtype=np.float32)
    dequantized = (unpack(packed).astype(np.float64) - 8) * np.repeat(scales.astype(np.float64), BLOCK, axis=1)
    exact = x.astype(np.float64) @ dequantized.T
    got = matmul(packed, scales, x)
    assert got.shape == (rows, 48)
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()  # int8 activations: about 1% at most
    assert np.array_equal(matmul(packed, scales, x[:1]), got[:1])  # a row's result is its own


@pytest.mark.parametrize(("bits", "k"), [(8, 384), (8, 576), (4, 576), (8, 208)])
def test_8_bit_weights_and_partial_blocks_give_the_dequantized_product(bits, k):
    packed, scales = random_weights(32, k, seed=k, bits=bits)
    x = np.random.default_rng(k).standard_normal((3, k), dtype=np.float32)
    zero = 8 if bits == 4 else 128
    dequantized = (unpack(packed, bits, k).astype(np.float64) - zero) * np.repeat(scales.astype(np.float64), BLOCK,
                                                                                   axis=1)[:, :k]
    exact = x.astype(np.float64) @ dequantized.T
    got = matmul(packed, scales, x, bits)
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()


def test_a_partial_block_is_quantized_over_its_own_values():
    x = np.zeros((1, 192), dtype=np.float32)  # a block of 128 and one of 64
    x[0, 0], x[0, 130] = 4.0, -0.25
    q, scales = quantize_rows(x)
    assert q.shape == (1, 192) and q[0, 0] == 127 and q[0, 130] == -127
    assert np.allclose(scales, [[4.0 / 127, 0.25 / 127]])


def test_rows_are_quantized_per_block_of_128_to_the_int8_range():
    x = np.zeros((1, 256), dtype=np.float32)
    x[0, 3], x[0, 200] = -2.0, 0.5
    q, scales = quantize_rows(x)
    assert q[0, 3] == -127 and q[0, 200] == 127 and np.count_nonzero(q) == 2
    assert np.allclose(scales, [[2.0 / 127, 0.5 / 127]])
