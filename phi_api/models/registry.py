"""The models a server serves: declared at start-up, loaded and unloaded while it runs, the same in every worker.

The source of truth is one small JSON file in the server's state folder
(``PHI_API_STATE_DIR``, made by the gunicorn master, shared by its workers):
the models, each with its id, folder and options, and a version that every
change bumps. Each worker keeps the engines of its own process and
reconciles them with the file: before it serves any request that names or
lists models, and every second in the background. A change is made under a
file lock: the worker that takes a load validates the folder and loads the
model itself first (so a failed load answers with its cause and changes
nothing), then writes the file; the other workers load it on their next look
(a request there waits for it). An unloaded model is removed from the file
first, so no worker starts anything new on it; its running generations
finish, then its engine stops and its memory is given back.

Declared models (``MODELS_FILE``, or ``MODEL_PATH`` and ``MODEL_ID`` for
one) are loaded in the master before the workers fork, so their tokenizers
are shared; every model's weights are shared through the host's prepacked
file, which each worker's session maps, whenever it was loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phi_api.engine import Engine
from phi_api.engine.kv.ledger import row_bytes
from phi_api.engine.runtime.folder import CONFIG_FILE, REQUIRED_FILES, ModelFolder
from phi_api.errors import (
    ConfigError,
    FolderError,
    InsufficientMemoryError,
    InvalidParameterError,
    ModelExistsError,
    ModelLimitError,
    ModelLoadingError,
    ModelNotFoundError,
)
from phi_api.models.memory import MIN_REQUEST_TOKENS, ServerMemory, measured_here
from phi_api.settings import Settings, parse_option

log = logging.getLogger(__name__)

STATE_DIR_VARIABLE = "PHI_API_STATE_DIR"


@dataclass(frozen=True)
class ModelSpec:
    """A model to serve: the id clients name, its folder on the server's disk, and engine options (settings
    such as ``KV_CACHE_MB`` for this model alone)."""

    id: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The spec as the registry file and ``MODELS_FILE`` write it."""
        return {"id": self.id, "path": self.path, "options": self.options}

    @classmethod
    def checked(cls, model_id: Any, path: Any, options: Any = None, *, param: str = "options") -> ModelSpec:
        """A spec from untrusted values; 400 naming what is wrong."""
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
        return cls(model_id.strip(), path, checked)


def check_folder(path: str) -> None:
    """400 unless ``path`` is an ONNX Runtime GenAI model folder (its config, its graph and its files)."""
    folder = Path(path)
    try:
        found = folder.is_dir()
    except (OSError, ValueError) as exc:  # a path the file system refuses (a name too long, a NUL)
        reason = getattr(exc, "strerror", None) or "not a usable path"
        raise InvalidParameterError(f"The file system refuses that path ({reason}).", param="path") from None
    if not found:
        raise InvalidParameterError(f"No folder {path} on the server.", param="path")
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


def _request_bytes(engine: Engine) -> int:
    """Keys and values of one request of ``MIN_REQUEST_TOKENS`` (or the whole context, when shorter)."""
    spec = getattr(engine.model, "spec", None)
    return row_bytes(spec, min(engine.info.context_length, MIN_REQUEST_TOKENS)) if spec is not None else 0


def _idle(engine: Engine) -> bool:
    load = engine.load
    return not (load.waiting or load.running)


def declared(settings: Settings) -> list[ModelSpec]:
    """The models the settings declare: ``MODELS_FILE``'s list, or ``MODEL_PATH`` as ``MODEL_ID``."""
    if not settings.MODELS_FILE:
        if settings.MODEL:
            return [ModelSpec(settings.MODEL, pulled(settings.MODEL))]
        return [ModelSpec(settings.MODEL_ID, settings.MODEL_PATH)]
    try:
        document = json.loads(Path(settings.MODELS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: {exc}") from None
    entries = document.get("models") if isinstance(document, dict) else document
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: a list of models, or {{\"models\": [...]}}")
    specs = []
    for entry in entries:
        try:
            path = entry.get("path")
            path = os.path.expanduser(path) if isinstance(path, str) else path  # "~/.cache/..." as a shell reads it
            if path is None and isinstance(entry.get("model"), str):  # a model by name: pulled unless cached
                path = pulled(entry["model"])
            specs.append(ModelSpec.checked(entry.get("id") or entry.get("model"), path, entry.get("options")))
        except (AttributeError, InvalidParameterError) as exc:
            raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: {getattr(exc, 'message', exc)}") from None
    ids = [spec.id for spec in specs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"MODELS_FILE {settings.MODELS_FILE}: model ids must differ")
    return specs


def pulled(name: str) -> str:
    """The folder of the model ``name`` names, pulled now unless it is in the cache (:mod:`.pull`); a model
    that cannot be had stops start-up with the reason."""
    from phi_api.errors import PullError
    from phi_api.models.pull import pull

    try:
        return str(pull(name, say=lambda line: log.info("%s", line)))
    except PullError as error:
        raise ModelLoadingError(name, str(error), name) from None


def state_dir() -> Path:
    """The folder the server's processes share state in: the gunicorn master's (``PHI_API_STATE_DIR``), or
    a fresh one for an app of its own (Flask's test client, a script)."""
    folder = os.environ.get(STATE_DIR_VARIABLE)
    return Path(folder) if folder else Path(tempfile.mkdtemp(prefix="phi-api-state-"))


@dataclass
class Served:
    """A model this process serves: its spec, its engine, and when the server loaded it."""

    spec: ModelSpec
    engine: Engine
    loaded_at: int
    used_at: float = field(default_factory=time.monotonic)  # when a request of this process last asked for it


Loader = Callable[[ModelSpec], Engine]


class Models:
    """This process's models, kept in step with the server's registry file (see the module's docstring)."""

    def __init__(self, settings: Settings, folder: Path, loader: Loader, memory: ServerMemory | None = None) -> None:
        self._settings = settings
        self._memory = memory
        self._file = folder / "models.json"
        self._lock_path = folder / "models.lock"
        self._load = loader
        self._served: dict[str, Served] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._in_step: Any = contextlib.nullcontext()  # one thread until start(); then a greenlet lock
        self._started = False
        self._draining = False
        self._declared: set[str] = set()  # ids of the declared models: never unloaded for idleness
        self._kept_until: dict[str, float] = {}  # what this process last wrote of each model's keep-until time

    # Reading --------------------------------------------------------------------------------------

    def engine(self, model_id: str) -> Engine:
        """The engine serving ``model_id``; 404 ``model_not_found`` when the server serves no such model."""
        return self.served(model_id).engine

    def served(self, model_id: str) -> Served:
        """The model ``model_id``; 404 ``model_not_found`` when the server serves no such model."""
        served = self.get(model_id)
        if served is None:
            raise ModelNotFoundError(f"The model '{model_id}' does not exist; this server serves: "
                                     f"{', '.join(self.ids()) or 'no model'}.")
        served.used_at = time.monotonic()
        self.keep(model_id)
        return served

    def get(self, model_id: str) -> Served | None:
        """The model ``model_id``, if the server serves it."""
        self.sync()
        return self._served.get(model_id)

    def ids(self) -> list[str]:
        """The ids of the models the server serves, in the order they were loaded."""
        self.sync()
        return list(self._served)

    def all(self) -> list[Served]:
        """Every model the server serves."""
        self.sync()
        return list(self._served.values())

    @property
    def ready(self) -> bool:
        """Whether every model of this process can generate (true with none: the server can load one)."""
        return not self._draining and all(served.engine.ready for served in self._served.values())

    @property
    def draining(self) -> bool:
        """Whether this process is shutting down (see :meth:`drain`)."""
        return self._draining

    def drain(self) -> None:
        """This process is shutting down: every engine takes no new generation (503); running ones finish."""
        self._draining = True
        for served in self._served.values():
            served.engine.draining = True

    # Changing -------------------------------------------------------------------------------------

    def declare(self, specs: list[ModelSpec]) -> None:
        """Load the declared models here (the master, before the fork) and start the registry with them,
        unless another process of this server already did (workers that load for themselves)."""
        self._declared = {spec.id for spec in specs}
        with self._locked():
            registry = self._read()
            if registry is None:
                loaded_at = int(time.time())
                for spec in specs:
                    self._served[spec.id] = Served(spec, self._loading(spec), loaded_at)
                self._write([served for served in self._served.values()], version=1)
        self.sync()

    def load(self, spec: ModelSpec) -> Served:
        """Load ``spec`` on this server: 400 for an id already served, past ``MAX_MODELS``, for a folder that
        is not a model, or for a model that does not fit the memory budget even once idle models are unloaded;
        500 (with the cause) for a model that fails to load. Nothing changes on failure."""
        check_folder(spec.path)
        self._make_room(spec)
        with self._in_step, self._locked():
            self._sync_now()
            if spec.id in self._served:
                raise ModelExistsError(f"The model '{spec.id}' is already loaded.")
            if len(self._served) >= self._settings.MAX_MODELS:
                raise ModelLimitError(f"This server holds at most {self._settings.MAX_MODELS} models (MAX_MODELS); "
                                      "unload one first.")
            served = Served(spec, self._loading(spec), int(time.time()))
            if self._started:
                served.engine.start()
            self._served[spec.id] = served
            self._write(list(self._served.values()))
        self.keep(spec.id)
        log.info("model %s loaded from %s", spec.id, spec.path)
        return served

    def unload(self, model_id: str, *, missing_ok: bool = False) -> Served | None:
        """Stop serving ``model_id`` (404 if it is not served, unless ``missing_ok``): new requests get 404 at
        once, running generations finish, then its engine stops and its memory is given back."""
        with self._in_step, self._locked():
            self._sync_now()
            served = self._served.pop(model_id, None)
            if served is None:
                if missing_ok:
                    return None
                raise ModelNotFoundError(f"The model '{model_id}' is not loaded.")
            self._write(list(self._served.values()))
        served.engine.retire()
        log.info("model %s unloaded", model_id)
        return served

    # Memory ---------------------------------------------------------------------------------------

    def weights(self, without: tuple[Served, ...] = ()) -> int:
        """Bytes of the loaded models' files (but ``without``'s), each folder once: their weights, which the workers
        share (a folder served under several ids is mapped once)."""
        return sum({served.engine.info.path: served.engine.info.size_bytes for served in self._served.values()
                    if served not in without}.values())

    def check_memory(self, what: str, weights: int = 0, kv: int = 0, without: tuple[Served, ...] = ()) -> None:
        """:class:`InsufficientMemoryError` unless the loaded models (but ``without``), ``weights`` more and room
        for one request (of ``kv`` bytes, or the loaded models' largest) in every worker fit the memory budget."""
        if self._memory is None:
            return
        request = max([kv, *(_request_bytes(served.engine) for served in self._served.values()
                             if served not in without)])
        self._memory.check_fits(self.weights(without) + weights, request, what)

    def _make_room(self, spec: ModelSpec) -> None:
        """Unload idle models, least recently used first (as Ollama does), until ``spec`` fits the memory budget;
        :class:`InsufficientMemoryError` naming what it needs and what is free when it cannot, even with every idle
        model unloaded (then none is)."""
        weights = folder_bytes(spec.path)
        try:
            self.check_memory(f"loading {spec.id}", weights)
            return
        except InsufficientMemoryError:
            idle = sorted((served for served in self.all() if _idle(served.engine)), key=lambda s: s.used_at)
        self.check_memory(f"loading {spec.id}", weights, without=tuple(idle))  # raises: it could never fit now
        for served in idle:
            log.info("model %s unloaded to make room for %s", served.spec.id, spec.id)
            self.unload(served.spec.id, missing_ok=True)
            try:
                self.check_memory(f"loading {spec.id}", weights)
                return
            except InsufficientMemoryError:
                continue

    # Idle models ---------------------------------------------------------------------------------

    def keep(self, model_id: str, seconds: float | None = None) -> None:
        """``model_id`` is used now: keep it at least ``seconds`` more (Ollama's ``keep_alive``; default
        ``MODEL_IDLE_SECONDS``; 0 and nothing asked: no limit). Every worker sees it: the time is a file's."""
        seconds = self._settings.MODEL_IDLE_SECONDS if seconds is None else seconds
        if not seconds:
            return
        until = time.time() + seconds
        if self._kept_until.get(model_id, 0.0) >= until - 1.0:  # written within the last second: enough
            return
        self._kept_until[model_id] = until
        path = self._keep_path(model_id)
        try:
            if path.exists() and path.stat().st_mtime >= until:
                return
            path.touch()
            os.utime(path, (until, until))
        except OSError:  # a state folder that refuses it: the model is kept, as with no limit
            log.warning("could not note the use of model %s", model_id)

    def expire_idle(self) -> None:
        """Unload the models loaded at run time whose keep-until time has passed, if no request of this worker
        waits or runs on them (called every second by each worker: the first one unloads it everywhere)."""
        now = time.time()
        for served in self.all():
            if served.spec.id in self._declared or not _idle(served.engine):
                continue
            try:
                expired = self._keep_path(served.spec.id).stat().st_mtime < now
            except FileNotFoundError:
                continue
            if expired:
                log.info("model %s unloaded: idle past its keep-alive time", served.spec.id)
                self.unload(served.spec.id, missing_ok=True)
                self._keep_path(served.spec.id).unlink(missing_ok=True)

    def _keep_path(self, model_id: str) -> Path:
        import hashlib

        return self._file.parent / f"keep-{hashlib.sha256(model_id.encode('utf-8')).hexdigest()[:16]}"

    def observe_memory(self) -> None:
        """In a worker: measure its own memory once its engines are ready, and set its key/value share for the
        models now loaded."""
        if self._memory is None:
            return
        if self._memory.worker_private is None and self._served and self.ready:
            self._memory.worker_private = measured_here()
        self._memory.refresh(self.weights())

    # This process ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every engine of this process (call after the fork, on the worker's hub)."""
        from gevent.lock import Semaphore

        self._in_step = Semaphore()
        self._started = True
        for served in self._served.values():
            served.engine.start()

    def stop(self) -> None:
        """Stop every engine of this process."""
        for served in self._served.values():
            served.engine.stop()

    def sync(self) -> None:
        """Catch up with the registry file if another process changed it (cheap when it did not).

        One greenlet catches up; the others wait for it, so that no request is answered from a set of
        models older than the file: a request that follows a load's answer never gets 404 anywhere.
        """
        if self._file_stamp() in (None, self._stamp):
            return
        with self._in_step:
            if self._file_stamp() != self._stamp:
                self._sync_now()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self._file.stat()
        except FileNotFoundError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _sync_now(self) -> None:
        registry = self._read()
        if registry is None:
            return
        wanted = {entry["id"]: entry for entry in registry["models"]}
        for model_id in [model_id for model_id in self._served if model_id not in wanted]:
            self._served.pop(model_id).engine.retire()
        for model_id, entry in wanted.items():
            if model_id not in self._served:
                spec = ModelSpec(entry["id"], entry["path"], entry.get("options", {}))
                try:
                    served = Served(spec, self._loading(spec), int(entry.get("loaded_at", time.time())))
                except ModelLoadingError:
                    log.exception("model %s could not be loaded in this worker", model_id)
                    continue
                if self._started:
                    served.engine.start()
                self._served[model_id] = served
        self._served = {model_id: self._served[model_id] for model_id in wanted if model_id in self._served}
        self._stamp = registry["stamp"]  # in step with the file (a model that failed here is logged, not retried)

    def _loading(self, spec: ModelSpec) -> Engine:
        from phi_api.engine.threads.native import off_hub

        engine = off_hub(self._load, spec) if self._started else self._load(spec)
        engine.draining = self._draining  # a worker that is shutting down starts nothing new on it either
        return engine

    # The file -------------------------------------------------------------------------------------

    def _read(self) -> dict[str, Any] | None:
        """The registry, and the stamp of the file it was read from; None when there is none yet."""
        stamp = self._file_stamp()
        try:
            registry = json.loads(self._file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        registry["stamp"] = stamp
        return registry

    def _write(self, served: list[Served], version: int | None = None) -> None:
        current = self._read()
        registry = {"version": version or (current or {"version": 0})["version"] + 1,
                    "models": [{**entry.spec.to_json(), "loaded_at": entry.loaded_at} for entry in served]}
        staging = self._file.with_name(f".models.{os.getpid()}.json")
        staging.write_text(json.dumps(registry, indent=1), encoding="utf-8")
        os.replace(staging, self._file)
        self._stamp = self._file_stamp()  # this process made the change: it is in step

    def _locked(self) -> _FileLock:
        return _FileLock(self._lock_path)


class _FileLock:
    """An exclusive lock on a file, shared by the server's processes (taken off the hub: it may wait)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._handle: Any = None

    def __enter__(self) -> None:
        from phi_api.engine.threads.native import off_hub

        self._handle = open(self._path, "a+")
        try:
            off_hub(fcntl.flock, self._handle, fcntl.LOCK_EX)
        except RuntimeError:  # no gevent hub in this process (a plain script): take it here
            fcntl.flock(self._handle, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: Any) -> None:
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
