"""Prometheus metrics through ``prometheus-client``, correct across gunicorn workers.

Under gunicorn, ``gunicorn.conf.py`` points ``PROMETHEUS_MULTIPROC_DIR`` at a
fresh folder before anything imports prometheus_client, so every worker
writes its samples there and ``GET /metrics`` (served by any worker) merges
them with ``MultiProcessCollector``. Without it (tests, the Flask dev
server), the app's own registry is served.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from phi_api.engine import Finished
from phi_api.engine.choice import Choice
from phi_api.telemetry.watch import WORKER_EXITS, OperatorMetrics

_RATE_BUCKETS = (5, 10, 25, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000)
_ROW_BUCKETS = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def multiprocess_dir() -> str | None:
    """The folder the workers share their samples in, when running under gunicorn."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    """The server's metrics, registered on a registry of their own (not the process-wide default)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        own: dict[str, Any] = {"registry": self.registry}
        self._declare_requests(own)
        self._declare_engines(own)
        self._declare_disk(own)
        self._declare_keys(own)
        self._declare_hub(own)
        self.ops = OperatorMetrics(own)  # what the operator's dashboard and alerts watch besides
        self._published: set[str] = set()
        self._totals: dict[tuple[str, str], int] = {}  # what each cumulative count was at its last look

    def _declare_requests(self, own: dict[str, Any]) -> None:
        """Requests and generations."""
        self.requests = Counter("phi_api_requests", "HTTP requests answered, by route, method and status",
                                ["route", "method", "status"], **own)
        self.in_flight = Gauge("phi_api_requests_in_flight", "HTTP requests being served",
                               multiprocess_mode="livesum", **own)
        self.rate_limited = Counter("phi_api_rate_limited", "Requests refused with 429", **own)
        self.generations = Counter("phi_api_generations", "Generations, by finish reason", ["finish_reason"], **own)
        self.ttft = Histogram("phi_api_time_to_first_token_seconds", "Time to first token",
                              buckets=_TTFT_BUCKETS, **own)
        self.prompt_tokens = Counter("phi_api_prompt_tokens", "Prompt tokens of finished generations", **own)
        self.cached_tokens = Counter("phi_api_cached_prompt_tokens", "Prompt tokens reused from the cache", **own)
        self.generated_tokens = Counter("phi_api_generated_tokens", "Tokens generated", **own)
        self.drafts = DraftMetrics(own)
        self.prefill_rate = Histogram("phi_api_prefill_tokens_per_second", "Prefill throughput per generation",
                                      buckets=_RATE_BUCKETS, **own)
        self.decode_rate = Histogram("phi_api_decode_tokens_per_second", "Decode throughput per generation",
                                     buckets=_RATE_BUCKETS, **own)
        self.batch_rows = Histogram("phi_api_generation_batch_rows",
                                    "Rows per batched decode step a generation ran in, on average",
                                    buckets=_ROW_BUCKETS, **own)

    def _declare_engines(self, own: dict[str, Any]) -> None:
        """What each worker's engines hold, summed over live workers (the gateway metrics are derived from these),
        and the memory budget (MEMORY_LIMIT_MB) and its parts (docs/memory.md)."""
        live: dict[str, Any] = {"multiprocess_mode": "livesum", "labelnames": ["model_name"], **own}
        self.engine_waiting = Gauge("phi_api_engine_requests_waiting",
                                    "Requests admitted to an engine, waiting for key/value room", **live)
        self.engine_running = Gauge("phi_api_engine_sequences_running",
                                    "Sequences prefilling or decoding (a request's n choices count n)", **live)
        self.kv_used = Gauge("phi_api_kv_cache_reserved_bytes",
                             "Key/value memory booked by running sequences (kept prefixes, which give way, not "
                             "counted)", **live)
        self.kv_budget = Gauge("phi_api_kv_cache_budget_bytes", "Key/value budget (KV_CACHE_MB), every worker's",
                               **live)
        self.memory_limit = Gauge("phi_api_memory_limit_bytes", "The whole server's memory budget (MEMORY_LIMIT_MB)",
                                  multiprocess_mode="max", **own)
        self.memory_weights = Gauge("phi_api_memory_weights_bytes", "The loaded models' weights, counted once",
                                    multiprocess_mode="max", **own)
        self.memory_master = Gauge("phi_api_memory_master_private_bytes",
                                   "The gunicorn master's own memory, measured after it loaded the models",
                                   multiprocess_mode="max", **own)
        self.memory_process = Gauge("phi_api_memory_worker_private_bytes",
                                    "Each worker's own memory beyond keys and values (measured), summed",
                                    multiprocess_mode="livesum", **own)
        self.kv_share = Gauge("phi_api_kv_cache_share_bytes", "Each worker's share of the budget for keys and values, "
                              "summed", multiprocess_mode="livesum", **own)
        self.kv_kept = Gauge("phi_api_kv_cache_kept_bytes", "Key/value memory kept prefixes hold (they give way)",
                             **live)
        self.kv_staged = Gauge("phi_api_kv_cache_staged_bytes", "Key/value memory booked beside the rows (draft "
                               "models' rows, copies on their way to disk), summed", multiprocess_mode="livesum",
                               **own)
        self.kv_evictions = Counter("phi_api_kv_cache_evictions", "Kept prefixes given up to make room or unused",
                                    ["model_name"], **own)
        self.memory_waiting = Gauge("phi_api_engine_requests_waiting_for_memory",
                                    "Engines whose next request waits for key/value memory", **live)

    def _declare_hub(self, own: dict[str, Any]) -> None:
        """How late the gevent hub ran what was due (what every stream of a worker waits behind)."""
        self.hub_stall = Histogram("phi_api_hub_stall_seconds", "How late the hub woke a timer due every 50 ms",
                                   buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), **own)
        self.queued = Gauge("phi_api_requests_queued", "Generation requests waiting in line for a slot "
                            "(MAX_QUEUED_REQUESTS), every worker's", multiprocess_mode="livesum", **own)
        self.hub_longest_stall = Gauge("phi_api_hub_longest_stall_seconds", "The longest such lateness since the "
                                       "worker started, the workers' longest", multiprocess_mode="livemax", **own)

    def _declare_disk(self, own: dict[str, Any]) -> None:
        """The disk tier of prefix reuse (engine.kv.disk), by model; its folder's size is every model's."""
        disk: dict[str, Any] = {"labelnames": ["model_name"], **own}
        self.disk_read = Counter("phi_api_prefix_disk_read_tokens", "Prompt tokens read from disk, not computed",
                                 **disk)
        self.disk_written = Counter("phi_api_prefix_disk_written_tokens", "Prompt tokens written to disk", **disk)
        self.disk_failures = Counter("phi_api_prefix_disk_write_failures", "Chunks that could not be written to disk",
                                     **disk)
        self.disk_unstaged = Counter("phi_api_prefix_disk_unstored_chunks",
                                     "Chunks not stored: the writer was behind, or the budget had no room to stage "
                                     "them", **disk)
        self.disk_corrupt = Counter("phi_api_prefix_disk_bad_files", "Files on disk that failed a check, removed",
                                    **disk)
        self.disk_load = Histogram("phi_api_prefix_disk_load_seconds", "Time to read a prompt's stored chunks",
                                   buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), **own)
        self.disk_bytes = Gauge("phi_api_prefix_disk_bytes", "Bytes the prompts on disk take (PREFIX_CACHE_DISK_MB)",
                                multiprocess_mode="max", **own)

    def _declare_keys(self, own: dict[str, Any]) -> None:
        """Usage by API key name (never the key): phi_api.limits.keys."""
        by_key: dict[str, Any] = {"labelnames": ["key_name"], **own}
        self.key_requests = Counter("phi_api_key_requests", "Generation requests, by API key name", **by_key)
        self.key_prompt = Counter("phi_api_key_prompt_tokens", "Prompt tokens, by API key name", **by_key)
        self.key_cached = Counter("phi_api_key_cached_tokens", "Prompt tokens reused, by API key name", **by_key)
        self.key_completion = Counter("phi_api_key_completion_tokens", "Tokens generated, by API key name", **by_key)

    def observe_generation(self, model: str, choice: Choice, finished: Finished) -> None:
        """Record a finished generation of ``model`` (called on the hub's thread)."""
        self.generations.labels(finished.reason).inc()
        self.prompt_tokens.inc(finished.prompt_tokens)
        self.cached_tokens.inc(finished.cached_tokens)
        self.generated_tokens.inc(finished.completion_tokens)
        self.drafts.observe(model, finished)
        ttft = finished.time_to_first_token
        if ttft:
            self.ttft.observe(ttft)
            self.prefill_rate.observe((finished.prompt_tokens - finished.cached_tokens) / ttft)
        if finished.decode_tokens_per_second:
            self.decode_rate.observe(finished.decode_tokens_per_second)
        if finished.batch_rows:
            self.batch_rows.observe(finished.batch_rows)
        self.ops.observe_latency(finished)

    def observe_engines(self, engines: dict[str, Any]) -> None:
        """Publish what this worker's engines (by model id) hold now, and drop the series of models no longer
        served (called on the hub's thread, periodically: see serving.post_worker_init)."""
        gauges = (self.engine_waiting, self.engine_running, self.kv_used, self.kv_budget)
        for model in self._published - set(engines):
            for gauge in (*gauges, self.kv_kept, self.memory_waiting):
                try:
                    gauge.remove(model)
                except KeyError:  # never published for this model
                    pass
        for model, engine in engines.items():
            load = engine.load
            values = (load.waiting, load.running, load.kv_reserved, load.kv_budget)
            for gauge, value in zip(gauges, values, strict=True):
                gauge.labels(model).set(value)
        self._published = set(engines)

    def observe_memory(self, usage: dict[str, Any], books: dict[str, Any], weights: int,
                       waiting: dict[str, bool]) -> None:
        """Publish the memory budget's parts (``ServerMemory.usage``), this worker's key/value books by model
        (``SharedBudget.usage``) and which engines wait for memory (called with :meth:`observe_engines`)."""
        self.memory_limit.set(usage["limit"])
        self.memory_weights.set(weights)
        self.memory_master.set(usage["master_private"])
        self.memory_process.set(usage["worker_private"])
        self.kv_share.set(usage["kv_share"])
        self.kv_staged.set(books["staged"])
        for model, (_, kept_bytes, evictions) in books["engines"].items():
            self.kv_kept.labels(model).set(kept_bytes)
            self._advance(self.kv_evictions, model, evictions)
        for model, flag in waiting.items():
            self.memory_waiting.labels(model).set(int(flag))

    def observe_key(self, name: str, prompt: int, cached: int, completion: int, requests: int) -> None:
        """Count what a key's generation used (on the hub, as each of its choices ends)."""
        for counter, value in ((self.key_requests, requests), (self.key_prompt, prompt), (self.key_cached, cached),
                               (self.key_completion, completion)):
            counter.labels(name).inc(value)

    def observe_disk(self, engines: dict[str, Any]) -> None:
        """Publish what each engine's disk tier did since the last look (called with :meth:`observe_engines`)."""
        for model, engine in engines.items():
            stats = engine.disk_stats
            if stats is None:
                continue
            self._advance(self.disk_read, model, stats.tokens_read)
            self._advance(self.disk_written, model, stats.tokens_written)
            self._advance(self.disk_failures, model, stats.write_failures)
            self._advance(self.disk_corrupt, model, stats.corrupt)
            self._advance(self.disk_unstaged, model, stats.not_staged)
            while stats.load_seconds:
                self.disk_load.observe(stats.load_seconds.popleft())
            self.disk_bytes.set(stats.bytes_on_disk)

    def _advance(self, counter: Counter, model: str, total: int) -> None:
        """Count what a cumulative ``total`` of ``model``'s engine gained since the last look (the series is made at
        zero: a panel or an alert finds it before the first event)."""
        key = (str(id(counter)), model)
        new = total - self._totals.get(key, 0)
        counter.labels(model).inc(max(new, 0))
        self._totals[key] = total

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every worker's samples, and the gateway metrics derived from them, with its
        content type."""
        if multiprocess_dir():
            source = CollectorRegistry()
            multiprocess.MultiProcessCollector(source)
        else:
            source = self.registry
        registry = CollectorRegistry()
        registry.register(_Forward(source))
        registry.register(_GatewayMetrics(source))
        return generate_latest(registry), CONTENT_TYPE_LATEST



class DraftMetrics:
    """Speculative decoding, by model (vLLM's ``model_name``): draft tokens checked and kept, in all and by source
    (prompt, prediction, history)."""

    def __init__(self, own: dict[str, Any]) -> None:
        self.drafted = Counter("phi_api_draft_tokens", "Draft tokens verified", ["model_name"], **own)
        self.accepted = Counter("phi_api_draft_accepted_tokens", "Draft tokens kept", ["model_name"], **own)
        self.checks = Counter("phi_api_draft_checks", "Steps that checked a draft", ["model_name"], **own)
        self.beside = Counter("phi_api_draft_checks_beside", "Drafts checked in a batched step with other rows",
                              ["model_name"], **own)
        self.by_source = Counter("phi_api_draft_source_tokens", "Draft tokens checked and kept, by source",
                                 ["model_name", "source", "outcome"], **own)

    def observe(self, model: str, finished: Finished) -> None:
        if not finished.draft_checks:  # no series for a model that never drafted
            return
        self.drafted.labels(model).inc(finished.drafted_tokens)
        self.accepted.labels(model).inc(finished.accepted_tokens)
        self.checks.labels(model).inc(finished.draft_checks)
        self.beside.labels(model).inc(finished.draft_checks_beside)
        for source, checked, kept in finished.draft_sources:
            self.by_source.labels(model, source, "checked").inc(checked)
            self.by_source.labels(model, source, "kept").inc(kept)


class _Forward:
    """Another registry's metrics, as a collector (to add derived ones beside them)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Any:
        return self._source.collect()


class _GatewayMetrics:
    """vLLM's names for the load an inference gateway's endpoint picker routes by (the Gateway API Inference
    Extension's model server protocol, also read by llm-d): the engines' waiting and running requests, and the
    share of the key/value budget in use, from 0 to 1, across every worker of the server."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Any:
        sums: dict[str, dict[str, float]] = {}
        for family in self._source.collect():
            if not family.name.startswith(("phi_api_engine_", "phi_api_kv_cache_")):
                continue
            for sample in family.samples:
                model = sample.labels.get("model_name", "")
                sums.setdefault(model, {})[family.name] = sums.get(model, {}).get(family.name, 0.0) + sample.value
        gauges = [GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting to be processed",
                                    labels=["model_name"]),
                  GaugeMetricFamily("vllm:num_requests_running", "Requests being prefilled or decoded",
                                    labels=["model_name"]),
                  GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent",
                                    labels=["model_name"])]
        for model, values in sorted(sums.items()):
            budget = values.get("phi_api_kv_cache_budget_bytes", 0.0)
            gauges[0].add_metric([model], values.get("phi_api_engine_requests_waiting", 0.0))
            gauges[1].add_metric([model], values.get("phi_api_engine_sequences_running", 0.0))
            reserved = values.get("phi_api_kv_cache_reserved_bytes", 0.0)
            gauges[2].add_metric([model], reserved / budget if budget else 0.0)
        yield from gauges


def mark_worker_dead(pid: int) -> None:
    """Drop a dead worker's live gauges and count its exit (gunicorn's ``child_exit`` hook, in the master)."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)
        WORKER_EXITS.inc()
