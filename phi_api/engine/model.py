"""The loaded model: weights, tokenizer, chat template, and what its folder says about it."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phi_api.engine import oga, vocab
from phi_api.engine.native import new_lock

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


class ChatTemplateError(ValueError):
    """The chat template refused the messages (for example, roles that do not alternate)."""


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
    kv_bytes_per_token: int = 0
    template_knows_tools: bool = False
    chat_template: str = ""
    size_bytes: int = 0
    modified_at: float = 0.0

    @classmethod
    def read(cls, folder: str) -> "ModelInfo":
        """Read the folder's configuration; raises ``OSError``/``ValueError`` if it is not a model folder."""
        root = Path(folder)
        config = json.loads((root / "genai_config.json").read_text(encoding="utf-8"))
        model = config["model"]
        decoder = model.get("decoder", {})
        eos = model.get("eos_token_id", [])
        template = _chat_template(root)
        return cls(
            path=str(root),
            model_type=str(model.get("type", "unknown")),
            context_length=int(model["context_length"]),
            vocab_size=int(model.get("vocab_size", 0)),
            eos_token_ids=frozenset(eos if isinstance(eos, list) else [eos]),
            has_chat_template=bool(template),
            template_knows_tools="tools" in template,
            chat_template=template or PHI3_CHAT_TEMPLATE,
            size_bytes=sum(entry.stat().st_size for entry in os.scandir(root) if entry.is_file()),
            modified_at=(root / "genai_config.json").stat().st_mtime,
            fingerprint=_fingerprint(root, config),
            # keys and values, per layer, in float32 (the CPU models' KV type)
            kv_bytes_per_token=2 * 4 * int(decoder.get("num_hidden_layers", 0))
            * int(decoder.get("num_key_value_heads", 0)) * int(decoder.get("head_size", 0)),
        )


def _longest_token_bytes(tokenizer_json: Path) -> int:
    """Bytes of the vocabulary's longest token; 0 when the folder has no readable ``tokenizer.json``.

    Read once, at load (before gunicorn forks), without keeping the vocabulary:
    workers that never answer with log-probabilities never load it.
    """
    try:
        return max((len(piece) for piece in vocab.token_bytes(tokenizer_json).values()), default=0)
    except (OSError, ValueError):
        return 0


def _chat_template(root: Path) -> str:
    """The folder's own chat template text ("" when it has none)."""
    if (root / "chat_template.jinja").is_file():
        return (root / "chat_template.jinja").read_text(encoding="utf-8")
    try:
        tokenizer_config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else ""


def _fingerprint(root: Path, config: dict[str, Any]) -> str:
    """A short, stable id of the build: phi-api's version, the model's configuration and its files' sizes."""
    from phi_api import __version__

    digest = hashlib.sha256(f"phi-api {__version__};".encode("utf-8"))
    digest.update(json.dumps(config, sort_keys=True).encode("utf-8"))
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_file() and not entry.name.startswith("."):
            digest.update(f"{entry.name}:{entry.stat().st_size};".encode("utf-8"))
    return "fp_" + digest.hexdigest()[:12]


class LanguageModel:
    """An ONNX Runtime GenAI model folder, loaded once and shared by every generation."""

    def __init__(self, folder: str, *, intra_op_threads: int) -> None:
        self.info = ModelInfo.read(folder)
        self.model = oga.Model(folder, intra_op_threads=intra_op_threads)
        # The C API promises no thread safety, so each tokenizer's calls take turns.
        # Requests (encode, templates) and the engine threads (streaming decode) have
        # one each: a long prompt being encoded never stalls running generations.
        self._tokenizer = oga.Tokenizer(self.model)
        self._tokenizer_lock = new_lock()
        self._stream_tokenizer = oga.Tokenizer(self.model)
        self._stream_lock = new_lock()
        self.longest_token_bytes = _longest_token_bytes(Path(folder) / "tokenizer.json")

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, exactly as the model will see them."""
        with self._tokenizer_lock:
            return self._tokenizer.encode(text)

    def decode(self, tokens: Any) -> str:
        """Text of ``tokens``."""
        with self._tokenizer_lock:
            return self._tokenizer.decode(tokens)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages`` (and ``tools``): the folder's own chat template, else the Phi-3.5 one."""
        template = None if self.info.has_chat_template else PHI3_CHAT_TEMPLATE
        tools_json = json.dumps(tools) if tools else None
        with self._tokenizer_lock:
            try:
                return self._tokenizer.apply_chat_template(json.dumps(messages), template=template,
                                                           tools_json=tools_json,
                                                           add_generation_prompt=add_generation_prompt)
            except oga.OgaError as exc:
                raise ChatTemplateError(str(exc)) from exc

    def new_generator(self, search_options: dict[str, float | bool],
                      guidance: tuple[str, str] | None = None) -> oga.Generator:
        """A generator for one sequence with these search options (and grammar, if any)."""
        return oga.Generator(self.model, search_options, guidance)

    @functools.cached_property
    def token_bytes(self) -> dict[int, bytes]:
        """Token id -> the bytes it stands for (read from tokenizer.json on first use)."""
        return vocab.token_bytes(Path(self.info.path) / "tokenizer.json")

    def create_stream(self) -> "LockedStream":
        """An incremental decoder for one generation."""
        with self._stream_lock:
            return LockedStream(self._stream_tokenizer.create_stream(), self._stream_lock)


class LockedStream:
    """A tokenizer stream whose calls take turns with the shared tokenizer's."""

    def __init__(self, stream: oga.TokenizerStream, lock: Any) -> None:
        self._stream = stream
        self._lock = lock

    def decode(self, token: int) -> bytes:
        """The UTF-8 bytes this token completes (often none)."""
        with self._lock:
            return self._stream.decode(token)

    def close(self) -> None:
        """Free the stream."""
        with self._lock:
            self._stream.close()
