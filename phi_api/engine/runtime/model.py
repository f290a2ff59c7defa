"""The loaded model: tokenizer, chat template, the decoder graph's host copy, and what its folder says."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import phi_api.engine.runtime.oga as oga  # the submodules, not the package (which imports this module)
from phi_api.engine.runtime.folder import (
    CONFIG_FILE,
    ModelFolder,
    fim_tokens,
    fingerprint,
    marker_tokens,
    prompt_prefix,
    think_markers,
)
from phi_api.engine.runtime.template import reads
from phi_api.engine.runtime.template import render as render_template
from phi_api.engine.threads.native import new_lock
from phi_api.errors import ChatTemplateError, KernelError

if TYPE_CHECKING:
    from phi_api.engine.runtime.session import Decoder
    from phi_api.engine.runtime.spec import DecoderSpec
    from phi_api.engine.sampling.guidance import Guide

log = logging.getLogger(__name__)

# The Phi-3.5 chat format of the specification, for model folders that ship no
# template of their own (the official Phi-3.5 ONNX folders do ship this one).
PHI3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a model folder, read from its ``genai_config.json``."""

    path: str
    model_type: str
    context_length: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    has_chat_template: bool
    fingerprint: str
    template_knows_tools: bool = False
    chat_template: str = ""
    size_bytes: int = 0
    modified_at: float = 0.0
    decoder_file: str = "model.onnx"
    rope_switch: int | None = None  # LongRoPE: sequences longer than this use the long rotary factors
    fim_tokens: tuple[int, int, int] | None = None  # fill-in-the-middle: prefix, suffix, middle (None: none)
    think_markers: tuple[str, str] | None = None  # a reasoning model's thinking markers, start and end
    think_token_ids: tuple[int, int] | None = None  # their token ids
    added_tokens: frozenset[str] = frozenset()  # the tokenizer's added tokens (which tool call markers it has)
    markers: tuple[tuple[int, str], ...] = ()  # ids and texts of call and thinking markers: decoded as text, always
    template_tokens: tuple[tuple[str, str], ...] = ()  # bos_token and eos_token, as a chat template reads them
    prompt_prefix: tuple[int, ...] = ()  # what the tokenizer puts before a text (<bos>): a raw prompt starts with it

    @classmethod
    def read(cls, folder: str) -> ModelInfo:
        """Read the folder's configuration; raises ``OSError``/``ValueError`` if it is not a model folder."""
        read = ModelFolder.read(folder)
        root, model = read.root, read.model
        eos = model.get("eos_token_id", [])
        template = read.chat_template()
        tokenizer = read.tokenizer()  # read once: it can be megabytes
        added = read.added_tokens(tokenizer)
        markers = think_markers(added)
        decoder_file = read.decoder_file
        return cls(
            path=str(root),
            model_type=str(model.get("type", "unknown")),
            context_length=int(model["context_length"]),
            vocab_size=int(model.get("vocab_size", 0)),
            eos_token_ids=frozenset(eos if isinstance(eos, list) else [eos]),
            has_chat_template=bool(template),
            template_knows_tools="tools" in reads(template),  # the variable, not the word
            chat_template=template or PHI3_CHAT_TEMPLATE,
            size_bytes=sum(entry.stat().st_size for entry in os.scandir(root) if entry.is_file()),
            modified_at=(root / CONFIG_FILE).stat().st_mtime,
            fingerprint=fingerprint(root, read.config),
            decoder_file=decoder_file,
            rope_switch=_rope_switch(root / decoder_file),
            fim_tokens=fim_tokens(added),
            think_markers=markers,
            think_token_ids=(added[markers[0]], added[markers[1]]) if markers else None,
            added_tokens=frozenset(added),
            markers=marker_tokens(added),
            template_tokens=tuple(sorted(read.template_tokens().items())),
            prompt_prefix=prompt_prefix(tokenizer),
        )


def _rope_switch(graph_file: Path) -> int | None:
    """Where the decoder graph switches LongRoPE to its long factors (its weights are not read; None: it does not).

    The model builder makes LongRoPE models pick their rotary caches with
    ``If(Greater(attention mask width, original_max_position_embeddings))``;
    that constant is the switch. (ONNX Runtime GenAI hard-codes it: 4096
    for every ``phi3`` model, Phi-3.5's value; the graph holds the real one.)
    """
    import onnx

    graph = onnx.load(str(graph_file), load_external_data=False).graph
    producers = {output: node for node in graph.node for output in node.output}
    constants = {node.output[0]: node for node in graph.node if node.op_type == "Constant"}
    switch = None
    for node in graph.node:
        if node.op_type != "If" or "cos_cache" not in node.output:
            continue
        condition = producers.get(node.input[0])
        if condition is not None and condition.op_type == "Greater" and condition.input[1] in constants:
            value = onnx.numpy_helper.to_array(constants[condition.input[1]].attribute[0].t)
            switch = int(value.reshape(-1)[0])
    return switch





class Model(Protocol):
    """The one seam between the engine and a model: what the engine needs from one (:class:`LanguageModel`, or the
    tests' fake): facts about its folder, the layout of its decoder's keys and values, decoder sessions (one per
    engine thread), its tokenizer, chat template and grammars."""

    info: ModelInfo
    spec: DecoderSpec
    longest_token_bytes: int

    @property
    def identity(self) -> str: ...
    @property
    def token_bytes(self) -> dict[int, bytes]: ...
    def new_decoder(self, threads: int) -> Decoder: ...
    def create_stream(self) -> LockedStream: ...
    def encode(self, text: str) -> np.ndarray: ...
    def decode(self, tokens: Any) -> str: ...
    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool, variables: dict[str, Any] | None = None) -> str: ...
    def guide(self, grammar: tuple[str, str]) -> Guide: ...


class LanguageModel:
    """A model folder: its tokenizer (shared, loaded once before gunicorn forks) and its decoder graph.

    Loading checks everything a worker will need: the tokenizer and chat
    template, the host's prepacked copy of the graph (made now if missing,
    see :mod:`engine.runtime.prepack`), a session on it, and the guidance tokenizer.
    The sessions that compute are made by each worker's engine thread
    (:meth:`new_decoder`), after the fork.
    """

    def __init__(self, folder: str, *, cache_dir: Path, kv_dtype: str = "float32", int4_kernel: str = "auto",
                 attention_kernel: str = "auto") -> None:
        from phi_api.engine.runtime.prepack import prepacked_model
        from phi_api.engine.runtime.rewrite import MODEL_FILE as OWN_MODEL_FILE
        from phi_api.engine.runtime.rewrite import own_kernel_graph
        from phi_api.engine.runtime.rowwise import row_wise
        from phi_api.engine.runtime.session import Decoder
        from phi_api.engine.runtime.spec import DecoderSpec
        from phi_api.engine.sampling.guidance import GuideFactory

        root = Path(folder)
        self.info = ModelInfo.read(folder)
        cache_dir = _writable(cache_dir)
        self.model = oga.Model(folder, decoder=str(oga.stub_decoder(cache_dir)))
        # The C API promises no thread safety, so each tokenizer's calls take turns.
        # Requests (encode, templates) and the engine thread (streaming decode) have
        # one each: a long prompt being encoded never stalls running generations.
        self._tokenizer = oga.Tokenizer(self.model)
        self._tokenizer_lock = new_lock()
        self._own_renderer = False  # set once ONNX Runtime GenAI's template engine fails where the sandbox renders
        self._stream_tokenizer = oga.Tokenizer(self.model)
        self._stream_lock = new_lock()
        self._spoken = {token: text.encode() for token, text in self.info.markers}  # decoded as their text
        spec = DecoderSpec.read(root, self.info.rope_switch)
        source, decoder_file = root, self.info.decoder_file
        own = own_kernel_graph(root, decoder_file, cache_dir, int4_kernel)
        if own:  # the graph with phi-api's 4-bit operator, prepacked in turn (its other weights)
            (source, library), decoder_file = own, OWN_MODEL_FILE
            spec = dataclasses.replace(spec, custom_ops=library)
        self.decoder_file = prepacked_model(source, decoder_file, cache_dir / "prepacked", spec)
        self.spec = Decoder(self.decoder_file, spec, threads=1).spec
        loaded, cache = self.decoder_file, "float32"
        if self._int8_wanted(kv_dtype, root):
            from phi_api.engine.runtime.quant import int8_model

            self.decoder_file = int8_model(self.decoder_file, self.spec, self._calibration_ids(),
                                           threads=os.cpu_count() or 1)
            cache = "int4" if kv_dtype == "int4" else "int8"
        if self.decoder_file.parent != root:  # a folder of ours to write the operator's graph in
            self._own_attention(cache, attention_kernel, cache_dir)
        if self.decoder_file != loaded:  # another graph (int8 caches, the attention operator): its tensor types
            self.spec = Decoder(self.decoder_file, self.spec, threads=1).spec
        self.spec = dataclasses.replace(self.spec, row_wise=row_wise(self.decoder_file))
        self.guides = GuideFactory(root / "tokenizer.json", self.info.vocab_size, self.info.eos_token_ids)
        # Read once, at load (before gunicorn forks), without keeping the table: workers that never answer with
        # log-probabilities never hold it.
        self.longest_token_bytes = max(map(len, self.guides.token_bytes().values()), default=0)

    @property
    def identity(self) -> str:
        """The graph file that computes (its path names the source model's and the host's prepacking key) and its
        size and modification time: keys and values stored on disk (:mod:`engine.kv.disk`) are only ever read
        back by the same graph."""
        stat = self.decoder_file.stat()
        return f"{self.decoder_file}:{stat.st_size}:{stat.st_mtime_ns}"

    def _int8_wanted(self, kv_dtype: str, root: Path) -> bool:
        from phi_api.engine.runtime.quant import wants_int8

        if not wants_int8(kv_dtype, self.spec.kv_bytes_per_token):
            return False
        if self.decoder_file.parent == root:  # the host's prepacked copy proved unusable: no folder of ours
            if kv_dtype == "int4":
                raise KernelError(f"int4 keys and values need the host's prepacked copy of {root}, which is unusable")
            import logging

            logging.getLogger(__name__).warning("int8 keys and values need the host's prepacked copy of %s, "
                                                "which is unusable: serving float32 keys and values", root)
            return False
        return True

    def _own_attention(self, cache: str, choice: str, cache_dir: Path) -> None:
        """The graph (keys and values of type ``cache``) with phi-api's attention operator, where ``choice``
        (ATTENTION_KERNEL) and the machine allow: its keys and values then sit in the operator's layout. int4 keys
        and values are the operator's alone: KernelError where it cannot serve."""
        from phi_api.engine.kernels.op import find_library
        from phi_api.engine.runtime.attention import LAYOUT, attention_model, demanded_by

        library, reason = find_library(cache_dir)
        demand = demanded_by(cache, choice)
        if library is None and demand:
            raise KernelError(f"{demand}, but phi-api's kernel library cannot run here: {reason}")
        found = attention_model(self.decoder_file, cache, choice, str(library or ""), self.spec.head_size,
                                self.spec.logits)
        if found is not None:
            self.decoder_file = found
            self.spec = dataclasses.replace(self.spec, custom_ops=str(library), kv_layout=LAYOUT)

    def _calibration_ids(self) -> np.ndarray:
        """Token ids that show the model the kinds of text it meets: prose, code, tables, languages, a chat."""
        from phi_api.engine.runtime.quant import CALIBRATION_TEXT

        chat = self.render_chat([{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": "What is the capital of France?"},
                                 {"role": "assistant", "content": "Paris is the capital of France."},
                                 {"role": "user", "content": "Thanks! Anything else worth knowing?"}])
        text = CALIBRATION_TEXT.read_text(encoding="utf-8")
        return np.concatenate([self.encode(chat), self.encode(text)]).astype(np.int64)

    def new_decoder(self, threads: int) -> Decoder:
        """A session of the decoder graph computing with ``threads`` threads (make it where it will run)."""
        from phi_api.engine.runtime.session import Decoder

        return Decoder(self.decoder_file, self.spec, threads)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, exactly as the model will see them."""
        with self._tokenizer_lock:
            return self._tokenizer.encode(text)

    def decode(self, tokens: Any) -> str:
        """Text of ``tokens``."""
        with self._tokenizer_lock:
            return self._tokenizer.decode(tokens)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True, variables: dict[str, Any] | None = None) -> str:
        """The prompt for ``messages`` (and ``tools``): the folder's own chat template, else the Phi-3.5 one;
        with ``variables`` (what the template reads besides the conversation), rendered by phi-api itself."""
        if variables or self._own_renderer:
            return render_template(self.info.chat_template, messages, tools, add_generation_prompt, variables or {},
                                   dict(self.info.template_tokens))
        template = None if self.info.has_chat_template else PHI3_CHAT_TEMPLATE
        tools_json = json.dumps(tools) if tools else None
        with self._tokenizer_lock:
            try:
                return self._tokenizer.apply_chat_template(json.dumps(messages), template=template,
                                                           tools_json=tools_json,
                                                           add_generation_prompt=add_generation_prompt)
            except oga.OgaError as exc:
                failure = ChatTemplateError(str(exc))
        # ONNX Runtime GenAI's template engine reads a subset of Jinja (not Gemma 3's tool template's filters):
        # when it fails where the sandbox renders, the sandbox renders this model's prompts from now on
        rendered = render_template(self.info.chat_template, messages, tools, add_generation_prompt, {},
                                   dict(self.info.template_tokens))
        self._own_renderer = True
        log.info("the model's chat template is rendered by phi-api's Jinja sandbox (ONNX Runtime GenAI's "
                 "template engine failed on it: %s)", failure)
        return rendered

    def guide(self, grammar: tuple[str, str]) -> Guide:
        """A fresh grammar state for one sequence (compiling takes a while: call off the hub)."""
        return self.guides.guide(*grammar)

    @functools.cached_property
    def token_bytes(self) -> dict[int, bytes]:
        """Token id -> the bytes it stands for (decoded by the tokenizer llguidance built, on first use)."""
        return self.guides.token_bytes()

    def create_stream(self) -> LockedStream:
        """An incremental decoder for one generation."""
        with self._stream_lock:
            return LockedStream(self._stream_tokenizer.create_stream(), self._stream_lock, self._spoken)


def _writable(folder: Path) -> Path:
    """``folder``, made if need be; a private temporary folder when it cannot be written (the prepacked
    model is then made again at each start, in each process that loads the model)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        return folder
    except OSError as exc:
        import logging
        import tempfile

        fallback = Path(tempfile.mkdtemp(prefix="phi-api-runtime-"))
        logging.getLogger(__name__).warning("cannot write %s (%s); using %s for the host's model files: set "
                                            "PHI_API_CACHE_DIR to a writable folder to keep them", folder, exc,
                                            fallback)
        return fallback


class LockedStream:
    """A tokenizer stream whose calls take turns with the shared tokenizer's; the tokens of ``spoken`` are decoded
    as their text, also where the tokenizer holds them special (which its stream skips)."""

    def __init__(self, stream: oga.TokenizerStream, lock: Any, spoken: dict[int, bytes] | None = None) -> None:
        self._stream = stream
        self._lock = lock
        self._spoken = spoken or {}

    def decode(self, token: int) -> bytes:
        """The UTF-8 bytes this token completes (often none)."""
        with self._lock:
            text = self._stream.decode(token)  # (called for every token: the stream keeps its state)
        return text or self._spoken.get(token, text)  # a special marker's text, which the stream skipped

    def close(self) -> None:
        """Free the stream."""
        with self._lock:
            self._stream.close()
