"""A model folder as ONNX Runtime GenAI lays it out: the one reader of its files.

``genai_config.json`` (the model's type, context, vocabulary, end-of-sequence
ids, and the decoder graph's file and tensor names), the chat template
(``chat_template.jinja``, else ``tokenizer_config.json``'s), and which of the
files a model needs are there. The registry checks folders with it, the
loader reads models with it, and preparation checks what it built with it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phi_api.errors import FolderError

CONFIG_FILE = "genai_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"  # Hugging Face's: the authors' sampling defaults
REQUIRED_FILES = (CONFIG_FILE, "tokenizer.json")
# Fill-in-the-middle tokens, prefix, suffix, middle, by family (prompts are laid out prefix-suffix-middle)
FIM_FAMILIES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder2, Granite code
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)
# Thinking markers, start and end (Qwen3, DeepSeek-R1-Distill, Phi-4-mini-reasoning)
THINK_MARKERS = (("<think>", "</think>"),)
# Tool call markers a family's tokenizer may hold as special tokens (Llama 3's <|python_tag|>, Mistral's
# [TOOL_CALLS] and [ARGS], Phi-4-mini's <|tool_call|>): the answer's text keeps them, so calls are read from it
CALL_MARKERS = ("<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "<|tool_call|>", "<|/tool_call|>", "<tool_call>",
                "</tool_call>")


def think_markers(added: dict[str, int]) -> tuple[str, str] | None:
    """The thinking markers (start, end) among a tokenizer's ``added`` tokens, when it has a pair of
    :data:`THINK_MARKERS`: a reasoning model; None for others."""
    return next((pair for pair in THINK_MARKERS if all(marker in added for marker in pair)), None)


def marker_tokens(added: dict[str, int]) -> tuple[tuple[int, str], ...]:
    """The ids and texts of the tool call and thinking markers (:data:`CALL_MARKERS`, :data:`THINK_MARKERS`) among
    a tokenizer's ``added`` tokens: read from the answer's text, so decoded as text even where they are special."""
    markers = (*CALL_MARKERS, *(marker for pair in THINK_MARKERS for marker in pair))
    return tuple((added[marker], marker) for marker in markers if marker in added)


def fim_tokens(added: dict[str, int]) -> tuple[int, int, int] | None:
    """The ids of the fill-in-the-middle tokens (prefix, suffix, middle) among a tokenizer's ``added`` tokens, of
    the first family it has whole (:data:`FIM_FAMILIES`); None without."""
    family = next((family for family in FIM_FAMILIES if all(name in added for name in family)), None)
    return (added[family[0]], added[family[1]], added[family[2]]) if family else None


def prompt_prefix(tokenizer: dict[str, Any]) -> tuple[int, ...]:
    """The special tokens the tokenizer puts before a text of its own (its post-processor's template: Gemma's and
    Llama's ``<bos>``), which ONNX Runtime GenAI's tokenizer leaves out; () for tokenizers that put none."""
    top = tokenizer.get("post_processor")
    nested = top.get("processors") if isinstance(top, dict) and top.get("type") == "Sequence" else None
    for processor in nested if isinstance(nested, list) else [top]:
        if not isinstance(processor, dict) or processor.get("type") != "TemplateProcessing":
            continue
        prefix: list[int] = []
        try:
            for piece in processor.get("single") or []:
                if "SpecialToken" not in piece:
                    break
                prefix += [int(i) for i in processor["special_tokens"][piece["SpecialToken"]["id"]]["ids"]]
        except (KeyError, TypeError, ValueError):
            return ()
        return tuple(prefix)
    return ()


@dataclass(frozen=True)
class ModelFolder:
    """A model folder and its parsed ``genai_config.json``."""

    root: Path
    config: dict[str, Any]

    @classmethod
    def read(cls, path: str | Path) -> ModelFolder:
        """Read ``path``'s configuration; :class:`FolderError` if it has none that can be read."""
        root = Path(path)
        try:
            config = json.loads((root / CONFIG_FILE).read_text(encoding="utf-8"))
            if not isinstance(config, dict) or not isinstance(config["model"], dict):
                raise TypeError("not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FolderError(f"{root} has no readable {CONFIG_FILE}: not a model folder ({exc})") from None
        return cls(root, config)

    @property
    def model(self) -> dict[str, Any]:
        return self.config["model"]

    @property
    def decoder(self) -> dict[str, Any]:
        decoder = self.model.get("decoder", {})
        return decoder if isinstance(decoder, dict) else {}

    @property
    def decoder_file(self) -> str:
        """The decoder graph's file name."""
        return str(self.decoder.get("filename", "model.onnx"))

    def missing_files(self, extra: tuple[str, ...] = ()) -> list[str]:
        """The files a model needs (its configuration, tokenizer and graph, and ``extra``) that are not there."""
        names = (*REQUIRED_FILES, self.decoder_file, *extra)
        return [name for name in dict.fromkeys(names) if not (self.root / name).is_file()]

    def generation_config(self) -> dict[str, Any]:
        """``generation_config.json``, parsed ({} when there is none or it cannot be read)."""
        try:
            config = json.loads((self.root / GENERATION_CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}

    def tokenizer(self) -> dict[str, Any]:
        """``tokenizer.json``, parsed ({} when it cannot be read); it can be megabytes: read it once."""
        try:
            tokenizer = json.loads((self.root / "tokenizer.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return tokenizer if isinstance(tokenizer, dict) else {}

    def added_tokens(self, tokenizer: dict[str, Any] | None = None) -> dict[str, int]:
        """The tokenizer's added tokens (special or not): text -> id ({} when they cannot be read)."""
        tokenizer = self.tokenizer() if tokenizer is None else tokenizer
        try:
            return {token["content"]: int(token["id"]) for token in tokenizer.get("added_tokens", [])}
        except (KeyError, TypeError, ValueError, AttributeError):
            return {}

    def template_tokens(self) -> dict[str, str]:
        """``bos_token`` and ``eos_token`` as a chat template reads them (from ``tokenizer_config.json``)."""
        try:
            config = json.loads((self.root / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        tokens = {}
        for name in ("bos_token", "eos_token"):
            value = config.get(name) if isinstance(config, dict) else None
            value = value.get("content") if isinstance(value, dict) else value  # older files: an object
            if isinstance(value, str):
                tokens[name] = value
        return tokens

    def chat_template(self) -> str:
        """The folder's own chat template text ("" when it has none)."""
        jinja = self.root / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        try:
            tokenizer_config = json.loads((self.root / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return ""
        template = tokenizer_config.get("chat_template") if isinstance(tokenizer_config, dict) else None
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        return template if isinstance(template, str) else ""


def fingerprint(root: Path, config: dict[str, Any]) -> str:
    """A short, stable id of a model folder's build: phi-api's version, the model's configuration and its files'
    sizes (a generator's and an encoder's alike)."""
    from phi_api.version import __version__

    digest = hashlib.sha256(f"phi-api {__version__};".encode())
    digest.update(json.dumps(config, sort_keys=True).encode("utf-8"))
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_file() and not entry.name.startswith("."):
            digest.update(f"{entry.name}:{entry.stat().st_size};".encode())
    return "fp_" + digest.hexdigest()[:12]
