"""Model specs: what a model to serve is (id, folder, options), its folder checked, and the declared models.

Declared models come from ``MODELS_FILE``, or ``MODEL_PATH`` and ``MODEL_ID`` for one, or ``MODEL`` by name (pulled
at start-up unless it is in the cache).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phi_api.engine import EncoderInfo, is_encoder_folder
from phi_api.engine.runtime.folder import CONFIG_FILE, REQUIRED_FILES, ModelFolder
from phi_api.errors import ConfigError, FolderError, InvalidParameterError, ModelLoadingError
from phi_api.settings import Settings, parse_option

log = logging.getLogger(__name__)
TASKS = ("generate", "embed", "rerank")


@dataclass(frozen=True)
class ModelSpec:
    """A model to serve: the id clients name, its folder on the server's disk, engine options (settings such as
    ``KV_CACHE_MB`` for this model alone), and the task it is declared for (``generate``, ``embed``, ``rerank``;
    None: whatever its folder holds; a folder of another task is refused at load)."""

    id: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)
    task: str | None = None

    def with_draft_folder(self, folder: str) -> ModelSpec:
        """This spec with the model in ``folder`` as its draft model (``SPECULATIVE_DRAFT_MODEL``)."""
        return ModelSpec(self.id, self.path, {**self.options, "SPECULATIVE_DRAFT_MODEL": folder}, self.task)

    def to_json(self) -> dict[str, Any]:
        """The spec as the registry file and ``MODELS_FILE`` write it."""
        return {"id": self.id, "path": self.path, "options": self.options,
                **({"task": self.task} if self.task else {})}

    @classmethod
    def checked(cls, model_id: Any, path: Any, options: Any = None, *, param: str = "options",
                task: Any = None) -> ModelSpec:
        """A spec from untrusted values; 400 naming what is wrong."""
        if task is not None and task not in TASKS:
            raise InvalidParameterError(f"A model's task must be one of {', '.join(TASKS)}.", param="task")
        if not isinstance(model_id, str) or not model_id.strip() or len(model_id) > 256:
            raise InvalidParameterError("A model needs an id: a non-empty string.", param="model")
        if not isinstance(path, str) or not path:
            raise InvalidParameterError("A model needs the path of its folder on the server.", param="path")
        if not isinstance(options or {}, dict):
            raise InvalidParameterError(f"{param} must be an object of engine settings.", param=param)
        checked = {}
        for name, value in (options or {}).items():
            try:
                checked[name] = parse_option(name, value)
            except ConfigError as exc:
                raise InvalidParameterError(f"{param}: {exc}", param=param) from None
        return cls(model_id.strip(), path, checked, task)


def task_mismatch(folder: str | Path, task: str | None) -> str | None:
    """What the folder holds, if it is not a model of the declared ``task`` (None: it is, or none is declared);
    raises :class:`FolderError` for an encoder folder that cannot be read."""
    if task is None:
        return None
    if is_encoder_folder(folder):
        kind = EncoderInfo.read(folder).task
        return None if kind == task else f"holds an encoder of the task {kind}, not {task}"
    if task != "generate":
        return f"holds a generator ({CONFIG_FILE}), not an encoder of the task {task}"
    return None


def check_folder(path: str, task: str | None = None) -> None:
    """400 unless ``path`` is an ONNX Runtime GenAI model folder (its config, its graph and its files) or an encoder's
    (:mod:`phi_api.engine.encoder.folder`), of ``task`` when one is given."""
    folder = Path(path)
    try:
        found = folder.is_dir()
    except (OSError, ValueError) as exc:  # a path the file system refuses (a name too long, a NUL)
        reason = getattr(exc, "strerror", None) or "not a usable path"
        raise InvalidParameterError(f"The file system refuses that path ({reason}).", param="path") from None
    if not found:
        raise InvalidParameterError(f"No folder {path} on the server.", param="path")
    try:
        mismatch = task_mismatch(folder, task)
    except FolderError as exc:
        raise InvalidParameterError(f"{path} is not a usable encoder folder: {exc}", param="path") from None
    if mismatch is not None:
        raise InvalidParameterError(f"{path} {mismatch}.", param="task")
    if is_encoder_folder(folder):
        return
    if not (folder / CONFIG_FILE).is_file():
        missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    else:
        try:
            missing = ModelFolder.read(folder).missing_files()
        except FolderError:
            raise InvalidParameterError(f"{path} has no readable genai_config.json: not a model folder.",
                                        param="path") from None
    if missing:
        raise InvalidParameterError(f"{path} is not an ONNX Runtime GenAI model folder: {', '.join(missing)} "
                                    "missing.", param="path")


def folder_bytes(path: str) -> int:
    """Bytes of the files of a model folder (its weights, as they will be mapped)."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())
    except OSError:
        return 0


def declared(settings: Settings, pull: bool = True) -> list[ModelSpec]:
    """The models the settings declare: ``MODELS_FILE``'s list, or ``MODEL_PATH`` as ``MODEL_ID``; without
    ``pull``, models declared by name are left out rather than pulled (``python -m phi_api check``)."""
    if not settings.MODELS_FILE:
        if settings.MODEL:
            return [ModelSpec(settings.MODEL, pulled(settings.MODEL))] if pull else []
        if not settings.MODEL_PATH:
            raise ConfigError("no model to serve: set MODEL_PATH to a model folder, MODEL to a model by name, or "
                              "MODELS_FILE (`phi-api serve` without any of them prepares the default model)")
        return [ModelSpec(settings.MODEL_ID, settings.MODEL_PATH)]
    try:
        document = json.loads(Path(settings.MODELS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: {exc}") from None
    entries = document.get("models") if isinstance(document, dict) else document
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: a list of models, or {{\"models\": [...]}}")
    specs: list[ModelSpec] = []
    drafts: dict[int, Any] = {}  # an entry's index: the id of its draft model
    for entry in entries:
        try:
            if entry.get("draft") is not None:
                drafts[len(specs)] = entry["draft"]
            path = entry.get("path")
            path = os.path.expanduser(path) if isinstance(path, str) else path  # "~/.cache/..." as a shell reads it
            if path is None and isinstance(entry.get("model"), str):  # a model by name: pulled unless cached
                if not pull:
                    continue
                path = pulled(entry["model"])
            specs.append(ModelSpec.checked(entry.get("id") or entry.get("model"), path, entry.get("options"),
                                           task=entry.get("task")))
        except (AttributeError, InvalidParameterError) as exc:
            raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: {getattr(exc, 'message', exc)}") from None
    ids = [spec.id for spec in specs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: model ids must differ")
    return [with_draft(spec, drafts[index], specs, settings.MODELS_FILE) if index in drafts else spec
            for index, spec in enumerate(specs)]


def with_draft(spec: ModelSpec, draft: Any, specs: list[ModelSpec], source: str) -> ModelSpec:
    """``spec`` with the folder of the entry whose id ``draft`` is as its draft model (``"draft": <id>``)."""
    folders = {other.id: other.path for other in specs if other.id != spec.id}
    if not isinstance(draft, str) or draft not in folders:
        raise ConfigError(f"MODELS_FILE {source}: the draft of {spec.id} must be the id of another of its models "
                          f"({', '.join(sorted(folders)) or 'none'})")
    return spec.with_draft_folder(folders[draft])


def pulled(name: str) -> str:
    """The folder of the model ``name`` names, pulled now unless it is in the cache (:mod:`.pull`); a model
    that cannot be had stops start-up with the reason."""
    from phi_api.errors import PullError
    from phi_api.models.pull import pull

    try:
        return str(pull(name, say=lambda line: log.info("%s", line), report=PullProgress(name)))
    except PullError as error:
        raise ModelLoadingError(name, str(error), name) from None


class PullProgress:
    """A pull's download events (:func:`phi_api.models.pull.pull`'s ``report``: the model's bytes in so far, twice
    a second) as a log line every ``every`` seconds at most, so that a long pull at start-up is not silent."""

    def __init__(self, name: str, every: float = 10.0) -> None:
        self.name, self.every = name, every
        self.last = time.monotonic()

    def __call__(self, event: dict[str, Any]) -> None:
        if "total" not in event or time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        total, done = int(event["total"]), int(event.get("completed", 0))
        log.info("pulling %s: %.0f of %.0f MB (%.0f%%)", self.name, done / 2**20, total / 2**20,
                 100 * done / max(total, 1))
