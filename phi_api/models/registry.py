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

Declared models (:func:`phi_api.models.specs.declared`) are loaded in the master
before the workers fork, so their tokenizers are shared; every model's weights are shared through the host's prepacked
file, which each worker's session maps, whenever it was loaded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phi_api.engine import EncoderEngine, Engine, ServedEngine
from phi_api.engine.kv.ledger import row_bytes
from phi_api.errors import (
    InsufficientMemoryError,
    ModelExistsError,
    ModelLimitError,
    ModelLoadingError,
    ModelNotFoundError,
    ModelTaskError,
)
from phi_api.models.keepalive import KeepAlive
from phi_api.models.memory import MIN_REQUEST_TOKENS, ServerMemory
from phi_api.models.specs import ModelSpec, check_folder, folder_bytes
from phi_api.models.state import RegistryFile
from phi_api.settings import Settings

log = logging.getLogger(__name__)

_TASK_NAMES = {"embed": "embedding", "rerank": "reranking"}
_TASK_VERBS = {"embed": "make embeddings", "rerank": "rerank documents"}
_TASK_ROUTES = {"generate": "use /v1/chat/completions or /v1/completions",
                "embed": "use /v1/embeddings (or Ollama's /api/embed)",
                "rerank": "use /v1/rerank (or /v1/score)"}


def generator_of(model_id: str, engine: ServedEngine) -> Engine:
    """``engine`` as a generator; 400 naming the task an encoder does instead."""
    if isinstance(engine, EncoderEngine):
        raise ModelTaskError(f"The model '{model_id}' is an {_TASK_NAMES[engine.task]} model: it does not generate "
                             f"text; {_TASK_ROUTES[engine.task]}.")
    return engine


def encoder_of(model_id: str, engine: ServedEngine, task: str) -> EncoderEngine:
    """``engine`` as an encoder of ``task``; 400 naming what the model does instead."""
    if not isinstance(engine, EncoderEngine):
        raise ModelTaskError(f"The model '{model_id}' generates text: it does not {_TASK_VERBS[task]}; "
                             f"{_TASK_ROUTES['generate']}.")
    if engine.task != task:
        raise ModelTaskError(f"The model '{model_id}' is an {_TASK_NAMES[engine.task]} model: it does not "
                             f"{_TASK_VERBS[task]}; {_TASK_ROUTES[engine.task]}.")
    return engine


def _request_bytes(engine: ServedEngine) -> int:
    """Keys and values of one request of ``MIN_REQUEST_TOKENS`` (or the whole context, when shorter); an encoder's
    own memory in each worker."""
    if isinstance(engine, EncoderEngine):
        return engine.worker_bytes
    spec = getattr(engine.model, "spec", None)
    return row_bytes(spec, min(engine.info.context_length, MIN_REQUEST_TOKENS)) if spec is not None else 0


def _idle(engine: ServedEngine) -> bool:
    load = engine.load
    return not (load.waiting or load.running)


@dataclass
class Served:
    """A model this process serves: its spec, its engine, and when the server loaded it."""

    spec: ModelSpec
    engine: ServedEngine
    loaded_at: int
    used_at: float = field(default_factory=time.monotonic)  # when a request of this process last asked for it

    def to_json(self) -> dict[str, Any]:
        """The model as the registry file lists it."""
        return {**self.spec.to_json(), "loaded_at": self.loaded_at}


Loader = Callable[[ModelSpec], ServedEngine]


class Models:
    """This process's models, kept in step with the server's registry file (see the module's docstring)."""

    def __init__(self, settings: Settings, folder: Path, loader: Loader, memory: ServerMemory | None = None) -> None:
        self._settings = settings
        self._memory = memory
        self._file = RegistryFile(folder)
        self._load = loader
        self._served: dict[str, Served] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._in_step: Any = contextlib.nullcontext()  # one thread until start(); then a greenlet lock
        self._started = False
        self._draining = False
        self.declared_ids: set[str] = set()  # ids of the declared models: never unloaded for idleness
        self.keep_alive = KeepAlive(folder, settings.MODEL_IDLE_SECONDS,  # of the models loaded at run time
                                    settings.KEEP_ALIVE_MAX_SECONDS)

    # Reading --------------------------------------------------------------------------------------

    def engine(self, model_id: str) -> Engine:
        """The generator serving ``model_id``; 404 ``model_not_found`` when the server serves no such model, 400
        ``unsupported_model_task`` when an encoder serves it."""
        return generator_of(model_id, self.served(model_id).engine)

    def encoder(self, model_id: str, task: str) -> EncoderEngine:
        """The encoder serving ``model_id`` for ``task`` (``embed``, ``rerank``); 404 as :meth:`engine`, 400
        ``unsupported_model_task`` when the model serves another task."""
        return encoder_of(model_id, self.served(model_id).engine, task)

    def served(self, model_id: str) -> Served:
        """The model ``model_id``; 404 ``model_not_found`` when the server serves no such model."""
        served = self.get(model_id)
        if served is None:
            raise self.missing(model_id)
        served.used_at = time.monotonic()
        self.keep_alive.note_use(model_id)
        return served

    def missing(self, model_id: str) -> ModelNotFoundError:
        """The error for a model the server does not serve (404 ``model_not_found``, naming those it serves)."""
        return ModelNotFoundError(f"The model '{model_id}' does not exist; this server serves: "
                                  f"{', '.join(self.ids()) or 'no model'}.")

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
        self.declared_ids = {spec.id for spec in specs}
        with self._file.locked():
            registry = self._file.read()
            if registry is None:
                loaded_at = int(time.time())
                for spec in specs:
                    self._served[spec.id] = Served(spec, self._loading(spec), loaded_at)
                self._stamp = self._file.write([entry.to_json() for entry in self._served.values()], version=1)
        self.sync()

    def load(self, spec: ModelSpec) -> Served:
        """Load ``spec`` on this server: 400 for an id already served, past ``MAX_MODELS``, for a folder that
        is not a model, or for a model that does not fit the memory budget even once idle models are unloaded;
        500 (with the cause) for a model that fails to load. Nothing changes on failure."""
        check_folder(spec.path, spec.task)
        make_room(self, spec)
        with self._in_step, self._file.locked():
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
            self._stamp = self._file.write([entry.to_json() for entry in self._served.values()])
        self.keep_alive.note_use(spec.id)
        log.info("model %s loaded from %s", spec.id, spec.path)
        return served

    def unload(self, model_id: str, *, missing_ok: bool = False) -> Served | None:
        """Stop serving ``model_id`` (404 if it is not served, unless ``missing_ok``): new requests get 404 at
        once, running generations finish, then its engine stops and its memory is given back."""
        with self._in_step, self._file.locked():
            self._sync_now()
            served = self._served.pop(model_id, None)
            if served is None:
                if missing_ok:
                    return None
                raise ModelNotFoundError(f"The model '{model_id}' is not loaded.")
            self._stamp = self._file.write([entry.to_json() for entry in self._served.values()])
        served.engine.retire()
        log.info("model %s unloaded", model_id)
        return served

    # Memory ---------------------------------------------------------------------------------------

    def weights(self, without: tuple[Served, ...] = ()) -> int:
        """Bytes of the loaded models' files (but ``without``'s) and their draft models', each folder once: their
        weights, which the workers share (a folder served under several ids is mapped once)."""
        return sum({path: size for served in self._served.values() if served not in without
                    for path, size in served.engine.folders.items()}.values())

    def check_memory(self, what: str, weights: int = 0, kv: int = 0, without: tuple[Served, ...] = ()) -> None:
        """:class:`InsufficientMemoryError` unless the loaded models (but ``without``), ``weights`` more and room
        for one request (of ``kv`` bytes, or the loaded models' largest) in every worker fit the memory budget."""
        if self._memory is None:
            return
        request = max([kv, *(_request_bytes(served.engine) for served in self._served.values()
                             if served not in without)])
        self._memory.check_fits(self.weights(without) + weights, request, what)

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
        if self._file.stamp() in (None, self._stamp):
            return
        with self._in_step:
            if self._file.stamp() != self._stamp:
                self._sync_now()

    def _sync_now(self) -> None:
        registry = self._file.read()
        if registry is None:
            return
        wanted = {entry["id"]: entry for entry in registry["models"]}
        for model_id in [model_id for model_id in self._served if model_id not in wanted]:
            self._served.pop(model_id).engine.retire()
        for model_id, entry in wanted.items():
            if model_id not in self._served:
                spec = ModelSpec(entry["id"], entry["path"], entry.get("options", {}), entry.get("task"))
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

    def _loading(self, spec: ModelSpec) -> ServedEngine:
        from phi_api.engine.threads.native import off_hub

        engine = off_hub(self._load, spec) if self._started else self._load(spec)
        engine.draining = self._draining  # a worker that is shutting down starts nothing new on it either
        return engine


def make_room(models: Models, spec: ModelSpec) -> None:
    """Unload idle models, least recently used first (as Ollama does), until ``spec`` fits the memory budget;
    :class:`InsufficientMemoryError` naming what it needs and what is free when it cannot, even with every idle
    model unloaded (then none is)."""
    weights = folder_bytes(spec.path)
    try:
        models.check_memory(f"loading {spec.id}", weights)
        return
    except InsufficientMemoryError:
        idle = sorted((served for served in models.all() if _idle(served.engine)), key=lambda s: s.used_at)
    models.check_memory(f"loading {spec.id}", weights, without=tuple(idle))  # raises: it could never fit now
    for served in idle:
        log.info("model %s unloaded to make room for %s", served.spec.id, spec.id)
        models.unload(served.spec.id, missing_ok=True)
        try:
            models.check_memory(f"loading {spec.id}", weights)
            return
        except InsufficientMemoryError:
            continue


def end_running(models: Models) -> None:
    """This process exits now: every generation still running ends (``shutdown``), so that what it did is counted
    and its client told, before the process goes."""
    for served in models.all():
        served.engine.end_all("shutdown")


def expire_idle(models: Models) -> None:
    """Unload the models loaded at run time whose keep-until time has passed, if no request of this worker waits or
    runs on them (called every second by each worker: the first one unloads it everywhere)."""
    now = time.time()
    for served in models.all():
        if served.spec.id in models.declared_ids or not _idle(served.engine):
            continue
        if models.keep_alive.expired(served.spec.id, now):
            log.info("model %s unloaded: idle past its keep-alive time", served.spec.id)
            models.unload(served.spec.id, missing_ok=True)
            models.keep_alive.forget(served.spec.id)
