"""The model's decoder graph on ONNX Runtime, run a step at a time over rows that sit at different lengths.

ONNX Runtime GenAI cannot add or remove rows of a running batch on CPU, but
the graph its model builder writes can decode rows of any lengths in one
step: ``GroupQueryAttention`` reads each row's length from the attention
mask (``seqlens_k`` = its sum - 1, the total length = its width) and, with
past and present bound to the same buffer, writes each row's new key and
value at that row's own offset. So every sequence owns a row of one key and
one value buffer per layer (:class:`KVCache`), and a step binds the rows it
advances, which must be contiguous.

A step is either a prompt chunk of one row (the kernel takes several new
tokens on top of past context only for a batch of one), or one new token for
each of ``count`` rows. A batch-of-one loop on this graph reproduced ONNX
Runtime GenAI's greedy tokens bit for bit (its ``Generator`` runs the same
graph the same way). ``run_with_iobinding`` releases the GIL for the step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TOKEN_GRANULE = 256  # the buffers' length grows in steps of this many tokens


def _ort_errors() -> tuple[type[BaseException], ...]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "NotImplemented", "InvalidGraph", "EPFail")
    return tuple(getattr(state, name) for name in names if hasattr(state, name)) + (RuntimeError, OSError)


ORT_ERRORS = _ort_errors()  # what onnxruntime raises (its classes derive from Exception directly)

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32}


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

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_size * np.dtype(self.kv_dtype).itemsize

    @classmethod
    def read(cls, folder: Path, rope_switch: int | None = None) -> "DecoderSpec":
        """The layout ``genai_config.json`` describes (tensor types are read from the graph when it loads)."""
        model = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))["model"]
        decoder = model["decoder"]
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
        )


class KVCache:
    """One key and one value buffer per layer, ``[rows, kv_heads, tokens, head_size]``; a row is a sequence.

    The buffers grow by reallocation (see :meth:`shape_for`) and are freed
    by :meth:`clear`. ``version`` changes whenever they are reallocated, so
    bindings made on the old ones are known to be stale.
    """

    def __init__(self, spec: DecoderSpec) -> None:
        self.spec = spec
        self.rows = 0
        self.tokens = 0
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.version = 0

    @property
    def nbytes(self) -> int:
        """Memory the buffers hold."""
        return self.rows * self.tokens * self.spec.kv_bytes_per_token

    @staticmethod
    def shape_for(rows: int, tokens: int) -> tuple[int, int]:
        """The (rows, tokens) an allocation holding at least ``rows`` x ``tokens`` has: rows doubling up to
        8, then in eights; tokens in steps of :data:`TOKEN_GRANULE` (growing copies everything held)."""
        rows = max(1, rows)
        rounded = 1 << (rows - 1).bit_length() if rows <= 8 else -(-rows // 8) * 8
        return rounded, max(1, -(-tokens // TOKEN_GRANULE)) * TOKEN_GRANULE

    def ensure(self, rows: int, tokens: int) -> None:
        """Make room for at least ``rows`` rows of ``tokens`` tokens, keeping what the buffers hold."""
        if rows <= self.rows and tokens <= self.tokens:
            return
        new_rows, new_tokens = self.shape_for(max(rows, self.rows), max(tokens, self.tokens))
        self.resize(new_rows, new_tokens)

    def resize(self, rows: int, tokens: int) -> None:
        """Reallocate to exactly ``rows`` x ``tokens``, keeping what fits."""
        spec = self.spec
        keep_rows, keep_tokens = min(rows, self.rows), min(tokens, self.tokens)

        def moved(old: np.ndarray) -> np.ndarray:
            new = np.zeros((rows, spec.kv_heads, tokens, spec.head_size), dtype=spec.kv_dtype)
            if keep_rows and keep_tokens:
                new[:keep_rows, :, :keep_tokens] = old[:keep_rows, :, :keep_tokens]
            return new

        self.keys = [moved(old) for old in self.keys] if self.keys else [
            np.zeros((rows, spec.kv_heads, tokens, spec.head_size), dtype=spec.kv_dtype) for _ in range(spec.layers)]
        self.values = [moved(old) for old in self.values] if self.values else [
            np.zeros((rows, spec.kv_heads, tokens, spec.head_size), dtype=spec.kv_dtype) for _ in range(spec.layers)]
        self.rows, self.tokens = rows, tokens
        self.version += 1

    def clear(self) -> None:
        """Free the buffers."""
        self.keys, self.values = [], []
        self.rows = self.tokens = 0
        self.version += 1

    def copy_row(self, source: int, target: int, length: int) -> None:
        """Copy row ``source``'s first ``length`` tokens over row ``target``."""
        if source == target or length == 0:
            return
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[target, :, :length] = buffer[source, :, :length]

    def read(self, row: int, length: int) -> np.ndarray:
        """A copy of row ``row``'s first ``length`` tokens: ``[layers, 2, kv_heads, length, head_size]``."""
        spec = self.spec
        out = np.empty((spec.layers, 2, spec.kv_heads, length, spec.head_size), dtype=spec.kv_dtype)
        for layer in range(spec.layers):
            out[layer, 0] = self.keys[layer][row, :, :length]
            out[layer, 1] = self.values[layer][row, :, :length]
        return out

    def write(self, row: int, data: np.ndarray) -> None:
        """Put ``data`` (as :meth:`read` returns it) at the start of row ``row``."""
        length = data.shape[3]
        for layer in range(self.spec.layers):
            self.keys[layer][row, :, :length] = data[layer, 0]
            self.values[layer][row, :, :length] = data[layer, 1]


class Decoder:
    """An ONNX Runtime session of the decoder graph, with ``threads`` intra-op threads.

    Create it in the process (and thread) that runs it: a session made
    before a fork computes on one thread in the child.
    """

    def __init__(self, model_file: Path, spec: DecoderSpec, threads: int) -> None:
        import onnxruntime as ort

        self._ort = ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        types = {value.name: value.type for value in self.session.get_inputs()}
        self.spec = DecoderSpec(**{
            **spec.__dict__,
            "kv_dtype": _NUMPY_TYPES[types[spec.past_key % 0]],
            "ids_dtype": _NUMPY_TYPES[types[spec.input_ids]],
            "mask_dtype": _NUMPY_TYPES[types[spec.attention_mask]],
        })
        self._bindings: dict[tuple[int, int, int], Any] = {}
        self._logits = np.zeros((0, 1, spec.vocab_size), dtype=np.float32)
        self._bound: tuple[KVCache, int] | None = None  # the buffers (and their version) the bindings use

    def step(self, kv: KVCache, first: int, ids: np.ndarray, past: np.ndarray, prefill: bool) -> np.ndarray:
        """Advance rows ``first``..``first + len(ids) - 1`` by ``ids`` (``[rows, new_tokens]``; several new
        tokens only for one row, a prompt chunk: ``prefill``), each row holding ``past[i]`` tokens; returns
        each row's next-token logits (``[rows, vocab]``, valid until the next step)."""
        spec = self.spec
        count, new = ids.shape
        lengths = past.astype(np.int64) + new
        mask = (np.arange(int(lengths.max()))[None, :] < lengths[:, None]).astype(spec.mask_dtype)
        binding = self._binding(kv, first, count, new)
        binding.bind_cpu_input(spec.input_ids, np.ascontiguousarray(ids, dtype=spec.ids_dtype))
        binding.bind_cpu_input(spec.attention_mask, mask)
        if new > 1:
            binding.bind_output(spec.logits)
        self.session.run_with_iobinding(binding)
        if new > 1:
            return binding.get_outputs()[-1].numpy()[:, -1, :]
        return self._logits[first:first + count, 0, :]

    def _binding(self, kv: KVCache, first: int, count: int, new: int) -> Any:
        """The I/O binding of these rows' buffers, kept while the buffers stay where they are."""
        if self._bound is None or self._bound[0] is not kv or self._bound[1] != kv.version:
            self._bindings.clear()
            self._logits = np.zeros((kv.rows, 1, self.spec.vocab_size), dtype=np.float32)
            self._bound = (kv, kv.version)
        key = (first, count, int(new > 1))
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bind(kv, first, count, logits=new == 1)
            if len(self._bindings) > 64:
                self._bindings.clear()
            self._bindings[key] = binding
        return binding

    def _bind(self, kv: KVCache, first: int, count: int, logits: bool) -> Any:
        spec, ort = self.spec, self._ort
        binding = self.session.io_binding()
        for layer in range(spec.layers):
            for past, present, buffers in ((spec.past_key, spec.present_key, kv.keys),
                                           (spec.past_value, spec.present_value, kv.values)):
                value = ort.OrtValue.ortvalue_from_numpy(buffers[layer][first:first + count])
                binding.bind_ortvalue_input(past % layer, value)  # past and present share the buffer
                binding.bind_ortvalue_output(present % layer, value)
        if logits:
            binding.bind_ortvalue_output(spec.logits,
                                         ort.OrtValue.ortvalue_from_numpy(self._logits[first:first + count]))
        return binding
