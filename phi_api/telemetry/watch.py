"""What the operator's dashboard and alert rules (deploy/grafana, deploy/prometheus) watch beyond the serving metrics
of :mod:`phi_api.telemetry.metrics`: the time per generated token and in an engine's queue, errors by API key, the
models served and when each was loaded, the batch lines, the background responses, the stores' databases, and workers
that exited.

The series that have a fixed set of labels are made at once, at zero, so that a panel or a rule finds them before
the first event.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from phi_api.engine import Finished

_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
_QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_OUTCOMES = ("succeeded", "failed", "requeued", "rate_limited", "lease_lost")
BATCH_STATES = ("pending", "running")
BACKGROUND_OUTCOMES = ("ended", "stopped", "requeued")
DATABASE_ERRORS = ("unavailable", "other")

# Counted by the gunicorn master (the ``child_exit`` hook), which may hold no app and so no Metrics of its own; in
# multi-process mode every process's samples are read from the shared folder, whatever registry declared them.
WORKER_EXITS = Counter("phi_api_worker_exits", "Workers that exited while the server ran (gunicorn then starts "
                       "another)", registry=None)


class OperatorMetrics:
    """The series of the module's docstring, on the registry ``own`` names (``Metrics.ops``)."""

    def __init__(self, own: dict[str, Any]) -> None:
        own["registry"].register(WORKER_EXITS)
        self.time_per_token = Histogram("phi_api_time_per_output_token_seconds",
                                        "Decode time per generated token after the first, one sample per generation",
                                        buckets=_TOKEN_BUCKETS, **own)
        self.queue_time = Histogram("phi_api_request_queue_seconds", "Time a request waited in its engine's queue "
                                    "(for key/value room and its turn) before it started", buckets=_QUEUE_BUCKETS,
                                    **own)
        self.key_errors = Counter("phi_api_key_errors", "Requests of an API key answered with an error, by key name "
                                  "and status", ["key_name", "status"], **own)
        self.model_loaded = Gauge("phi_api_model_loaded_timestamp_seconds", "When each served model was loaded on the "
                                  "server (Unix time); 0 once it is no longer served", ["model_name"],
                                  multiprocess_mode="livemax", **own)
        self.batch_lines = Counter("phi_api_batch_lines", "Batch lines the runners took, by what became of them",
                                   ["outcome"], **own)
        self.batch_queued = Gauge("phi_api_batch_lines_queued", "Lines of batches not answered yet, by state",
                                  ["state"], multiprocess_mode="livemax", **own)
        self.database_errors = Counter("phi_api_database_errors", "Calls to a store's database that failed, by store "
                                       "and kind (unavailable: down, restarting or busy past its timeout)",
                                       ["store", "kind"], **own)
        self.database_up = Gauge("phi_api_database_up", "1 when a store's database answered the last check (every "
                                 "few seconds), else 0; the workers' lowest", ["store"],
                                 multiprocess_mode="livemin", **own)
        self.background_runs = Counter("phi_api_background_runs", "Background responses the runners took, by what "
                                       "became of them (requeued: the gate could not take it yet)", ["outcome"],
                                       **own)
        for outcome in BATCH_OUTCOMES:
            self.batch_lines.labels(outcome)
        for outcome in BACKGROUND_OUTCOMES:
            self.background_runs.labels(outcome)
        self._loaded: set[str] = set()
        self._failures: dict[tuple[str, str], int] = {}  # each database's cumulative count at its last look

    def observe_latency(self, finished: Finished) -> None:
        """A finished generation's time per token, and its request's time in the queue (with its first choice)."""
        rate = finished.decode_tokens_per_second
        if rate:
            self.time_per_token.observe(1.0 / rate)
        if finished.index == 0 and finished.queue_seconds is not None:
            self.queue_time.observe(finished.queue_seconds)

    def observe_models(self, loaded: dict[str, int]) -> None:
        """The models this worker serves, with when each was loaded; those it no longer serves drop to 0 (a label
        cannot be removed in multi-process mode)."""
        for model in self._loaded - set(loaded):
            self.model_loaded.labels(model).set(0)
        for model, when in loaded.items():
            self.model_loaded.labels(model).set(when)
        self._loaded = set(loaded)

    def observe_batch_queue(self, queued: dict[str, int]) -> None:
        """How many lines of batches wait or run now (``BatchStore.queued_lines``)."""
        for state in BATCH_STATES:
            self.batch_queued.labels(state).set(queued.get(state, 0))

    def observe_database(self, store: str, up: bool, failures: dict[str, int]) -> None:
        """A store's database: whether it answered a check now, and its cumulative failures by kind
        (``Database.failures``), counted from the last look."""
        self.database_up.labels(store).set(int(up))
        for kind in DATABASE_ERRORS:
            total = failures.get(kind, 0)
            new = total - self._failures.get((store, kind), 0)
            self.database_errors.labels(store, kind).inc(max(new, 0))
            self._failures[(store, kind)] = total
