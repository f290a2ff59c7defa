"""The decoder graph with phi-api's 4-bit and 8-bit operators in place of ONNX Runtime's MatMulNBits, made once per
model.

A MatMulNBits node is replaced when the kernel computes exactly what it does: 4 or 8 bits, blocks of 128 (the last
one may be partial), no zero points, bias or group index, accuracy level 4 (activations as int8 per block), K a
multiple of 16, weights and scales stored in the graph. An N that is not a multiple of 16 (the kernel's column tile)
is padded with zero columns and the padding sliced off the result (a vocabulary such as 49,156 tokens). Its
weights are repacked (:func:`phi_api.engine.kernels.reference.repack`) into the new graph's data file, each tensor
at a page-aligned offset, so that ONNX Runtime memory-maps them and the workers share one copy in the page cache.
Every other node and initializer is kept as it is.

A quantized model's float32 matrices (MatMul by a 2-D float32 initializer, K a multiple of 16: the default model's
down projections, kept float32 by its recipe) go to ``phi_api.BF16MatMul``, their weights stored as bfloat16 (half the
bytes; the activations and the sums stay float32), which computes each row on its own: the graph then needs no padding
row (:mod:`engine.runtime.rowwise`). A float32 model (a reference) is left as it is.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from phi_api.engine.kernels.reference import BITS, BLOCK, block_count, pack_bf16, repack
from phi_api.engine.runtime.graphs import node_attributes, slice_node
from phi_api.errors import KernelError

log = logging.getLogger(__name__)

DOMAIN = "phi_api"
OP_TYPES = {4: "Q4MatMul", 8: "Q8MatMul"}
BF16_TYPE = "BF16MatMul"
FLOAT = 1  # onnx.TensorProto.FLOAT
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
ALIGNMENT = 4096  # ONNX Runtime maps external data whose offset is a multiple of the page size
SMALL_BYTES = 1024  # initializers below this stay inside the graph file


def eligible(node: Any, initializers: dict[str, Any]) -> bool:
    """Whether ``node`` is a MatMulNBits the kernel computes exactly."""
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    inputs = list(node.input)
    while inputs and not inputs[-1]:
        inputs.pop()
    attributes = node_attributes(node)
    k, n = int(attributes.get("K", 0)), int(attributes.get("N", 0))
    return (len(inputs) == 3 and inputs[1] in initializers and inputs[2] in initializers
            and attributes.get("bits", 4) in BITS and attributes.get("block_size") == BLOCK
            and attributes.get("accuracy_level", 0) == 4 and k > 0 and n > 0 and k % 16 == 0)


def float_eligible(node: Any, initializers: dict[str, Any]) -> bool:
    """Whether ``node`` is a float32 MatMul by a matrix of the graph the BF16 kernel takes (K a multiple of 16)."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return False
    weights = initializers.get(node.input[1])
    return (weights is not None and weights.data_type == FLOAT and len(weights.dims) == 2
            and weights.dims[0] > 0 and weights.dims[0] % 16 == 0 and weights.dims[1] > 0)


def rewrite(source: Path, target: Path) -> int:
    """Write ``source``'s graph with the kernel's operators to ``target`` (a folder): the count of nodes replaced
    (none: nothing is written), its float32 matrices counted if it has quantized ones."""
    return len(rewritten(source, target))


def rewritten(source: Path, target: Path) -> list[str]:
    """:func:`rewrite`'s work: the operator each replaced node became, in the graph's order."""
    import onnx
    from onnx import helper

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    chosen = [node for node in graph.node if eligible(node, initializers)]
    if not chosen:
        return []
    chosen += [node for node in graph.node if float_eligible(node, initializers)]
    replaced = {name for node in chosen for name in node.input[1:3]}
    chosen_ids = {id(node) for node in chosen}
    still_used = {name for node in graph.node if id(node) not in chosen_ids for name in node.input}
    target.mkdir(parents=True, exist_ok=True)
    following: dict[int, Any] = {}  # a node's slice of its padded columns, put right after it
    with open(target / DATA_FILE, "wb") as data:
        tensors = [_externalized(tensor, source.parent, data) for tensor in graph.initializer
                   if tensor.name not in replaced or tensor.name in still_used]
        for node in chosen:  # one at a time: a large model's repacked weights never sit in memory together
            made, cut = _replace(node, initializers, source.parent, data)
            tensors += made
            if cut is not None:
                following[id(node)] = cut
    nodes = [kept for node in graph.node for kept in (node, following.get(id(node))) if kept is not None]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(tensors)
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    onnx.save(model, str(target / MODEL_FILE))
    return [node.op_type for node in chosen]


def _replace(node: Any, initializers: dict[str, Any], base: Path, data: BinaryIO) -> tuple[list[Any], Any]:
    """Turn ``node`` into the kernel's operator: its repacked weights (and scales), written to ``data``, and the
    Slice node that cuts its padded columns off (None when N needs no padding)."""
    if node.op_type == "MatMul":
        weights = _read(initializers[node.input[1]], base)  # [K, N]
        k, n = weights.shape
        padded = -(-n // 16) * 16
        packed = pack_bf16(np.pad(weights, ((0, 0), (0, padded - n))))  # zero columns give zero products
        return _replaced_by(node, BF16_TYPE, {"bf16_weights": packed}, data, k, n)
    attributes = node_attributes(node)
    n, k, bits = int(attributes["N"]), int(attributes["K"]), int(attributes.get("bits", 4))
    padded = -(-n // 16) * 16
    blocks = block_count(k)
    weights = _read(initializers[node.input[1]], base).reshape(n, blocks, BLOCK * bits // 8)
    scales = _read(initializers[node.input[2]], base).reshape(n, blocks)
    if padded != n:  # zero columns: their scales are zero, so whatever their weights, their products are
        weights = np.concatenate([weights, np.zeros((padded - n, *weights.shape[1:]), dtype=weights.dtype)])
        scales = np.concatenate([scales, np.zeros((padded - n, scales.shape[1]), dtype=scales.dtype)])
    tiles, block_scales = repack(weights, scales, bits, k)
    return _replaced_by(node, OP_TYPES[bits], {"q4_weights": tiles, "q4_scales": block_scales}, data, k, n)


def _replaced_by(node: Any, op_type: str, inputs: dict[str, np.ndarray], data: BinaryIO, k: int,
                 n: int) -> tuple[list[Any], Any]:
    """``node`` made ``op_type`` of its first input and ``inputs`` (written to ``data``), its columns padded to a
    multiple of 16: the tensors, and the Slice that cuts the padding off (None without padding)."""
    from onnx import helper

    padded = -(-n // 16) * 16
    key = node.name or node.output[0]
    names = [f"{key}.{suffix}" for suffix in inputs]
    output = node.output[0]
    wide = output if padded == n else f"{key}.q4_padded"
    node.CopyFrom(helper.make_node(op_type, [node.input[0], *names], [wide], name=node.name, domain=DOMAIN,
                                   K=k, N=padded))
    tensors = [_written(array, name, data) for name, array in zip(names, inputs.values(), strict=True)]
    if padded == n:
        return tensors, None
    cut, bounds = slice_node(wide, output, f"{key}.q4_slice", starts=0, ends=n, axis=-1)
    return tensors + bounds, cut


def _read(tensor: Any, base: Path) -> np.ndarray:
    """``tensor``'s values, read from its external data file when it has one. Read here rather than by onnx,
    which refuses a data file that is a symbolic link, as every file of Hugging Face's cache is."""
    from onnx import TensorProto, numpy_helper
    from onnx.external_data_helper import uses_external_data

    if not uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = Path(info.get("location", ""))
    if not location.parts or location.is_absolute() or ".." in location.parts:
        raise KernelError(f"{tensor.name}: its data file {str(location)!r} is not in the model's folder")
    with open(base / location, "rb") as data:
        data.seek(int(info.get("offset", 0)))
        raw = data.read(int(info["length"])) if "length" in info else data.read()
    inline = TensorProto()
    inline.CopyFrom(tensor)
    del inline.external_data[:]
    inline.data_location = TensorProto.DEFAULT
    inline.raw_data = raw
    return numpy_helper.to_array(inline)


def _externalized(tensor: Any, base: Path, data: BinaryIO) -> Any:
    """``tensor`` with its bytes moved to ``data`` (small ones stay in the graph)."""
    from onnx.external_data_helper import uses_external_data

    if not uses_external_data(tensor) and tensor.ByteSize() < SMALL_BYTES:
        return tensor
    return _written(_read(tensor, base), tensor.name, data)


def _written(array: np.ndarray, name: str, data: BinaryIO) -> Any:
    """A tensor ``name`` of ``array``, its bytes appended to ``data`` at a page-aligned offset (small ones inside)."""
    from onnx import TensorProto, numpy_helper

    raw = np.ascontiguousarray(array).tobytes()
    tensor = numpy_helper.from_array(array, name)
    if len(raw) < SMALL_BYTES:
        return tensor
    offset = data.seek(0, os.SEEK_END)
    padding = -offset % ALIGNMENT
    data.write(b"\0" * padding + raw)
    tensor.ClearField("raw_data")
    for key, value in (("location", DATA_FILE), ("offset", str(offset + padding)), ("length", str(len(raw)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL
    return tensor

RECIPE = 6  # bump when the rewrite changes (3: the scales group-major; 4: 8-bit weights and partial blocks; 5, 6: the
# float32 matrices in bfloat16)
RECORD = "rewrite.json"  # the source and how many nodes were replaced (none: the source is served as it is)


def own_kernel_graph(source: Path, decoder_file: str, cache_dir: Path, choice: str) -> tuple[Path, str] | None:
    """The folder of ``source``'s graph with phi-api's operator (made now if missing, once for all workers) and
    the library it needs; None where ONNX Runtime's kernel serves: ``choice`` (INT4_KERNEL) is mlas, or auto and
    phi-api's kernel cannot run here, or no node qualifies. KernelError when phi-api's is demanded and cannot run."""
    from phi_api.engine.kernels.op import find_library
    from phi_api.engine.runtime.prepack import source_key

    if choice == "mlas":
        return None
    library, reason = find_library(cache_dir)
    if library is None:
        if choice == "phi-api":
            raise KernelError(f"INT4_KERNEL is phi-api, but phi-api's kernel cannot run here: {reason}")
        log.info("4-bit and 8-bit weights go to ONNX Runtime's kernel: phi-api's cannot run here (%s)", reason)
        return None
    folder = cache_dir / "q4" / f"{source_key(source, decoder_file)[:24]}-r{RECIPE}"
    try:
        _made_once(source / decoder_file, folder)
    except KernelError as exc:
        if choice == "phi-api":
            raise
        log.warning("4-bit and 8-bit weights go to ONNX Runtime's kernel: %s", exc)
        return None
    record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    if not record["replaced"]:
        return None
    log.info("%s: %d matrices of 4-bit or 8-bit weights on phi-api's kernel, %d float32 ones in BF16", source,
             record["replaced"] - record.get("bf16", 0), record.get("bf16", 0))
    return folder, str(library)


def _made_once(source: Path, folder: Path) -> None:
    """``folder`` made from the graph ``source`` unless it exists; KernelError when the graph cannot be read."""
    from google.protobuf.message import DecodeError
    from onnx.checker import ValidationError

    from phi_api.engine.runtime.prepack import made_once

    try:
        made_once(folder, lambda staging: _make(source, staging))
    except (OSError, ValueError, KeyError, DecodeError, ValidationError) as exc:
        raise KernelError(f"{source} could not be rewritten for phi-api's kernel ({type(exc).__name__}: "
                          f"{exc})") from exc


def _make(source: Path, staging: Path) -> None:
    started = time.monotonic()
    kinds = rewritten(source, staging)
    (staging / RECORD).write_text(json.dumps({"source": str(source), "replaced": len(kinds),
                                              "bf16": kinds.count(BF16_TYPE)}), encoding="utf-8")
    log.info("graph for phi-api's kernel made in %.0f s", time.monotonic() - started)
