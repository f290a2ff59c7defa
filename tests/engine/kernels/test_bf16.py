"""phi-api's matrix operator with bfloat16 weights, for a quantized model's float32 matrices: the weights' layout and
rounding, the rewrite (which MatMuls it takes, and that a float32 model is left alone), the kernel and the operator
against the numpy reference, and each row's own bits.

Where the CPU lacks AVX-512 VNNI the library cannot run (nor this operator, built into it): there the tests check
the rewrite alone, and test_op.py that ONNX Runtime keeps the whole graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from phi_api.engine.kernels import native, op
from phi_api.engine.kernels.reference import bf16_matmul, from_bf16, pack_bf16, to_bf16
from phi_api.engine.runtime import rewrite
from phi_api.errors import KernelError
from phi_api.settings import cache_root
from tests.engine.kernels.test_op import matmulnbits, save, session

SUPPORTED = native.unsupported() is None


def float_matmul(name: str, k: int, n: int, seed: int) -> tuple[onnx.NodeProto, list]:
    weights = np.random.default_rng(seed).standard_normal((k, n), dtype=np.float32) * 0.05
    node = onnx.helper.make_node("MatMul", [f"x{k}", f"{name}.w"], [name], name=name)
    return node, [numpy_helper.from_array(weights, f"{name}.w")]


def test_rounding_to_bf16_is_to_nearest_even_and_keeps_the_range():
    values = np.array([1.0, 1.00390625, 1.01171875, -3.0e38, 1.0e-30, 0.0], dtype=np.float32)
    rounded = from_bf16(to_bf16(values))
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one (1); 1 + 3 * 2^-8: up to 1 + 2^-6
    assert rounded[0] == 1.0 and rounded[1] == 1.0 and rounded[2] == np.float32(1.015625)
    assert np.isfinite(rounded[3]) and abs(rounded[3] / values[3] - 1) < 2 ** -8  # float32's range, not int8's
    assert rounded[4] != 0 and rounded[5] == 0


def test_each_tile_holds_16_columns_and_a_pair_of_k_values():
    k, n = 64, 32
    weights = np.arange(k * n, dtype=np.float32).reshape(k, n)  # integers: exact in bfloat16 up to 256
    tiles = from_bf16(pack_bf16(weights)).reshape(n // 16, k // 2, 16, 2)
    assert tiles[0, 0, 0, 0] == weights[0, 0] and tiles[0, 0, 0, 1] == weights[1, 0]
    assert tiles[0, 0, 5, 1] == weights[1, 5] and tiles[1, 3, 2, 0] == from_bf16(to_bf16(weights[6:7, 18]))[0]
    with pytest.raises(ValueError, match="multiples of 16, not 40 x 16"):
        pack_bf16(np.zeros((40, 16), dtype=np.float32))


def test_a_quantized_model_s_float32_matmuls_get_bf16_weights_and_a_float32_model_is_left_alone(tmp_path):
    quantized, made = matmulnbits("q", 256, 32, seed=1)
    nodes, tensors = [quantized], made
    for name, k, n in (("wide", 256, 40), ("odd", 40, 16), ("plain", 64, 32)):  # 40: K not a multiple of 16
        node, made = float_matmul(name, k, n, seed=k + n)
        nodes.append(node)
        tensors += made
    widths = [256, 40, 64]
    source = save(tmp_path / "source", nodes, tensors, widths, [node.output[0] for node in nodes])
    assert rewrite.rewrite(source, tmp_path / "out") == 3
    kinds = {node.name: node.op_type for node in onnx.load(str(tmp_path / "out" / rewrite.MODEL_FILE)).graph.node}
    assert kinds["wide"] == kinds["plain"] == rewrite.BF16_TYPE and kinds["odd"] == "MatMul"
    assert kinds["wide.q4_slice"] == "Slice"  # 40 columns padded to 48, then cut back
    floats = save(tmp_path / "floats", nodes[1:], tensors[2:], widths, [node.output[0] for node in nodes[1:]])
    assert rewrite.rewrite(floats, tmp_path / "none") == 0  # nothing quantized: a reference, kept float32


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 16, 17, 40])
@pytest.mark.parametrize(("k", "n"), [(16, 16), (48, 48), (576, 32), (1536, 576), (96, 160)])
def test_the_native_kernel_gives_the_reference_s_product_and_each_row_its_own_bits(rows, k, n):
    weights = np.random.default_rng(k + n).standard_normal((k, n), dtype=np.float32) * 0.05
    x = np.random.default_rng(rows).standard_normal((rows, k), dtype=np.float32)
    packed = pack_bf16(weights)
    if not SUPPORTED:
        with pytest.raises(KernelError, match="cannot run"):
            native.Q4Kernel(cache_root() / "runtime" / "kernels")
        return
    kernel = native.Q4Kernel(cache_root() / "runtime" / "kernels")
    got = kernel.bf16_matmul(packed, x, n, threads=2)
    expected = bf16_matmul(packed, x, n)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    exact = x.astype(np.float64) @ weights.astype(np.float64)
    assert np.abs(got - exact).max() <= 1e-2 * np.abs(exact).max()  # bfloat16's 8 bits of mantissa
    for row in range(rows):
        assert np.array_equal(kernel.bf16_matmul(packed, x[row:row + 1], n, threads=1)[0], got[row])


@pytest.mark.parametrize("rows", [1, 3, 8, 17])
def test_the_operator_gives_the_reference_s_product_and_a_row_alone_the_same_bits(tmp_path, rows):
    nodes, tensors = [], []
    for name, k, n in (("a", 1536, 576), ("b", 64, 40)):
        node, made = float_matmul(name, k, n, seed=n)
        nodes.append(node)
        tensors += made
    quantized, made = matmulnbits("q", 64, 16, seed=3)  # a quantized node: the graph is a quantized model's
    source = save(tmp_path / "source", [*nodes, quantized], tensors + made, [1536, 64], ["a", "b", "q"])
    assert rewrite.rewrite(source, tmp_path / "out") == 3
    if not SUPPORTED:
        with pytest.raises(KernelError, match="cannot run here"):
            op.build_library(cache_root() / "runtime")
        return
    library = str(op.build_library(cache_root() / "runtime"))
    x = {f"x{k}": np.random.default_rng(rows + k).standard_normal((rows, k), dtype=np.float32) for k in (1536, 64)}
    rewritten = tmp_path / "out" / rewrite.MODEL_FILE
    ours = session(rewritten, library).run(["a", "b"], x)
    lone = session(rewritten, library).run(["a", "b"], {name: value[-1:] for name, value in x.items()})
    for own, alone, tensor in zip(ours, lone, tensors, strict=True):
        weights = numpy_helper.to_array(tensor)
        k, n = weights.shape
        padded = np.pad(weights, ((0, 0), (0, -n % 16)))
        expected = bf16_matmul(pack_bf16(padded), x[f"x{k}"], padded.shape[1])[:, :n]
        assert own.shape == (rows, n)
        assert np.abs(own - expected).max() <= 1e-5 * np.abs(expected).max()
        assert np.array_equal(alone[0], own[-1])
