"""The engine's settings, declared once: what each model's engine is built with.

The server builds one :class:`EngineConfig` per model from its settings (and
the model's own options) in :func:`phi_api.models.loading.load_engine`; the
engine, its thread and its batch read it from there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs (the README's configuration table names the settings these come from)."""

    name: str = ""  # the model's id: its part of the worker's key/value books is named so
    prefill_chunk: int = 64  # PREFILL_CHUNK_TOKENS: prompt tokens per step (the exact grid)
    timeout: float = 600.0  # GENERATION_TIMEOUT: seconds a generation may take, waiting included
    threads: int = 1  # INTRA_OP_THREADS: ONNX Runtime threads of the engine thread's session
    kv_budget_bytes: int = 1 << 30  # this model's keys and values in this worker at most (KV_CACHE_MB)
    max_rows: int = 64  # MAX_BATCH_ROWS: sequences advanced together at most
    encoder_batch_tokens: int = 8192  # ENCODER_BATCH_TOKENS: an encoder call's padded tokens at most
    prefix_cache: str = "on"  # PREFIX_CACHE: on, exact or off (engine.kv.reuse)
    prefill_slice: float = 0.2  # PREFILL_SLICE_SECONDS: the longest a prompt chunk holds others up
    batch_invariant: bool = False  # BATCH_INVARIANT: a row's numbers do not depend on the other rows of its steps
    draft_max: int = 0  # SPECULATIVE_DRAFT_MAX: how far a sequence may draft (engine.sched.verify)
    history_tokens: int = 0  # SPECULATIVE_HISTORY_TOKENS: a key's earlier answers kept to draft from
    tool_parser: str = "auto"  # TOOL_PARSER: how the model writes tool calls (read by the service, not the engine)
    reasoning_parser: str = "auto"  # REASONING_PARSER: how its thinking is told apart (read by the service)
    sampling_defaults: tuple[tuple[str, float], ...] = ()  # what a request that omits a field gets (the service's)
    prefix_disk_dir: str = ""  # PREFIX_CACHE_DIR: the disk tier's folder ("": none; engine.kv.disk)
    prefix_disk_bytes: int = 0  # PREFIX_CACHE_DISK_MB: the most the folder holds
    idle_wait: float = 1.0  # seconds the engine thread sleeps without work before it looks again
    checked: bool = False  # tests: check the batch's invariants after every iteration
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False)  # what steps are timed with

    def replace(self, **changes: object) -> EngineConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
