"""How a model becomes an engine: its folder checked, its runtime loaded, its engine configured from the settings."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from phi_api.engine import EncoderEngine, EncoderInfo, Engine, EngineConfig, SharedBudget, is_encoder_folder
from phi_api.errors import FolderError, ModelLoadingError
from phi_api.models.sampling import sampling_defaults
from phi_api.models.specs import ModelSpec, task_mismatch
from phi_api.settings import Settings, engine_values

if TYPE_CHECKING:
    from phi_api.engine.runtime.model import LanguageModel


def load_engine(settings: Settings, spec: ModelSpec, memory: SharedBudget | None = None) -> Engine | EncoderEngine:
    """Load the model ``spec`` names, with its own engine options over ``settings``, its keys and values in the
    worker's ``memory``; raises :class:`ModelLoadingError` with the model, its path and the cause."""
    if os.path.isdir(spec.path):
        try:
            mismatch = task_mismatch(spec.path, spec.task)
        except (FolderError, OSError) as exc:
            raise ModelLoadingError(spec.path, str(exc), spec.id) from exc
        if mismatch is not None:
            raise ModelLoadingError(spec.path, f"declared for the task {spec.task}, but it {mismatch}", spec.id)
        if is_encoder_folder(spec.path):
            return _load_encoder(settings, spec)
    from google.protobuf.message import DecodeError

    from phi_api.engine.runtime import oga
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.session import ORT_ERRORS
    from phi_api.errors import GuidanceError, KernelError, PrepackError
    from phi_api.settings import cache_root

    path = spec.path
    settings = dataclasses.replace(settings, **spec.options)
    if not os.path.isdir(path):
        raise ModelLoadingError(path, "no such directory", spec.id)
    _require_generator(path, spec.id)
    def language_model(folder: str) -> LanguageModel:
        try:
            return LanguageModel(folder, cache_dir=cache_root() / "runtime", kv_dtype=settings.KV_CACHE_DTYPE,
                                 int4_kernel=settings.INT4_KERNEL, attention_kernel=settings.ATTENTION_KERNEL)
        except (oga.OgaError, PrepackError, GuidanceError, KernelError) as exc:
            raise ModelLoadingError(folder, str(exc), spec.id) from exc
        except ORT_ERRORS + (DecodeError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadingError(folder, f"unreadable model ({type(exc).__name__}: {exc})", spec.id) from exc

    model = language_model(path)
    draft = _draft_model(settings.SPECULATIVE_DRAFT_MODEL, model, language_model, spec.id)
    config = engine_config(settings, spec.id).replace(sampling_defaults=sampling_defaults(settings, path))
    return Engine(model, config, memory, draft=draft)


def _draft_model(folder: str, model: LanguageModel, language_model: Callable[[str], LanguageModel],
                 model_id: str) -> LanguageModel | None:
    """The draft model in ``folder`` for ``model`` (None: no folder given), refused unless it is a generator of the
    same vocabulary."""
    if not folder:
        return None
    from phi_api.engine.sched.drafts import vocabulary_mismatch

    _require_generator(folder, model_id, "the draft model (SPECULATIVE_DRAFT_MODEL): ")
    draft = language_model(folder)
    mismatch = vocabulary_mismatch(model, draft)
    if mismatch is not None:
        raise ModelLoadingError(folder, f"the draft model cannot draft for {model_id}: {mismatch}", model_id)
    return draft


def _require_generator(folder: str, model_id: str, role: str = "") -> None:
    """Refuse ``folder`` unless it holds an ONNX Runtime GenAI model (``role``: which of the model's folders)."""
    if not os.path.isfile(os.path.join(folder, "genai_config.json")):
        raise ModelLoadingError(folder, f"{role}genai_config.json not found (not an ONNX Runtime GenAI model folder)",
                                model_id)


def _load_encoder(settings: Settings, spec: ModelSpec) -> EncoderEngine:
    """An encoder folder's engine (its session is made by each worker's encoder thread, after the fork)."""
    try:
        info = EncoderInfo.read(spec.path)
    except (FolderError, OSError) as exc:
        raise ModelLoadingError(spec.path, str(exc), spec.id) from exc
    from phi_api.engine.encoder.session import shared_model_file
    from phi_api.engine.runtime.session import ORT_ERRORS
    from phi_api.errors import PrepackError
    from phi_api.settings import cache_root

    try:
        model_file = shared_model_file(Path(info.path) / "model.onnx", info.inputs, info.output,
                                       cache_root() / "runtime")
    except ORT_ERRORS + (PrepackError,) as exc:
        raise ModelLoadingError(spec.path, f"unreadable model ({type(exc).__name__}: {exc})", spec.id) from exc
    return EncoderEngine(info, engine_config(dataclasses.replace(settings, **spec.options), spec.id), model_file)


def engine_config(settings: Settings, name: str = "") -> EngineConfig:
    """A model's engine configuration, from the server's settings with the model's own options applied."""
    return EngineConfig(name=name, **engine_values(settings))
