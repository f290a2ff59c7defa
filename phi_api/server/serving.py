"""Running under gunicorn: the WSGI app, its start-up failures, and the worker lifecycle hooks.

The model is loaded once, in the master, before gunicorn forks its workers
(``preload_app``); each worker then starts its own engine thread. A forked
process that holds an ONNX Runtime GenAI model hangs at normal interpreter
exit (it joins thread-pool threads that do not exist in the child), so a
worker leaves through ``os._exit`` once gunicorn has finished with it.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, NoReturn

import gevent
from flask import Flask

from phi_api.errors import ConfigError
from phi_api.models.registry import end_running, expire_idle
from phi_api.settings import Settings, load_settings
from phi_api.telemetry import tracing
from phi_api.telemetry.logs import startup_error

if TYPE_CHECKING:  # imported by the functions that need them: prometheus_client must see its folder first
    from phi_api.limits.line import WaitingLine
    from phi_api.models.memory import ServerMemory
    from phi_api.models.registry import Models
    from phi_api.telemetry.metrics import Metrics
    from phi_api.web.resources import Resources

log = logging.getLogger(__name__)

EXIT_CONFIG_ERROR = 2
RECONCILE_SECONDS = 1.0
LOAD_SECONDS = 0.25  # how stale the gateway metrics may be
DATABASE_SECONDS = 5.0  # how often each store's database is checked
HUB_TICK = 0.05  # how often the hub's lateness is measured (about 1% of a core: cheap enough to keep on)
# Before gunicorn's graceful_timeout ends a draining worker, what still runs is ended: its usage recorded, its
# clients told (a 503 error event), before the process goes
EXIT_MARGIN_SECONDS = 5.0
# gunicorn's WORKER_BOOT_ERROR: when workers load the model themselves
# (PRELOAD_MODEL=false), the arbiter then halts instead of respawning them.
EXIT_MODEL_LOADING_FAILED = 3


def settings_or_exit() -> Settings:
    """The settings from the environment; on a bad value, say which and exit."""
    try:
        return load_settings()
    except ConfigError as exc:
        config_error_exit(exc)


def config_error_exit(exc: ConfigError) -> NoReturn:
    """Say why the configuration cannot run (one JSON line with ``LOG_FORMAT=json``) and exit."""
    print(startup_error(f"configuration error: {exc}", os.environ.get("LOG_FORMAT", "")), file=sys.stderr,
          flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def build_wsgi_app() -> Flask:
    """``create_app()``, or exit: a model that fails to load is logged as the error object, one JSON line."""
    from phi_api.app import create_app
    from phi_api.errors import InsufficientMemoryError, ModelLoadingError, openai_body

    try:
        return create_app()
    except ConfigError as exc:
        config_error_exit(exc)
    except (ModelLoadingError, InsufficientMemoryError) as exc:
        print(json.dumps(openai_body(exc)), file=sys.stderr, flush=True)
        sys.exit(EXIT_MODEL_LOADING_FAILED)


def bind_address(settings: Settings) -> str:
    """gunicorn's ``bind`` for ``SERVER_HOST``/``SERVER_PORT`` (IPv6 hosts bracketed)."""
    host = settings.SERVER_HOST
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{settings.SERVER_PORT}"


def _flask_app(wsgi: Any) -> Flask | None:
    return wsgi if isinstance(wsgi, Flask) else None


def _resources(app: Flask) -> Resources:
    """``app``'s resources (imported here, not at the top: prometheus_client must see its folder first)."""
    from phi_api.web.resources import get_resources

    return get_resources(app)


def pre_fork(server: Any, worker: Any) -> None:
    """gunicorn hook, in the master before each worker is forked: what the master loaded (the app, the model's
    tokenizer and tables) leaves the garbage collector's view (``gc.freeze``).

    A full collection walks every tracked object: ~100,000 once the app is built, ~60 ms a collection on a machine
    of 2 cores (either model), a stall of the hub and so of every stream of the worker. And it writes to each object
    it walks, so each worker would copy the master's pages that hold them. Frozen, they are never walked.
    """
    gc.freeze()


def post_worker_init(worker: Any) -> None:
    """gunicorn hook, in the new worker: start its engine threads; mark it draining when told to stop. What the
    worker loaded itself (``PRELOAD_MODEL=false``) leaves the collector's view, as the master's did
    (:func:`pre_fork`)."""
    app = _flask_app(getattr(worker, "wsgi", None))
    if app is None:
        return
    gc.freeze()
    resources = _resources(app)
    models = resources.models
    assert models is not None
    models.start()
    gevent.spawn(_keep_in_step, models)
    gevent.spawn(_publish_load, models, resources.metrics, resources.memory, resources.line)
    gevent.spawn(_watch_hub, resources.metrics)
    gevent.spawn(_watch_databases, resources)
    if tracing.configured():
        resources.tracing.start_worker()
    if resources.settings.BATCH_CONCURRENCY:
        from phi_api.batches.runner import runner_of

        gevent.spawn(runner_of(resources).run_forever)
    if resources.settings.BACKGROUND_CONCURRENCY:
        from phi_api.background.runner import background_runner_of

        gevent.spawn(background_runner_of(resources).run_forever)
    grace = max(0.0, float(worker.cfg.graceful_timeout) - EXIT_MARGIN_SECONDS)
    for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
        previous = signal.getsignal(signum)
        if callable(previous):
            signal.signal(signum, _draining_then(models, previous, grace if signum == signal.SIGTERM else None))


def _watch_hub(metrics: Metrics) -> None:
    """Measure how late the hub runs a timer due every ``HUB_TICK`` seconds: a stall of the hub (work done on it
    instead of off it) delays every stream of the worker by as much."""
    longest = 0.0
    while True:
        due = time.monotonic() + HUB_TICK
        gevent.sleep(HUB_TICK)
        late = max(0.0, time.monotonic() - due)
        metrics.hub_stall.observe(late)
        if late > longest:
            longest = late
            metrics.hub_longest_stall.set(late)


def _watch_databases(resources: Resources) -> None:
    """Check that each store's database answers, and publish what its calls failed, every ``DATABASE_SECONDS``."""
    stores = {store.database.name: store.database
              for store in (resources.batches, resources.responses, resources.conversations, resources.background,
                            resources.keys.usage)}
    while True:
        for name, database in stores.items():
            try:
                resources.metrics.ops.observe_database(name, database.ping(), database.failures)
            except Exception:  # a metrics hiccup must not end the loop
                log.exception("could not check the %s database", name)
        gevent.sleep(DATABASE_SECONDS)


def _keep_in_step(models: Models) -> None:
    """Load and unload what other workers did, within a second, even when no request asks."""
    while True:
        gevent.sleep(RECONCILE_SECONDS)
        try:
            models.sync()
            expire_idle(models)
        except Exception:  # a model that will not load is logged; the loop must go on
            log.exception("could not catch up with the server's models")


def _publish_load(models: Models, metrics: Metrics, memory: ServerMemory, line: WaitingLine) -> None:
    """Keep this worker's key/value share of the memory budget, and its share of the gateway and memory metrics
    (waiting, running, key/value memory), current."""
    while True:
        gevent.sleep(LOAD_SECONDS)
        try:
            served = models.all()
            engines = {each.spec.id: each.engine for each in served}
            metrics.ops.observe_models({each.spec.id: each.loaded_at for each in served})
            memory.observe(bool(engines), models.ready, models.weights())
            metrics.queued.set(line.waiting)
            metrics.observe_engines(engines)
            metrics.observe_disk(engines)
            for engine in engines.values():
                engine.report_disk()
            metrics.observe_memory(memory.usage(), memory.shared.usage(), models.weights(),
                                   {model: engine.waiting_for_memory for model, engine in engines.items()})
        except Exception:  # a metrics hiccup must not end the loop
            log.exception("could not publish the engines' load")


def _draining_then(models: Models, handler: Any, grace: float | None) -> Any:
    """The signal's handler: drain, then gunicorn's own; generations still running ``grace`` seconds later are
    ended (None: gunicorn's quick shutdown, which waits for nothing)."""

    def on_signal(signum: int, frame: Any) -> None:
        if grace is not None and not models.draining:
            gevent.spawn_later(grace, end_running, models)
        models.drain()  # /health answers 503; new generations get 503 while in-flight ones finish
        handler(signum, frame)

    return on_signal


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn hook, in the exiting worker: stop the engine and leave without the hanging interpreter exit.

    gunicorn also calls it in the master (``Arbiter.kill_worker``), for a worker that is already gone when the
    master signals it: gunicorn.conf.py monkey-patches the master, so gevent's child watcher may reap a worker
    before gunicorn does. There it must neither stop the master's engine nor end the master.
    """
    if os.getpid() != worker.pid:
        log.info("worker %s had already exited when the master signalled it", worker.pid)
        child_exit(server, worker)
        return
    app = _flask_app(getattr(worker, "wsgi", None))
    if app is not None:
        resources = _resources(app)
        if resources.models is not None:
            resources.models.stop()
        resources.tracing.stop_worker()  # the spans still batched go out
    exc = sys.exc_info()[1]
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    else:
        code = 0 if exc is None else 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def on_exit(server: Any) -> None:
    """gunicorn hook, in the master at shutdown: release the app's resources (the shared lock file among them) and
    remove the metrics folder."""
    if server.cfg.preload_app:
        app = _flask_app(server.app.wsgi())
        if app is not None:
            from phi_api.web.resources import teardown

            teardown(app)
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if os.environ.get(_OWN_METRICS_DIR) == folder and os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
    from phi_api.models.state import STATE_DIR_VARIABLE

    if os.environ.get(STATE_DIR_VARIABLE):
        shutil.rmtree(os.environ[STATE_DIR_VARIABLE], ignore_errors=True)


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook, in the master when a worker is gone: drop its live metrics."""
    from phi_api.telemetry.metrics import mark_worker_dead

    mark_worker_dead(worker.pid)


_OWN_METRICS_DIR = "PHI_API_OWN_METRICS_DIR"


def prepare_state_dir() -> None:
    """A fresh folder for the state the server's processes share (the model registry, the slots' lock file),
    named to the workers by ``PHI_API_STATE_DIR`` and removed at shutdown."""
    from phi_api.models.state import STATE_DIR_VARIABLE

    os.environ[STATE_DIR_VARIABLE] = tempfile.mkdtemp(prefix="phi-api-state-")


def prepare_metrics_dir() -> None:
    """Give the workers an empty folder to share Prometheus samples in (before prometheus_client is imported).

    A folder named by ``PROMETHEUS_MULTIPROC_DIR`` is emptied of earlier runs' files; otherwise a fresh
    temporary one is made, and removed at shutdown.
    """
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            if name.endswith(".db"):
                os.unlink(os.path.join(folder, name))
    else:
        folder = tempfile.mkdtemp(prefix="phi-api-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        os.environ[_OWN_METRICS_DIR] = folder
