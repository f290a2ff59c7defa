"""A thin ctypes binding to ONNX Runtime GenAI's C API (``ort_genai_c.h``): its tokenizer and chat templates.

The engine runs the decoder graph itself (:mod:`engine.runtime`); from ONNX
Runtime GenAI it takes the model folder's tokenizer, its incremental UTF-8
decoder and its chat template renderer. Why ctypes and not the
``onnxruntime_genai`` Python module: the module's calls hold the GIL, and a
long prompt's tokenization would stall every greenlet of the worker; ctypes
releases the GIL around each foreign call. We still import the Python module
first: it loads the ONNX Runtime library the C API depends on, and we call
the very same ``libonnxruntime-genai.so`` it ships.

ONNX Runtime GenAI makes a tokenizer only for a loaded model. So that the
weights are not loaded twice (ONNX Runtime loads them for the engine), the
model is opened with its decoder graph replaced by a stub of one node
(:func:`stub_decoder`): measured on SmolLM2, 98 MB of RSS instead of 175 MB.

Only the calls the server needs are declared. Every ``OgaResult*`` is checked
and turned into :class:`OgaError`; objects are freed by ``close()`` (or by the
garbage collector as a fallback).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from ctypes import POINTER, byref, c_bool, c_char_p, c_int32, c_size_t, c_void_p
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from phi_api.errors import OgaError

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

    if TYPE_CHECKING:  # the functions are set from _SIGNATURES above

        def __getattr__(self, name: str) -> Any: ...

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
        self._handle: c_void_p | None = handle

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
    """A model folder opened for its tokenizer, with ``decoder`` (a path) in place of its decoder graph."""

    _destroy = "OgaDestroyModel"

    def __init__(self, folder: str, *, decoder: str) -> None:
        api = lib()
        config = c_void_p()
        api.check(api.OgaCreateConfig(folder.encode("utf-8"), byref(config)))
        try:
            # ONNX Runtime GenAI joins the file name to the folder as text: give it a relative path, from the folder's
            # real place (the system resolves ".." after a link: a folder reached through a linked parent).
            relative = os.path.relpath(os.path.realpath(decoder), os.path.realpath(folder))
            overlay = {"model": {"decoder": {"filename": relative,
                                             "session_options": {"intra_op_num_threads": 1}}}}
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


def stub_decoder(folder: Path) -> Path:
    """A one-node decoder graph (``input_ids`` -> ``logits``), written once into ``folder``: what the
    tokenizer's model opens instead of the real weights."""
    path = folder / "stub-decoder.onnx"
    if not path.is_file():
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)], "stub",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8  # what onnxruntime 1.31 reads
        folder.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        onnx.save(model, str(staging))
        os.replace(staging, path)
    return path
