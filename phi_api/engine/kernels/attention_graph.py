"""A graph of one ``GroupQueryAttention`` node as the model builder writes it for a decoder layer (packed query, key
and value; the cache bound as past and present; rotary tables; int8 keys and values with one scale per head and
channel, or float32 ones), for the operator's tests and ``phi-api bench attention``. The scales are inputs here
(initializers in a real graph), so that a test can choose them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shape:
    """An attention layer's shape: query heads, key/value heads, channels of a head, rotated channels / 2."""

    heads: int
    kv_heads: int
    head_size: int
    rot_half: int
    interleaved: bool = False
    window: int = -1

    @property
    def width(self) -> int:
        """Channels of a token's packed query, key and value."""
        return (self.heads + 2 * self.kv_heads) * self.head_size


PHI35 = Shape(heads=32, kv_heads=32, head_size=96, rot_half=48)  # Phi-3.5-mini's layers
SMOLLM2 = Shape(heads=9, kv_heads=3, head_size=64, rot_half=32)  # the default model's


def gqa_model(shape: Shape, cache_tokens: int, positions: int, *, int8: bool = True) -> Any:
    """The one-node graph: inputs ``qkv [B, S, width]``, ``past_key``/``past_value [B, kv_heads, cache_tokens, D]``,
    ``seqlens_k [B]``, ``total_sequence_length``, ``cos``/``sin [positions, rot_half]`` and, for int8,
    ``key_scale``/``value_scale [1, kv_heads, 1, D]``; outputs ``output``, ``present_key``, ``present_value``."""
    from onnx import TensorProto, helper

    cache_type = TensorProto.INT8 if int8 else TensorProto.FLOAT
    cache: list[str | int | None] = ["B", shape.kv_heads, cache_tokens, shape.head_size]
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["B", "S", shape.width]),
              helper.make_tensor_value_info("past_key", cache_type, cache),
              helper.make_tensor_value_info("past_value", cache_type, cache),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("cos", TensorProto.FLOAT, [positions, shape.rot_half]),
              helper.make_tensor_value_info("sin", TensorProto.FLOAT, [positions, shape.rot_half])]
    names = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos", "sin"]
    attributes: dict[str, Any] = {"num_heads": shape.heads, "kv_num_heads": shape.kv_heads,
                                  "scale": shape.head_size ** -0.5, "do_rotary": 1,
                                  "rotary_interleaved": int(shape.interleaved), "local_window_size": shape.window}
    if int8:
        scales = [1, shape.kv_heads, 1, shape.head_size]
        inputs += [helper.make_tensor_value_info("key_scale", TensorProto.FLOAT, scales),
                   helper.make_tensor_value_info("value_scale", TensorProto.FLOAT, scales)]
        names += ["", "", "", "key_scale", "value_scale"]
        attributes.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            name="attention", domain="com.microsoft", **attributes)
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("present_key", cache_type, None),
               helper.make_tensor_value_info("present_value", cache_type, None)]
    graph = helper.make_graph([node], "attention", inputs, outputs)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)
