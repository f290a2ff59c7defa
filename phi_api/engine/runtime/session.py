"""The model's decoder graph on ONNX Runtime, run a step at a time over rows that sit at different lengths.

ONNX Runtime GenAI cannot add or remove rows of a running batch on CPU, but
the graph its model builder writes can decode rows of any lengths in one
step: ``GroupQueryAttention`` reads each row's length from the attention
mask (``seqlens_k`` = its sum - 1, the total length = its width) and, with
past and present bound to the same buffer, writes each row's new key and
value at that row's own offset. So every sequence owns a row of one key and
one value buffer per layer (:class:`phi_api.engine.kv.cache.KVCache`), and a step binds the rows it
advances, which must be contiguous.

The rows live in a :class:`~phi_api.engine.runtime.pool.KVPool`, reserved once,
so the bindings of a set of rows are made once and kept. A step is either a
prompt chunk of one row (the kernel takes several new tokens on top of past
context only for a batch of one), or one new token for each of ``count``
rows. A batch-of-one loop on this graph reproduced ONNX
Runtime GenAI's greedy tokens bit for bit (its ``Generator`` runs the same
graph the same way). ``run_with_iobinding`` releases the GIL for the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from phi_api.engine.runtime.logits import LOGITS_FROM
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.spec import DecoderSpec


def _ort_errors() -> tuple[type[BaseException], ...]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "NotImplemented", "InvalidGraph", "EPFail")
    return tuple(getattr(state, name) for name in names if hasattr(state, name)) + (RuntimeError, OSError)


ORT_ERRORS = _ort_errors()  # what onnxruntime raises (its classes derive from Exception directly)

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
                "tensor(uint8)": np.uint8, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32}


class Decoder:
    """An ONNX Runtime session of the decoder graph, with ``threads`` intra-op threads.

    Create it in the process (and thread) that runs it: a session made
    before a fork computes on one thread in the child.
    """

    def __init__(self, model_file: Path, spec: DecoderSpec, threads: int, profile: Path | None = None) -> None:
        """``profile``: where ONNX Runtime's profiler writes each operator's time (a file name's prefix), for
        ``phi-api bench profile``; the file is complete once :meth:`end_profiling` returns its path."""
        import onnxruntime as ort

        self._ort = ort
        options = ort.SessionOptions()
        if profile is not None:
            options.enable_profiling = True
            options.profile_file_prefix = str(profile)
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if spec.custom_ops:
            options.register_custom_ops_library(spec.custom_ops)
        self.session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        inputs = {value.name: value for value in self.session.get_inputs()}
        types = {name: value.type for name, value in inputs.items()}
        width = inputs[spec.past_key % 0].shape[3]
        self.spec = DecoderSpec(**{
            **spec.__dict__,
            "kv_dtype": _NUMPY_TYPES[types[spec.past_key % 0]],
            "kv_width": width if isinstance(width, int) and width != spec.head_size else 0,
            "ids_dtype": _NUMPY_TYPES[types[spec.input_ids]],
            "mask_dtype": _NUMPY_TYPES[types[spec.attention_mask]],
        })
        self._bindings: dict[tuple[int, int, int], Any] = {}
        self._logits = np.zeros((0, 1, spec.vocab_size), dtype=np.float32)
        self._bound: KVPool | None = None  # the pool the bindings use
        # The graph's first position whose logits a step computes (engine.runtime.logits), where it takes one:
        # the last one alone (a one-token step's only one) or every one.
        self._logits_from = {every: np.array([0 if every else -1], dtype=np.int64)
                             for every in (False, True)} if LOGITS_FROM in inputs else None

    def step(self, pool: KVPool, first: int, ids: np.ndarray, past: np.ndarray, prefill: bool,
             every_position: bool = False) -> np.ndarray:
        """Advance rows ``first``..``first + len(ids) - 1`` by ``ids`` (``[rows, new_tokens]``; several new
        tokens for several rows only where the graph's attention takes them, :attr:`DecoderSpec.multi_token_rows`),
        each row holding ``past[i]`` tokens; returns each row's next-token logits (``[rows, vocab]``, valid until the
        next step), or with ``every_position`` the logits after each new token (``[rows, new_tokens, vocab]``)."""
        spec = self.spec
        count, new = ids.shape
        lengths = past.astype(np.int64) + new
        mask = (np.arange(int(lengths.max()))[None, :] < lengths[:, None]).astype(spec.mask_dtype)
        binding = self._binding(pool, first, count, new)
        binding.bind_cpu_input(spec.input_ids, np.ascontiguousarray(ids, dtype=spec.ids_dtype))
        binding.bind_cpu_input(spec.attention_mask, mask)
        if self._logits_from is not None:
            binding.bind_cpu_input(LOGITS_FROM, self._logits_from[every_position])
        if new > 1:
            binding.bind_output(spec.logits)
        self.session.run_with_iobinding(binding)
        if new > 1:
            logits = binding.get_outputs()[-1].numpy()
            return logits if every_position else logits[:, -1, :]
        return self._logits[first:first + count] if every_position else self._logits[first:first + count, 0, :]

    def end_profiling(self) -> Path:
        """Stop the profiler (made with ``profile``): the file it wrote."""
        return Path(self.session.end_profiling())

    def unbind(self) -> None:
        """Forget the bindings (before the pool they use is closed)."""
        self._bindings.clear()
        self._bound = None

    def _binding(self, pool: KVPool, first: int, count: int, new: int) -> Any:
        """The I/O binding of these rows' buffers, made once per pool."""
        if self._bound is not pool:
            self._bindings.clear()
            self._logits = np.zeros((pool.rows, 1, self.spec.vocab_size), dtype=np.float32)
            self._bound = pool
        key = (first, count, int(new > 1))
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = self._bind(pool, first, count, logits=new == 1)
        return binding

    def _bind(self, pool: KVPool, first: int, count: int, logits: bool) -> Any:
        spec, ort = self.spec, self._ort
        binding = self.session.io_binding()
        for layer in range(spec.layers):
            for past, present, buffers in ((spec.past_key, spec.present_key, pool.keys),
                                           (spec.past_value, spec.present_value, pool.values)):
                value = ort.OrtValue.ortvalue_from_numpy(buffers[layer][first:first + count])
                binding.bind_ortvalue_input(past % layer, value)  # past and present share the buffer
                binding.bind_ortvalue_output(present % layer, value)
        if logits:
            binding.bind_ortvalue_output(spec.logits,
                                         ort.OrtValue.ortvalue_from_numpy(self._logits[first:first + count]))
        return binding
