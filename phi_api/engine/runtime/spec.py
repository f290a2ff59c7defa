"""A decoder graph's layout: its inputs and outputs, and how its keys and values are shaped and typed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DecoderSpec:
    """The decoder graph's inputs and outputs, and its key/value layout."""

    layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    logits: str = "logits"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"
    kv_dtype: Any = np.float32
    ids_dtype: Any = np.int64
    mask_dtype: Any = np.int64
    rope_switch: int | None = None  # LongRoPE: a sequence longer than this uses the long factors
    # Sliding-window layers (Gemma 3): ONNX Runtime's attention masks what lies past the window itself, but wants
    # every key/value buffer to hold at least a window's tokens.
    window: int = 0
    # The custom-operator library the graph needs (phi-api's 4-bit kernel), registered with every session of it.
    custom_ops: str = ""
    # How a head's run of tokens is laid out: "" as [tokens, head_size]; "tiles16" as phi-api's attention operator
    # keeps it (tiles of 16 tokens: whole tiles are what can be copied, kept or stored apart).
    kv_layout: str = ""
    # Elements a token of one head takes in the cache (0: head_size; int4 keys and values take head_size / 2 + 4
    # bytes, their nibbles and their scale, read from the graph's declared cache).
    kv_width: int = 0
    # Every operator computes a row on its own, in the same order at any row count (engine.runtime.rowwise): a step
    # needs no padding row to give a row the same bits alone and beside others.
    row_wise: bool = False

    @property
    def multi_token_rows(self) -> bool:
        """A step may bring several new tokens to each of several rows (phi-api's attention operator, whose layout
        the cache is in, takes them; ONNX Runtime's GroupQueryAttention only for a batch of one): drafts are then
        checked in the batched step."""
        return self.kv_layout == "tiles16"

    @property
    def kv_granule(self) -> int:
        """The fewest tokens whose keys and values are a range of bytes of their own."""
        return 16 if self.kv_layout == "tiles16" else 1

    @property
    def kv_token_width(self) -> int:
        """Elements of the cache one token of one head takes."""
        return self.kv_width or self.head_size

    @property
    def kv_kind(self) -> str:
        """What keys and values are kept as: ``float32``, ``float16``, ``int8``, or ``int4`` (int8 bytes, a token
        of a head ``head_size / 2 + 4`` of them: its nibbles and its scale)."""
        name = np.dtype(self.kv_dtype).name
        return "int4" if name == "int8" and self.kv_width else name

    @property
    def kv_head_token_bytes(self) -> int:
        """Bytes of the cache one token of one head takes (keys or values)."""
        return self.kv_token_width * np.dtype(self.kv_dtype).itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes in every layer."""
        return 2 * self.layers * self.kv_heads * self.kv_head_token_bytes

    @classmethod
    def read(cls, folder: Path, rope_switch: int | None = None) -> DecoderSpec:
        """The layout ``genai_config.json`` describes (tensor types are read from the graph when it loads)."""
        from phi_api.engine.runtime.folder import ModelFolder

        read = ModelFolder.read(folder)
        model, decoder = read.model, read.decoder
        inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
        return cls(
            layers=int(decoder["num_hidden_layers"]), kv_heads=int(decoder["num_key_value_heads"]),
            head_size=int(decoder["head_size"]), vocab_size=int(model["vocab_size"]),
            input_ids=inputs.get("input_ids", "input_ids"),
            attention_mask=inputs.get("attention_mask", "attention_mask"),
            past_key=inputs.get("past_key_names", "past_key_values.%d.key"),
            past_value=inputs.get("past_value_names", "past_key_values.%d.value"),
            logits=outputs.get("logits", "logits"),
            present_key=outputs.get("present_key_names", "present.%d.key"),
            present_value=outputs.get("present_value_names", "present.%d.value"),
            rope_switch=rope_switch,
            window=int((decoder.get("sliding_window") or {}).get("window_size", 0)),
        )
