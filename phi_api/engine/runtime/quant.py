"""int8 keys and values: the decoder graph rewritten so that its attention keeps its cache in 8-bit integers.

ONNX Runtime's CPU ``GroupQueryAttention`` keeps the past keys and values in
``int8`` when told to (``k_quant_type``/``v_quant_type`` ``PER_CHANNEL``,
``kv_cache_bit_width`` 8): it stores ``round(x / scale)`` and computes with
``q * scale``, one fixed scale per head and channel and layer, given as an
input. A quarter of float32's memory: Phi-3.5-mini's 786 KB a token becomes
196 KB. Measured at Phi-3.5-mini's shape on 2 cores: 8-row decode steps 15%
(128 tokens of context) to 27% (1,024) faster, a 64-token prompt chunk on
1,024 tokens of context 23% slower. The accuracy cost on the default model is
measured by ``python -m phi_api bench kv`` (see docs/).

The scales are calibrated once per host, when the graph is made: the float32
graph runs over a calibration text (``data/calibration.txt``, and a short chat
through the model's template), and each channel's scale is its largest
magnitude there, with some headroom, over 127. Keys are stored after the
rotary embedding, which turns each pair of channels ``(i, i + half)``; their
scale is the largest length of that pair, which no rotation exceeds. The
graph is written beside the host's prepacked copy (whose weights it shares),
under a file lock, and renamed into place.

int4 keys and values (``KV_CACHE_DTYPE=int4``, phi-api's attention operator
alone) are made from the int8 graph, and divide each channel by a scale
before rounding each token to 4 bits with a scale of its own: the values by
the int8 scales, the keys by their channel's own largest magnitude (not the
rotation-proof one: with no fixed range to fit, the pair's bound only
shrinks the smaller channel of a pair, which cost the default model a third
more KL divergence from float32 in a simulation). Those scales are saved
beside the int8 graph (``INT4_KEYS_FILE``) when it is calibrated.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from phi_api.engine.runtime.spec import DecoderSpec

VERSION = 2  # bump when calibration or the rewrite changes
HEADROOM = 1.2  # over the largest magnitude seen: text unlike the calibration's reaches a bit further
QUANT_FILE = f"model.kv-int8.v{VERSION}.onnx"
INT4_KEYS_FILE = f"kv-int4-key-scales.v{VERSION}.npy"  # [layers, kv_heads, head_size], beside QUANT_FILE
CALIBRATION_TEXT = Path(__file__).resolve().parent / "data" / "calibration.txt"
AUTO_THRESHOLD_BYTES = 256 * 1024  # "auto": int8 where float32 keys and values take this much a token or more


def wants_int8(kv_dtype: str, float32_bytes_per_token: int) -> bool:
    """Whether the ``KV_CACHE_DTYPE`` setting asks for int8 keys and values for this model (int4 ones are made from
    the int8 graph: its scales per channel are theirs too)."""
    if kv_dtype == "auto":
        return float32_bytes_per_token >= AUTO_THRESHOLD_BYTES
    return kv_dtype in ("int8", "int4")


def int8_model(model_file: Path, spec: DecoderSpec, calibration_ids: np.ndarray, threads: int) -> Path:
    """The int8-cache graph beside ``model_file`` (a float32-cache graph in the host's prepacked folder), made now
    if missing."""
    target = model_file.parent / QUANT_FILE
    if target.is_file():
        return target
    with open(model_file.parent / ".kv-int8.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # workers starting at once: one makes it, the others wait
        if not target.is_file():
            keys, values, plain_keys = calibrate(model_file, spec, calibration_ids, threads)
            np.save(model_file.parent / INT4_KEYS_FILE, _scales(plain_keys))  # before the graph: it says both exist
            _write(model_file, target, keys, values, spec)
    return target


def int4_key_scales(model: Any, graph_file: Path, op_type: str) -> None:
    """Give the ``op_type`` nodes of ``model`` (int4 operators made from the int8 graph ``graph_file``) the keys'
    scales of their own (``INT4_KEYS_FILE``), as initializers."""
    from onnx import numpy_helper

    scales = np.load(graph_file.parent / INT4_KEYS_FILE)
    replaced = set()
    for node in model.graph.node:
        if node.op_type == op_type:
            layer = _layer(node)
            name = f"kv_int4.key_scale.{layer}"
            model.graph.initializer.append(numpy_helper.from_array(scales[layer][None, :, None, :], name))
            replaced.add(node.input[12])
            node.input[12] = name
    kept = [tensor for tensor in model.graph.initializer if tensor.name not in replaced]  # unused: ONNX Runtime
    del model.graph.initializer[:]  # would warn of each at every session
    model.graph.initializer.extend(kept)


def _layer(node: Any) -> int:
    """The layer of an attention node, from its past keys' name (``past_key_values.<layer>.key``)."""
    return int(node.input[3].split(".")[1])


def _scales(largest: np.ndarray) -> np.ndarray:
    """Scales of magnitudes up to ``largest`` (with headroom) in int8 units."""
    return (np.maximum(largest, 1e-6) * HEADROOM / 127).astype(np.float32)


def calibrate(model_file: Path, spec: DecoderSpec, ids: np.ndarray,
              threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer, head and channel, the largest magnitude of the keys (rotation-proof) and values the float32 graph
    computes for ``ids``, and of the keys channel by channel: three arrays of ``[layers, kv_heads, head_size]``."""
    from phi_api.engine.runtime.pool import KVPool
    from phi_api.engine.runtime.session import Decoder

    decoder = Decoder(model_file, spec, threads)
    pool = KVPool(decoder.spec, 1, len(ids))
    try:
        for start in range(0, len(ids), 256):
            chunk = ids[start:start + 256]
            decoder.step(pool, 0, chunk[None, :], np.array([start]), True)
        count, half = len(ids), spec.head_size // 2
        keys, values, plain = [], [], []
        for layer in range(spec.layers):
            key = pool.keys[layer][0, :, :count].astype(np.float64)
            pair = np.sqrt(key[..., :half] ** 2 + key[..., half:2 * half] ** 2).max(axis=1)  # rotation-proof
            largest = np.abs(key).max(axis=1)
            plain.append(largest.copy())
            largest[:, :half] = pair
            largest[:, half:2 * half] = pair
            keys.append(largest)
            values.append(np.abs(pool.values[layer][0, :, :count]).max(axis=1))
    finally:
        decoder.unbind()
        pool.close()
    return np.array(keys), np.array(values), np.array(plain)


def _write(model_file: Path, target: Path, keys: np.ndarray, values: np.ndarray, spec: DecoderSpec) -> None:
    """``model_file``'s graph with int8 caches and these scales, written to ``target`` (same folder: the weights'
    external data stays where the graph refers to it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(model_file), load_external_data=False)
    graph = model.graph
    shape = (1, spec.kv_heads, 1, spec.head_size)
    for node in graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        layer = _layer(node)
        inputs = list(node.input) + [""] * (14 - len(node.input))
        inputs[12], inputs[13] = f"kv_int8.key_scale.{layer}", f"kv_int8.value_scale.{layer}"
        del node.input[:]
        node.input.extend(inputs)
        kept = [a for a in node.attribute if a.name not in ("k_quant_type", "v_quant_type", "kv_cache_bit_width")]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                                      helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                                      helper.make_attribute("kv_cache_bit_width", 8)])
        for name, largest in ((inputs[12], keys[layer]), (inputs[13], values[layer])):
            graph.initializer.append(numpy_helper.from_array(_scales(largest).reshape(shape), name))
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past_key_values.", "present.")):
            value.type.tensor_type.elem_type = TensorProto.INT8
    handle, staging = tempfile.mkstemp(prefix=".kv-int8-", suffix=".onnx", dir=model_file.parent)
    os.close(handle)
    try:
        onnx.save(model, staging)
        os.rename(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
