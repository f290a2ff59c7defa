"""phi-api's 4-bit and 8-bit kernel in ONNX Runtime: the graph rewrite, the operators against MatMulNBits and the numpy
reference, a row's result whatever the row count, and the fallback to MLAS where the kernel cannot run.

Where the CPU lacks AVX-512 VNNI (or g++ is missing) the kernel cannot run: there the tests check that phi-api
says why and keeps ONNX Runtime's kernel, instead of comparing products."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from phi_api.engine.kernels import native, op
from phi_api.engine.kernels.reference import BLOCK, block_count, matmul, repack
from phi_api.engine.runtime import rewrite
from phi_api.errors import KernelError
from phi_api.settings import cache_root

SUPPORTED = native.unsupported() is None
# (K, N, bits); N 52: padded to 64, cut back; K 576 and 208: a partial last block (the default model's K is 576)
SHAPES = [(128, 16, 4), (256, 48, 4), (384, 160, 4), (1024, 32, 4), (256, 52, 4), (576, 48, 4),
          (576, 48, 8), (256, 52, 8), (128, 16, 8), (208, 32, 8), (1024, 160, 8)]


def weights(k: int, n: int, seed: int, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, size=(n, block_count(k), BLOCK * bits // 8), dtype=np.uint8)
    return packed, (rng.random((n, block_count(k)), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)


def matmulnbits(name: str, k: int, n: int, seed: int, **attributes: int) -> tuple[onnx.NodeProto, list]:
    attributes = {"bits": 4, "block_size": BLOCK, "accuracy_level": 4, **attributes}
    packed, scales = weights(k, n, seed, attributes["bits"] if attributes["bits"] in (4, 8) else 4)
    node = helper.make_node("MatMulNBits", [f"x{k}", f"{name}.w", f"{name}.s"], [name], domain="com.microsoft",
                            name=name, K=k, N=n, **attributes)
    return node, [numpy_helper.from_array(packed, f"{name}.w"),
                  numpy_helper.from_array(scales.reshape(-1), f"{name}.s")]


def save(folder: Path, nodes: list, tensors: list, widths: list[int], outputs: list[str]) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["M", k])
                                           for k in sorted(set(widths))],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
                              tensors)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


@pytest.fixture(scope="module")
def shapes_model(tmp_path_factory) -> tuple[Path, Path]:
    """A graph of one MatMulNBits per shape, and its rewrite."""
    nodes, tensors = [], []
    for index, (k, n, bits) in enumerate(SHAPES):
        node, made = matmulnbits(f"y{index}", k, n, seed=index, bits=bits)
        nodes.append(node)
        tensors += made
    folder = tmp_path_factory.mktemp("shapes")
    source = save(folder / "source", nodes, tensors, [k for k, _, _ in SHAPES], [node.output[0] for node in nodes])
    assert rewrite.rewrite(source, folder / "rewritten") == len(SHAPES)
    return source, folder / "rewritten" / rewrite.MODEL_FILE


def session(model: Path, library: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def test_only_the_nodes_the_kernel_computes_exactly_are_replaced(tmp_path):
    cases = {"plain": {}, "zero points": None, "8 bits": {"bits": 8}, "2 bits": {"bits": 2},
             "accuracy 0": {"accuracy_level": 0}, "blocks of 32": {"block_size": 32}}
    nodes, tensors = [], []
    for index, attributes in enumerate(cases.values()):
        node, made = matmulnbits(f"n{index}", 256, 32, seed=index, **(attributes or {}))
        if attributes is None:  # a fourth input: zero points
            made.append(numpy_helper.from_array(np.full(32 * 2, 0x88, dtype=np.uint8), f"n{index}.z"))
            node.input.append(f"n{index}.z")
        nodes.append(node)
        tensors += made
    source = save(tmp_path / "source", nodes, tensors, [256], [node.output[0] for node in nodes])
    assert rewrite.rewrite(source, tmp_path / "out") == 2
    written = onnx.load(str(tmp_path / "out" / rewrite.MODEL_FILE), load_external_data=False)
    kinds = [(node.name, node.op_type, node.domain) for node in written.graph.node]
    assert kinds[0] == ("n0", "Q4MatMul", rewrite.DOMAIN) and kinds[2] == ("n2", "Q8MatMul", rewrite.DOMAIN)
    assert [kinds[index][1] for index in (1, 3, 4, 5)] == ["MatMulNBits"] * 4
    names = {tensor.name for tensor in written.graph.initializer}
    assert "n0.w" not in names and "n1.w" in names  # the replaced node's weights are gone, the others kept


def test_the_repacked_weights_sit_at_page_aligned_offsets_of_the_data_file(shapes_model):
    _, rewritten = shapes_model
    graph = onnx.load(str(rewritten), load_external_data=False).graph
    offsets = [int(entry.value) for tensor in graph.initializer for entry in tensor.external_data
               if entry.key == "offset"]
    external = [tensor.name for tensor in graph.initializer if tensor.external_data]
    assert all(f"y{index}.q4_weights" in external for index in range(len(SHAPES)))  # each at least 1 KB
    assert len(offsets) == len(external) and all(offset % rewrite.ALIGNMENT == 0 for offset in offsets)


def test_a_model_with_nothing_to_replace_is_served_as_it_is(tmp_path):
    node, tensors = matmulnbits("z", 256, 32, seed=1)
    tensors.append(numpy_helper.from_array(np.full(32 * 2, 0x88, dtype=np.uint8), "z.z"))
    node.input.append("z.z")  # zero points: the kernel does not take them
    save(tmp_path / "model", [node], tensors, [256], ["z"])
    if SUPPORTED:
        op.build_library(tmp_path)
    assert rewrite.own_kernel_graph(tmp_path / "model", "model.onnx", tmp_path, "auto") is None
    if SUPPORTED:
        (record,) = (tmp_path / "q4").glob(f"*/{rewrite.RECORD}")
        assert json.loads(record.read_text())["replaced"] == 0 and not (record.parent / rewrite.MODEL_FILE).exists()


def test_the_default_model_s_8_bit_matrices_go_to_the_kernel_and_its_float32_ones_to_bf16_weights(model_path):
    """Its graph (8-bit weights, K = 576: four blocks and a half) as the server loads it."""
    source = onnx.load(str(Path(model_path) / "model.onnx"), load_external_data=False).graph
    eight_bit = sum(node.op_type == "MatMulNBits" for node in source.node)
    own = rewrite.own_kernel_graph(Path(model_path), "model.onnx", cache_root() / "runtime", "auto")
    if not SUPPORTED:
        assert own is None  # ONNX Runtime's kernel serves
        return
    assert own is not None
    graph = onnx.load(str(own[0] / rewrite.MODEL_FILE), load_external_data=False).graph
    kinds = [node.op_type for node in graph.node]
    assert eight_bit > 100 and kinds.count("Q8MatMul") == eight_bit and "MatMulNBits" not in kinds
    floats = [node.op_type for node in source.node].count("MatMul")  # its float32 down projections
    assert floats > 0 and kinds.count(rewrite.BF16_TYPE) == floats and "MatMul" not in kinds


@pytest.fixture(scope="module")
def library() -> str | None:
    """The operator's library as `make install` built it (None where the kernel cannot run)."""
    return str(op.build_library(cache_root() / "runtime")) if SUPPORTED else None


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 15, 16, 17, 40])
def test_the_operator_gives_matmulnbits_s_products_and_each_row_its_own_bits(shapes_model, library, rows):
    source, rewritten = shapes_model
    if not SUPPORTED:
        with pytest.raises(KernelError, match="cannot run here"):
            op.build_library(cache_root() / "runtime")
        return
    x = {f"x{k}": np.random.default_rng(rows + k).standard_normal((rows, k), dtype=np.float32) for k, _, _ in SHAPES}
    theirs, ours = session(source).run(None, x), session(rewritten, library).run(None, x)
    lone = session(rewritten, library).run(None, {name: value[-1:] for name, value in x.items()})
    for (_, n, _), mlas, own, alone in zip(SHAPES, theirs, ours, lone, strict=True):
        assert own.shape == (rows, n)
        assert np.abs(own - mlas).max() <= 1e-5 * np.abs(mlas).max()  # the same int8 rows: rounding apart
        assert np.array_equal(alone[0], own[-1])  # the last row alone: the same bits


@pytest.mark.parametrize("rows", range(1, 17))
@pytest.mark.parametrize(("k", "n", "bits"), [(128, 16, 4), (384, 48, 4), (1024, 160, 4), (576, 32, 4),
                                              (128, 16, 8), (576, 48, 8), (1024, 160, 8), (208, 16, 8)])
def test_the_native_kernel_gives_the_reference_s_product(rows, k, n, bits):
    packed, scales = weights(k, n, seed=rows, bits=bits)
    x = np.random.default_rng(k + rows).standard_normal((rows, k), dtype=np.float32)
    if not SUPPORTED:
        with pytest.raises(KernelError, match="cannot run"):
            native.Q4Kernel(cache_root() / "runtime" / "kernels")
        return
    kernel = native.Q4Kernel(cache_root() / "runtime" / "kernels")
    tiles, block_scales = repack(packed, scales, bits, k)
    got = kernel.matmul(tiles, block_scales, x, n, threads=2, bits=bits)
    expected = matmul(packed, scales, x, bits)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    for row in range(rows):  # each row alone gives the same bits
        assert np.array_equal(kernel.matmul(tiles, block_scales, x[row:row + 1], n, threads=1, bits=bits)[0],
                              got[row])


def test_without_avx512_vnni_auto_keeps_mlas_and_phi_api_is_refused_saying_why(model_path, tmp_path, monkeypatch,
                                                                                caplog):
    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    with caplog.at_level("INFO", logger="phi_api.engine.runtime.rewrite"):
        assert rewrite.own_kernel_graph(Path(model_path), "model.onnx", tmp_path, "auto") is None
    assert "this CPU lacks avx512bw, avx512cd, avx512dq, avx512vl, avx512_vnni" in caplog.text
    with pytest.raises(KernelError, match=r"INT4_KERNEL is phi-api.*lacks avx512bw"):
        rewrite.own_kernel_graph(Path(model_path), "model.onnx", tmp_path, "phi-api")
    with pytest.raises(KernelError, match="cannot run here"):
        op.build_library(tmp_path)
    assert rewrite.own_kernel_graph(Path(model_path), "model.onnx", tmp_path, "mlas") is None


def test_build_kernel_says_why_it_cannot_and_leaves_mlas_unless_strict(monkeypatch, capsys):
    import argparse

    from phi_api.tools import build_kernel

    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma"})
    assert build_kernel.main(argparse.Namespace(strict=False, any_cpu=False, into=None)) == 0
    assert "this CPU lacks avx512f" in capsys.readouterr().out
    assert build_kernel.main(argparse.Namespace(strict=True, any_cpu=False, into=None)) == 1
    assert "ONNX Runtime's kernel (MLAS)" in capsys.readouterr().out


def test_build_kernel_for_any_cpu_skips_this_cpu_s_check_but_still_needs_g_plus_plus(tmp_path, monkeypatch, capsys):
    import argparse

    from phi_api.tools import build_kernel

    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    arguments = argparse.Namespace(strict=True, any_cpu=True, into=tmp_path / "out")
    assert build_kernel.main(arguments) == 1
    assert "cannot be built here: g++ is not installed" in capsys.readouterr().out
    monkeypatch.setattr(native.shutil, "which", lambda name: f"/usr/bin/{name}")
    calls = []
    monkeypatch.setattr(op, "_headers", lambda folder: folder)  # no download, no compiler: where they would go
    monkeypatch.setattr(op, "compiled", lambda *given: calls.append(given) or op.library_in(given[2]))
    assert build_kernel.main(arguments) == 0
    assert capsys.readouterr().out.strip() == str(op.library_in(tmp_path / "out"))
    ((source, flags, folder, name, include),) = calls
    assert (source, flags, folder, name) == (op.SOURCE, op.OP_FLAGS, tmp_path / "out", op.LIBRARY)
    assert include == cache_root() / "runtime" / "kernels" / op.HEADERS_DIR  # the headers stay in the cache
    with pytest.raises(KernelError, match="cannot run here: this CPU lacks avx512f"):
        op.build_library(tmp_path, into=tmp_path / "out")  # make install's way: this CPU must run it


def test_a_prebuilt_library_serves_without_g_plus_plus_after_the_cache_s_and_only_on_a_cpu_that_runs_it(
        tmp_path, monkeypatch):
    monkeypatch.setattr(native, "cpu_flags", lambda: set(native.NEEDED))
    monkeypatch.setattr(native.shutil, "which", lambda name: None)  # as in the Docker image
    monkeypatch.setattr(op, "PREBUILT", tmp_path / "prebuilt")
    cache = tmp_path / "cache"
    assert op.find_library(cache) == (None, "its library is not built, and g++, which builds it, is not installed")
    (tmp_path / "prebuilt").mkdir()
    (tmp_path / "prebuilt" / f"{op.LIBRARY}-0123456789abcdef.so").write_bytes(b"")  # of another source
    assert op.find_library(cache)[0] is None
    shipped = op.library_in(tmp_path / "prebuilt")
    shipped.write_bytes(b"")
    assert op.find_library(cache) == (shipped, "")
    built = op.library_path(cache)
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    assert op.find_library(cache) == (built, "")  # this machine's own build first
    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma"})
    assert op.find_library(cache) == (None, "this CPU lacks avx512f, avx512bw, avx512cd, avx512dq, avx512vl, "
                                            "avx512_vnni")


def test_weights_in_a_symbolically_linked_data_file_are_read(tmp_path):
    """As Hugging Face's cache stores every file (onnx itself refuses to read such a data file)."""
    node, tensors = matmulnbits("y", 256, 32, seed=5)
    source = save(tmp_path / "source", [node], tensors, [256], ["y"])
    model = onnx.load(str(source))
    onnx.save(model, str(source), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    blob = tmp_path / "blobs" / "0123abcd"
    blob.parent.mkdir()
    (source.parent / "model.onnx.data").rename(blob)
    (source.parent / "model.onnx.data").symlink_to(blob)
    assert rewrite.rewrite(source, tmp_path / "out") == 1
    (tiles,) = [tensor for tensor in onnx.load(str(tmp_path / "out" / rewrite.MODEL_FILE)).graph.initializer
                if tensor.name == "y.q4_weights"]
    assert numpy_helper.to_array(tiles).tobytes() == repack(*weights(256, 32, seed=5))[0].tobytes()


def test_a_graph_that_cannot_be_rewritten_keeps_mlas_under_auto_and_is_refused_under_phi_api(tmp_path, monkeypatch,
                                                                                             caplog):
    monkeypatch.setattr(op, "find_library", lambda cache_dir: (tmp_path / "library.so", ""))  # as if it ran here
    source = tmp_path / "model"
    source.mkdir()
    (source / "model.onnx").write_bytes(b"not a graph")
    assert rewrite.own_kernel_graph(source, "model.onnx", tmp_path, "auto") is None
    assert "could not be rewritten for phi-api's kernel" in caplog.text
    with pytest.raises(KernelError, match="could not be rewritten"):
        rewrite.own_kernel_graph(source, "model.onnx", tmp_path, "phi-api")
