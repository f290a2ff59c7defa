"""The decoder graph with phi-api's attention operator in place of ONNX Runtime's GroupQueryAttention.

A node is replaced when the operator computes exactly what it does (see
``engine/kernels/attention_reference.py``): a packed query, key and value; int8 keys and values with one scale per
head and channel (the graph :mod:`engine.runtime.quant` writes: ``phi_api.Attention``) or float32 ones
(``phi_api.AttentionFloat``); no position ids, attention bias, head sink, softcap, smooth softmax or scores output;
causal; a head size the kernel takes. Either every attention node of the graph qualifies, or none is replaced: the
cache's layout is the operator's (tiles of 16 tokens) in every layer or in none. The new graph sits beside the one
it is made from and shares its weights.

Beside computing attention in one pass over keys that stay in cache, the operator takes several new tokens for
each of several rows in one step (GroupQueryAttention only for a batch of one): drafts are then checked in the
batched step (:mod:`engine.sched.verify`).

``ATTENTION_KERNEL`` chooses: ``auto`` swaps where the library runs here (AVX-512 VNNI), ``phi-api`` demands it,
``onnxruntime`` keeps GroupQueryAttention.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from phi_api.engine.runtime.graphs import node_attributes
from phi_api.engine.runtime.logits import slice_positions
from phi_api.engine.runtime.quant import int4_key_scales
from phi_api.engine.runtime.rewrite import DOMAIN
from phi_api.errors import KernelError

log = logging.getLogger(__name__)

OP_TYPES = {"int8": "Attention", "float32": "AttentionFloat"}  # by the keys' and values' type
INT4_OP = "Attention4"  # int4 keys and values: made from an int8 graph, its scales per channel kept (see swap)
VERSION = 3  # bump when the operator's cache layout or this rewrite changes (3: logits where read)
LAYOUT = "tiles16"  # the cache layout the operator keeps (DecoderSpec.kv_layout)
KEPT = ("num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved", "local_window_size")
NEUTRAL = {"softcap": 0.0, "smooth_softmax": (-1, 0), "qk_output": 0, "causal": 1, "sliding_window_cache": 0}
MAX_HEAD_SIZE = 256


def _neutral(name: str, value: Any) -> bool:
    wanted = NEUTRAL[name]
    return value in wanted if isinstance(wanted, tuple) else value == wanted


def attention_file(graph_file: Path, cache: str) -> str:
    """The swapped graph's file name, beside ``graph_file`` it is made from (and named after it: a graph made anew,
    with new scales, is swapped anew), for keys and values of type ``cache``."""
    return f"{graph_file.stem}.{cache}-attention.v{VERSION}.onnx"


def cache_kind(node: Any) -> str:
    """``int8`` (per channel) or ``float32`` (not quantized) for a GroupQueryAttention node's keys and values; empty
    for any other kind (whose elements, float32 or float16, the graph's declared inputs tell)."""
    attributes = node_attributes(node)
    quant = (attributes.get("k_quant_type"), attributes.get("v_quant_type"), attributes.get("kv_cache_bit_width"))
    if quant == (b"PER_CHANNEL", b"PER_CHANNEL", 8):
        return "int8"
    return "float32" if quant[0] in (None, b"NONE") and quant[1] in (None, b"NONE") and not quant[2] else ""


def refusal(node: Any, head_size: int, cache: str) -> str:
    """Why the operator cannot stand in for ``node``, whose keys and values the graph declares of type ``cache``
    (empty: it can)."""
    attributes = node_attributes(node)
    inputs = list(node.input) + [""] * (14 - len(node.input))
    checks = [
        (node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft", "not GroupQueryAttention"),
        (cache in OP_TYPES and cache_kind(node) == cache, "keys and values neither int8 per channel nor float32"),
        (not inputs[1] and not inputs[2], "query, key and value not packed"),
        (not any(inputs[9:12]) and len(node.input) <= 14, "position ids, attention bias or head sink given"),
        (all(_neutral(name, attributes[name]) for name in NEUTRAL if name in attributes),
         "softcap, smooth softmax, scores output or a non-causal mask asked"),
        (head_size % 16 == 0 and 0 < head_size <= MAX_HEAD_SIZE, f"head size {head_size}"),
    ]
    return next((reason for passed, reason in checks if not passed), "")


def swap(model: Any, head_size: int | None = None, int4: bool = False) -> int:
    """Replace every GroupQueryAttention node of ``model`` (an onnx ModelProto, changed in place) with the
    operator: the count replaced, or KernelError saying why one cannot be (then nothing is changed). ``int4``: an
    int8 graph's nodes become the int4 operator's, whose caches the graph then declares ``D / 2 + 4`` bytes a token
    wide (``attention_int4.h``)."""
    from onnx import helper

    graph = model.graph
    nodes = [node for node in graph.node if node.op_type == "GroupQueryAttention"]
    declared_size, cache = _cache(graph, nodes)
    head_size = declared_size if head_size is None else head_size
    for node in nodes:
        reason = refusal(node, head_size, cache)
        if reason:
            raise KernelError(f"{node.name or node.output[0]}: phi-api's attention cannot stand in for it ({reason})")
    if int4 and cache != "int8":
        raise KernelError("int4 keys and values are made from a graph of int8 ones")
    if int4 and head_size % 32:
        raise KernelError(f"int4 keys and values take heads of a multiple of 32 channels, not {head_size}")
    for node in nodes:
        attributes = {name: value for name, value in node_attributes(node).items() if name in KEPT}
        inputs = list(node.input)[:14]
        node.CopyFrom(helper.make_node(INT4_OP if int4 else OP_TYPES[cache], inputs, list(node.output)[:3],
                                       name=node.name, domain=DOMAIN, **attributes))
    if int4:
        _widen(graph, nodes, head_size // 2 + 4)
    if nodes and not any(opset.domain == DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return len(nodes)


def _widen(graph: Any, nodes: list[Any], width: int) -> None:
    """Declare the caches of ``nodes`` (inputs and outputs of the graph) ``width`` elements a token wide."""
    names = {name for node in nodes for name in (*node.input[3:5], *node.output[1:3])}
    for value in (*graph.input, *graph.output):
        if value.name in names and len(value.type.tensor_type.shape.dim) == 4:
            value.type.tensor_type.shape.dim[3].dim_value = width


def _cache(graph: Any, nodes: list[Any]) -> tuple[int, str]:
    """The head size and the keys' and values' type (``int8``, ``float32``, or another), from the graph's declared
    cache inputs."""
    from onnx import helper

    declared = {value.name: value for value in graph.input}
    for node in nodes:
        cache = declared.get(node.input[3]) if len(node.input) > 3 else None
        if cache is not None:
            tensor = cache.type.tensor_type
            kind = str(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
            return int(tensor.shape.dim[3].dim_value), kind
    return 0, ""


def demanded_by(cache: str, choice: str) -> str:
    """The setting that demands phi-api's operator (empty: none does, GroupQueryAttention may serve): int4 keys and
    values, which only it computes, or ``ATTENTION_KERNEL=phi-api``."""
    if cache == "int4":
        return "KV_CACHE_DTYPE is int4"
    return "ATTENTION_KERNEL is phi-api" if choice == "phi-api" else ""


def attention_model(graph_file: Path, cache: str, choice: str, library: str, head_size: int,
                    logits: str = "logits") -> Path | None:
    """The graph with the operator beside ``graph_file`` (keys and values of type ``cache``, ``int4`` from an int8
    graph; made now if missing), or None where GroupQueryAttention serves: ``choice`` is onnxruntime, or auto and
    the operator cannot serve this graph or this machine. KernelError when phi-api's is demanded and cannot serve
    (int4 keys and values always demand it)."""
    demand = demanded_by(cache, choice)
    if choice == "onnxruntime":
        if demand:
            raise KernelError(f"{demand}, which only phi-api's attention computes, but ATTENTION_KERNEL is "
                              "onnxruntime")
        return None
    reason = "" if library else "phi-api's kernel library cannot run here"
    target = graph_file.parent / attention_file(graph_file, cache)
    if not reason and not target.is_file():
        reason = _write(graph_file, target, head_size, int4=cache == "int4", logits=logits)
    if reason:
        if demand:
            raise KernelError(f"{demand}, but {reason}")
        log.info("attention stays on ONNX Runtime's GroupQueryAttention: %s", reason)
        return None
    return target


def _write(graph_file: Path, target: Path, head_size: int, int4: bool = False, logits: str = "logits") -> str:
    """Write the swapped graph to ``target``, its logits computed only where a step reads them
    (:mod:`engine.runtime.logits`): empty, or why it could not be."""
    import onnx

    model = onnx.load(str(graph_file), load_external_data=False)
    try:
        if swap(model, head_size, int4) == 0:
            return "the graph has no GroupQueryAttention node"
    except KernelError as exc:
        return str(exc)
    if int4:
        int4_key_scales(model, graph_file, INT4_OP)
    slice_positions(model, logits)
    handle, staging = tempfile.mkstemp(prefix=".attention-", suffix=".onnx", dir=target.parent)
    os.close(handle)
    try:
        onnx.save(model, staging)
        os.rename(staging, target)  # atomic: workers starting at once each write the same graph
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return ""
