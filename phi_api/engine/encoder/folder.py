"""An encoder model folder, as ``phi-api prepare-model --embedding`` (or ``--encoder``) writes it: ``model.onnx``,
``tokenizer.json`` and ``encoder_config.json`` (its task, pooling, normalization, length, dimensions, the graph's
inputs and output)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phi_api.engine.runtime.folder import fingerprint
from phi_api.errors import FolderError

ENCODER_CONFIG = "encoder_config.json"
ENCODER_FILES = ("model.onnx", "tokenizer.json", ENCODER_CONFIG)
TASKS = ("embed", "rerank")
POOLINGS = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len")
ACTIVATIONS = ("sigmoid", "identity")


def is_encoder_folder(path: str | Path) -> bool:
    """Whether ``path`` holds an encoder's configuration (not a generator's ``genai_config.json``)."""
    return (Path(path) / ENCODER_CONFIG).is_file()


@dataclass(frozen=True)
class EncoderInfo:
    """Facts about an encoder folder, read once at load."""

    path: str
    task: str  # "embed" (vectors) or "rerank" (a score per query and document)
    model_type: str
    pooling: str | None  # how token vectors become one (embed)
    normalize: bool  # vectors scaled to length 1 (embed)
    context_length: int  # tokens one input may hold, special tokens included
    dimensions: int  # a vector's length (embed) or the scores per input (rerank)
    matryoshka_dimensions: tuple[int, ...] | None  # shorter vectors the model was trained to give, if any
    activation: str | None  # how a reranker's logit becomes its score
    inputs: tuple[str, ...]  # the graph's inputs, of input_ids, attention_mask, token_type_ids
    output: str
    size_bytes: int
    modified_at: float
    fingerprint: str
    shape: tuple[int, int, int] = (768, 12, 3072)  # hidden size, attention heads, feed-forward size (config.json)

    @property
    def matryoshka(self) -> bool:
        """Whether the model gives shorter vectors on request (``dimensions``)."""
        return bool(self.matryoshka_dimensions)

    @classmethod
    def read(cls, folder: str | Path) -> EncoderInfo:
        """Read the folder's facts; :class:`FolderError` saying what is wrong when it is not an encoder folder."""
        root = Path(folder)
        missing = [name for name in ENCODER_FILES if not (root / name).is_file()]
        if missing:
            raise FolderError(f"{root} is not an encoder model folder: {', '.join(missing)} missing")
        try:
            config = json.loads((root / ENCODER_CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FolderError(f"{root / ENCODER_CONFIG} is unreadable: {exc}") from None
        if not isinstance(config, dict):
            raise FolderError(f"{root / ENCODER_CONFIG} is not an object")
        return cls._from_config(root, config)

    @classmethod
    def _from_config(cls, root: Path, config: dict[str, Any]) -> EncoderInfo:
        task, pooling, activation = config.get("task"), config.get("pooling"), config.get("activation")
        _one_of("task", task, TASKS)
        if task == "embed":
            _one_of("pooling", pooling, POOLINGS)
        if task == "rerank":
            _one_of("activation", activation, ACTIVATIONS)
        matryoshka = _field(config, "matryoshka_dimensions", lambda value: tuple(
            sorted({int(one) for one in value}, reverse=True)) if value else None, optional=True)
        return cls(path=str(root), task=str(task), model_type=str(config.get("model_type", "bert")),
                   pooling=pooling if task == "embed" else None, normalize=bool(config.get("normalize")),
                   context_length=_field(config, "max_length", int), dimensions=_field(config, "dimensions", int),
                   matryoshka_dimensions=matryoshka, activation=activation if task == "rerank" else None,
                   inputs=_field(config, "inputs", lambda value: tuple(str(name) for name in value)),
                   output=_field(config, "output", str),
                   size_bytes=sum(entry.stat().st_size for entry in os.scandir(root) if entry.is_file()),
                   modified_at=(root / ENCODER_CONFIG).stat().st_mtime, fingerprint=fingerprint(root, config),
                   shape=_shape(root))


def _shape(root: Path) -> tuple[int, int, int]:
    """The model's hidden size, attention heads and feed-forward size from its ``config.json`` (BERT-base's when
    it is missing or says none: a bound of memory, not of correctness)."""
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
        return int(config["hidden_size"]), int(config["num_attention_heads"]), int(config["intermediate_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return EncoderInfo.shape


def _field(config: dict[str, Any], name: str, read: Callable[[Any], Any], optional: bool = False) -> Any:
    """``config[name]`` read by ``read`` (``optional``: None when absent); :class:`FolderError` naming the field
    when it is missing or garbled."""
    try:
        return read(config.get(name) if optional else config[name])
    except (KeyError, TypeError, ValueError):
        raise FolderError(f"{ENCODER_CONFIG}: {name} is missing or not what it should be "
                          f"({config.get(name)!r})") from None


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise FolderError(f"{ENCODER_CONFIG}: {name} must be one of {', '.join(allowed)} (found {value!r})")
