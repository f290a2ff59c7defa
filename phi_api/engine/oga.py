"""A thin ctypes binding to ONNX Runtime GenAI's C API (``ort_genai_c.h``).

Why not the ``onnxruntime_genai`` Python module: its ``Generator`` methods
hold the GIL for a whole model step. In a gunicorn gevent worker that stalls
every greenlet: measured, ``GET /v1/models`` took ~300 ms (p50) while one
generation ran. ctypes releases the GIL around each foreign call, so the same
loop through the C API left that request at ~4 ms. We still import the Python
module first: it loads the ONNX Runtime library the C API depends on, and we
call the very same ``libonnxruntime-genai.so`` it ships.

Only the calls the server needs are declared. Every ``OgaResult*`` is checked
and turned into :class:`OgaError`; objects are freed by ``close()`` (or by the
garbage collector as a fallback).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from ctypes import POINTER, byref, c_bool, c_char_p, c_double, c_float, c_int32, c_int64, c_size_t, c_void_p
from typing import Any

import numpy as np


class OgaError(RuntimeError):
    """An error reported by ONNX Runtime GenAI."""


_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "OgaResultGetError": (c_char_p, [c_void_p]),
    "OgaDestroyResult": (None, [c_void_p]),
    "OgaDestroyString": (None, [c_void_p]),
    "OgaCreateConfig": (c_void_p, [c_char_p, POINTER(c_void_p)]),
    "OgaConfigOverlay": (c_void_p, [c_void_p, c_char_p]),
    "OgaDestroyConfig": (None, [c_void_p]),
    "OgaCreateModelFromConfig": (c_void_p, [c_void_p, POINTER(c_void_p)]),
    "OgaDestroyModel": (None, [c_void_p]),
    "OgaCreateTokenizer": (c_void_p, [c_void_p, POINTER(c_void_p)]),
    "OgaDestroyTokenizer": (None, [c_void_p]),
    "OgaCreateSequences": (c_void_p, [POINTER(c_void_p)]),
    "OgaDestroySequences": (None, [c_void_p]),
    "OgaSequencesGetSequenceCount": (c_size_t, [c_void_p, c_size_t]),
    "OgaSequencesGetSequenceData": (POINTER(c_int32), [c_void_p, c_size_t]),
    "OgaTokenizerEncode": (c_void_p, [c_void_p, c_char_p, c_void_p]),
    "OgaTokenizerDecode": (c_void_p, [c_void_p, POINTER(c_int32), c_size_t, POINTER(c_void_p)]),
    "OgaTokenizerApplyChatTemplate": (c_void_p, [c_void_p, c_char_p, c_char_p, c_char_p, c_bool, POINTER(c_void_p)]),
    "OgaCreateTokenizerStream": (c_void_p, [c_void_p, POINTER(c_void_p)]),
    "OgaDestroyTokenizerStream": (None, [c_void_p]),
    "OgaTokenizerStreamDecode": (c_void_p, [c_void_p, c_int32, POINTER(c_char_p)]),
    "OgaCreateGeneratorParams": (c_void_p, [c_void_p, POINTER(c_void_p)]),
    "OgaDestroyGeneratorParams": (None, [c_void_p]),
    "OgaGeneratorParamsSetSearchNumber": (c_void_p, [c_void_p, c_char_p, c_double]),
    "OgaGeneratorParamsSetSearchBool": (c_void_p, [c_void_p, c_char_p, c_bool]),
    "OgaGeneratorParamsSetGuidance": (c_void_p, [c_void_p, c_char_p, c_char_p, c_bool]),
    "OgaCreateGenerator": (c_void_p, [c_void_p, c_void_p, POINTER(c_void_p)]),
    "OgaDestroyGenerator": (None, [c_void_p]),
    "OgaGenerator_IsDone": (c_bool, [c_void_p]),
    "OgaGenerator_AppendTokens": (c_void_p, [c_void_p, POINTER(c_int32), c_size_t]),
    "OgaGenerator_GenerateNextToken": (c_void_p, [c_void_p]),
    "OgaGenerator_GetNextTokens": (c_void_p, [c_void_p, POINTER(POINTER(c_int32)), POINTER(c_size_t)]),
    "OgaGenerator_RewindTo": (c_void_p, [c_void_p, c_size_t]),
    "OgaGenerator_GetLogits": (c_void_p, [c_void_p, POINTER(c_void_p)]),
    "OgaGenerator_SetLogits": (c_void_p, [c_void_p, c_void_p]),
    "OgaTensorGetShapeRank": (c_void_p, [c_void_p, POINTER(c_size_t)]),
    "OgaTensorGetShape": (c_void_p, [c_void_p, POINTER(c_int64), c_size_t]),
    "OgaTensorGetData": (c_void_p, [c_void_p, POINTER(c_void_p)]),
    "OgaDestroyTensor": (None, [c_void_p]),
}


class _Library:
    """The C API, loaded on first use, with each function's signature declared."""

    def __init__(self) -> None:
        import onnxruntime_genai  # loads libonnxruntime, which the C API needs

        path = os.path.join(os.path.dirname(onnxruntime_genai.__file__), "libonnxruntime-genai.so")
        self._dll = ctypes.CDLL(path)
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(self._dll, name)
            function.restype = restype
            function.argtypes = argtypes
            setattr(self, name, function)

    def check(self, result: int | None) -> None:
        """Raise :class:`OgaError` if ``result`` is an error."""
        if result:
            message = self.OgaResultGetError(result)
            self.OgaDestroyResult(result)
            raise OgaError((message or b"unknown error").decode("utf-8", "replace"))

    def take_string(self, pointer: c_void_p) -> str:
        """Copy and free a string the library allocated."""
        try:
            return ctypes.string_at(pointer).decode("utf-8")
        finally:
            self.OgaDestroyString(pointer)


@functools.cache
def lib() -> _Library:
    """The C API, loaded once per process."""
    return _Library()


def _int32_array(tokens: Any) -> np.ndarray:
    return np.ascontiguousarray(tokens, dtype=np.int32)


def _as_int32_pointer(array: np.ndarray) -> Any:
    return array.ctypes.data_as(POINTER(c_int32))


class _Handle:
    """An owned C object, freed once."""

    _destroy: str = ""

    def __init__(self, handle: c_void_p) -> None:
        self._handle = handle

    @property
    def handle(self) -> c_void_p:
        if not self._handle:
            raise OgaError(f"{type(self).__name__} is closed")
        return self._handle

    def close(self) -> None:
        """Free the C object (idempotent; also for an object whose creation failed)."""
        if getattr(self, "_handle", None):
            getattr(lib(), self._destroy)(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


class Model(_Handle):
    """A model folder loaded for CPU, with its decoder's thread settings."""

    _destroy = "OgaDestroyModel"

    def __init__(self, folder: str, *, intra_op_threads: int) -> None:
        api = lib()
        config = c_void_p()
        api.check(api.OgaCreateConfig(folder.encode("utf-8"), byref(config)))
        try:
            overlay = {"model": {"decoder": {"session_options": {
                "intra_op_num_threads": intra_op_threads,
                "inter_op_num_threads": 1,
            }}}}
            api.check(api.OgaConfigOverlay(config, json.dumps(overlay).encode("utf-8")))
            handle = c_void_p()
            api.check(api.OgaCreateModelFromConfig(config, byref(handle)))
        finally:
            api.OgaDestroyConfig(config)
        super().__init__(handle)


class TokenizerStream(_Handle):
    """Decodes one token at a time; returns bytes only once they form whole UTF-8 characters."""

    _destroy = "OgaDestroyTokenizerStream"

    def decode(self, token: int) -> bytes:
        """The bytes this token completes (often empty)."""
        api = lib()
        out = c_char_p()
        api.check(api.OgaTokenizerStreamDecode(self.handle, token, byref(out)))
        return out.value or b""


class Tokenizer(_Handle):
    """The model folder's tokenizer and chat template."""

    _destroy = "OgaDestroyTokenizer"

    def __init__(self, model: Model) -> None:
        api = lib()
        handle = c_void_p()
        api.check(api.OgaCreateTokenizer(model.handle, byref(handle)))
        super().__init__(handle)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as int32."""
        api = lib()
        sequences = c_void_p()
        api.check(api.OgaCreateSequences(byref(sequences)))
        try:
            api.check(api.OgaTokenizerEncode(self.handle, text.encode("utf-8"), sequences))
            count = api.OgaSequencesGetSequenceCount(sequences, 0)
            if count == 0:
                return np.zeros(0, dtype=np.int32)
            data = api.OgaSequencesGetSequenceData(sequences, 0)
            return np.ctypeslib.as_array(data, shape=(count,)).copy()
        finally:
            api.OgaDestroySequences(sequences)

    def decode(self, tokens: Any) -> str:
        """Text of ``tokens`` (special tokens skipped)."""
        api = lib()
        array = _int32_array(tokens)
        out = c_void_p()
        api.check(api.OgaTokenizerDecode(self.handle, _as_int32_pointer(array), len(array), byref(out)))
        return api.take_string(out)

    def apply_chat_template(self, messages_json: str, *, template: str | None = None,
                            tools_json: str | None = None, add_generation_prompt: bool = True) -> str:
        """Render messages with ``template`` or, when it is None, the folder's own chat template."""
        api = lib()
        out = c_void_p()
        api.check(api.OgaTokenizerApplyChatTemplate(
            self.handle,
            template.encode("utf-8") if template is not None else None,
            messages_json.encode("utf-8"),
            tools_json.encode("utf-8") if tools_json is not None else None,
            add_generation_prompt,
            byref(out),
        ))
        return api.take_string(out)

    def create_stream(self) -> TokenizerStream:
        """A fresh incremental decoder."""
        api = lib()
        handle = c_void_p()
        api.check(api.OgaCreateTokenizerStream(self.handle, byref(handle)))
        return TokenizerStream(handle)


class Generator(_Handle):
    """One generation: a KV cache, a sampler and its search options."""

    _destroy = "OgaDestroyGenerator"

    def __init__(self, model: Model, search_options: dict[str, float | bool],
                 guidance: tuple[str, str] | None = None) -> None:
        api = lib()
        params = c_void_p()
        api.check(api.OgaCreateGeneratorParams(model.handle, byref(params)))
        try:
            for name, value in search_options.items():
                if isinstance(value, bool):
                    api.check(api.OgaGeneratorParamsSetSearchBool(params, name.encode(), value))
                else:
                    api.check(api.OgaGeneratorParamsSetSearchNumber(params, name.encode(), float(value)))
            if guidance is not None:
                kind, data = guidance
                api.check(api.OgaGeneratorParamsSetGuidance(params, kind.encode(), data.encode("utf-8"), False))
            handle = c_void_p()
            api.check(api.OgaCreateGenerator(model.handle, params, byref(handle)))
        finally:
            api.OgaDestroyGeneratorParams(params)
        super().__init__(handle)

    def append_tokens(self, tokens: Any) -> None:
        """Run the model over ``tokens`` (prefill, or forced continuation)."""
        api = lib()
        array = _int32_array(tokens)
        api.check(api.OgaGenerator_AppendTokens(self.handle, _as_int32_pointer(array), len(array)))

    def generate_next_token(self) -> int:
        """Compute logits if needed, sample the next token, and return it."""
        api = lib()
        api.check(api.OgaGenerator_GenerateNextToken(self.handle))
        tokens = POINTER(c_int32)()
        count = c_size_t()
        api.check(api.OgaGenerator_GetNextTokens(self.handle, byref(tokens), byref(count)))
        return int(tokens[0])

    def is_done(self) -> bool:
        """True once an end-of-sequence token was sampled or ``max_length`` reached."""
        return bool(lib().OgaGenerator_IsDone(self.handle))

    def rewind_to(self, length: int) -> None:
        """Drop tokens (and their KV cache entries) beyond ``length``."""
        api = lib()
        api.check(api.OgaGenerator_RewindTo(self.handle, length))

    def process_logits(self, process: Any) -> None:
        """Call ``process(logits)`` on the next-token logits (a float32 vector, edited in place) and apply them."""
        api = lib()
        tensor = c_void_p()
        api.check(api.OgaGenerator_GetLogits(self.handle, byref(tensor)))
        try:
            rank = c_size_t()
            api.check(api.OgaTensorGetShapeRank(tensor, byref(rank)))
            shape = (c_int64 * rank.value)()
            api.check(api.OgaTensorGetShape(tensor, shape, rank.value))
            data = c_void_p()
            api.check(api.OgaTensorGetData(tensor, byref(data)))
            logits = np.ctypeslib.as_array(ctypes.cast(data, POINTER(c_float)), shape=(int(shape[rank.value - 1]),))
            process(logits)
            api.check(api.OgaGenerator_SetLogits(self.handle, tensor))
        finally:
            api.OgaDestroyTensor(tensor)
