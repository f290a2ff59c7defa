"""The engine's one face to the service: a loaded model and this process's engine thread, behind one :class:`Engine`
per model, and each submitted request's :class:`Generation`.

``Engine`` bundles the loaded model (shared, loaded once before gunicorn
forks) with this process's engine loop: the engine thread, started after the
fork, that runs every generation of the worker in one continuous batch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from phi_api.engine.choice import Choice, Event, Finished
from phi_api.engine.config import EngineConfig
from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.kv.disk import DiskStats
from phi_api.engine.params import SamplingParams
from phi_api.engine.runtime.model import Model, ModelInfo
from phi_api.engine.sampling.lookup import Index
from phi_api.engine.sched.loop import EngineLoad, EngineLoop
from phi_api.engine.threads.native import off_hub, spawn
from phi_api.engine.threads.wakeup import HubWaker

log = logging.getLogger("phi_api.engine")  # the name its lines have always had
DISK_LOG_SECONDS = 60.0


class Generation:
    """The request side of a submitted request: its choices, and one waker for all of them."""

    def __init__(self, choices: list[Choice], waker: HubWaker) -> None:
        self._choices = choices
        self._waker = waker

    @property
    def prompt_tokens(self) -> int:
        """Length of the prompt, in tokens."""
        return len(self._choices[0].prompt)

    def events(self, idle_timeout: float | None = None) -> Iterator[Event | None]:
        """Yield every choice's events (each carries its ``index``) until all are ``Finished``;
        yield ``None`` after ``idle_timeout`` seconds without any."""
        running = len(self._choices)
        while running:
            events = [event for choice in self._choices for event in choice.drain()]
            for event in events:
                yield event
                if isinstance(event, Finished):
                    running -= 1
            if running and not events and not self._waker.wait(idle_timeout):
                yield None

    def cancel(self) -> None:
        """Stop the generations at the engine's next step; their ``Finished`` events will say ``cancelled``."""
        for choice in self._choices:
            choice.cancel()

    def close(self, then: Callable[[Finished], None] | None = None) -> None:
        """Done with this request: cancel what still runs, and stop listening for its events. ``then`` is told each
        choice's end that was not read: now for those already ended, when the engine reports it for the others
        (on a greenlet of its own), however they end."""
        self.cancel()
        self._waker.close()
        if then is None:
            return
        for choice in self._choices:
            ended = [event for event in choice.drain() if isinstance(event, Finished)]
            if ended:
                then(ended[-1])
            else:  # its end is yet to come: the engine's report tells it (see Engine._report)
                choice.on_report = then


class Engine:
    """The model, its tokenizer and this process's engine loop."""

    def __init__(self, model: Model, config: EngineConfig, memory: SharedBudget | None = None,
                 draft: Model | None = None) -> None:
        """``memory``: the worker's key/value budget, shared with its other engines (one of its own if none);
        ``draft``: a draft model of the same vocabulary (:mod:`engine.sched.drafts`)."""
        self.model = model
        granule = model.spec.kv_granule
        if config.prefix_disk_dir and config.prefill_chunk % granule:
            log.warning("the disk tier is off: its chunks (PREFILL_CHUNK_TOKENS, %d) must be whole tiles of %d tokens "
                        "of the attention operator's keys and values", config.prefill_chunk, granule)
            config = dataclasses.replace(config, prefix_disk_dir="")
        self.config = config
        self.observers: list[Callable[[Choice, Finished], None]] = [
            lambda choice, finished: log_generation(choice, finished, config.name)]
        self.draft = draft
        self.loop = EngineLoop(model, config, report=self._report, memory=memory, draft=draft)
        self.draining = False  # set when this worker starts shutting down
        self.loaded_at = int(time.time())
        self._timeout = config.timeout
        self._token_table: dict[int, bytes] | None = None
        self._disk_failures = 0  # write failures of the disk tier already logged ...
        self._disk_logged_at = -DISK_LOG_SECONDS  # ... and when (at most one line a minute)

    @property
    def info(self) -> ModelInfo:
        """Facts about the loaded model folder."""
        return self.model.info

    @property
    def folders(self) -> dict[str, int]:
        """The model folders this engine maps (its model's, and its draft model's), and their files' bytes."""
        models = [self.model] + ([self.draft] if self.draft is not None else [])
        return {model.info.path: model.info.size_bytes for model in models}

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (tokenized off the hub: see :func:`engine.threads.native.off_hub`)."""
        return off_hub(self.model.encode, text)

    def decode(self, tokens: Any) -> str:
        """Text of ``tokens``."""
        return off_hub(self.model.decode, tokens)

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for.

        The table is read from the model folder at first use (about 0.2 s for a
        49k vocabulary), off the hub: only workers that answer with
        log-probabilities pay for it, and their other requests do not wait.
        """
        table = self._token_table
        if table is None:
            table = self._token_table = off_hub(lambda: self.model.token_bytes)
        return table.get(token, b"")

    @property
    def longest_token_bytes(self) -> int:
        """Bytes of the vocabulary's longest token (0: unknown); a text of more than
        ``context_length`` times this cannot fit the context."""
        return self.model.longest_token_bytes

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True, variables: dict[str, Any] | None = None) -> str:
        """The prompt text for chat ``messages`` (and ``tools``, when the template renders them; ``variables``:
        what else the template reads, such as Qwen3's ``enable_thinking``)."""
        return off_hub(self.model.render_chat, messages, tools, add_generation_prompt, variables)

    def check_capacity(self, prompt_tokens: int, max_tokens: int, choices: int) -> None:
        """Raise :class:`phi_api.errors.CapacityError` for a request the key/value budget could never hold."""
        self.loop.check_capacity(prompt_tokens, max_tokens, choices)

    def submit(self, prompt: np.ndarray, params: SamplingParams | list[SamplingParams],
               request_id: str = "-", priority: int = 0, cache_key: str = "") -> Generation:
        """Start generating, one choice per parameter set, at ``priority`` (lower is sooner); the returned handle
        streams the results. Keys and values are reused only among requests of the same ``cache_key`` (in memory
        and on disk): a tenant's prompts are never reused, nor seen to be, by another.

        A grammar is compiled here, off the hub, once per choice: the engine
        thread never spends a step's time on it.
        """
        each = params if isinstance(params, list) else [params]
        return self.submit_prompts([prompt], each, request_id=request_id, priority=priority, cache_key=cache_key)

    def submit_prompts(self, prompts: list[np.ndarray], params: list[SamplingParams], request_id: str = "-",
                       priority: int = 0, cache_key: str = "") -> Generation:
        """:meth:`submit` for several prompts at once (a completion request's list): ``params`` holds each
        prompt's choices in turn, as many for each; the choices are numbered across the prompts, in that order."""
        per_prompt = len(params) // len(prompts)
        assert per_prompt * len(prompts) == len(params), "as many choices for each prompt"
        guides = [off_hub(self.model.guide, one.guidance) if one.guidance else None for one in params]
        predictions = [off_hub(Index, one.prediction) if one.prediction else None for one in params]
        # A prediction's tokens move into its index: the engine holds them once.
        params = [dataclasses.replace(one, prediction=()) if one.prediction else one for one in params]
        waker = HubWaker()
        choices = [Choice(prompts[index // per_prompt], one, timeout=self._timeout, notify=waker.notify,
                          request_id=request_id, index=index, guide=guide, priority=priority, cache_key=cache_key,
                          first_of_prompt=index % per_prompt == 0, prediction=prediction)
                   for index, (one, guide, prediction) in enumerate(zip(params, guides, predictions, strict=True))]
        for start in range(0, len(choices), per_prompt):  # one engine request per prompt: prefilled once each
            self.loop.submit(choices[start:start + per_prompt])
        return Generation(choices, waker)

    def start(self) -> None:
        """Start this process's engine thread (call after forking); it loads its decoder session."""
        self.loop.start()

    @property
    def load(self) -> EngineLoad:
        """What this process's engine holds now: waiting requests, running sequences, booked key/value memory."""
        return self.loop.load

    @property
    def disk_stats(self) -> DiskStats | None:
        """What this worker's disk tier of prefix reuse did for this model (None: it has none)."""
        return self.loop.disk_stats

    def report_disk(self) -> None:
        """Log the disk tier's write failures since the last report, at most once a minute (on the hub; its threads
        never log)."""
        stats = self.disk_stats
        if time.monotonic() - self._disk_logged_at < DISK_LOG_SECONDS:
            return
        if stats is not None and stats.write_failures > self._disk_failures:
            self._disk_logged_at = time.monotonic()
            log.warning("%d chunks of prompts could not be written to %s (last: %s); requests are not affected",
                        stats.write_failures - self._disk_failures, self.config.prefix_disk_dir, stats.last_error)
            self._disk_failures = stats.write_failures

    @property
    def waiting_for_memory(self) -> bool:
        """Whether this engine's next request waits for key/value memory (its own or the worker's budget)."""
        batch = self.loop.batch
        account = batch.ledger.account if batch is not None else None
        return bool(account is not None and account.waiting_for_room and batch is not None and batch.waiting)

    @property
    def kv_dtype(self) -> str:
        """The type keys and values are kept in (``float32``, ``int8`` or ``int4``)."""
        return self.model.spec.kv_kind

    @property
    def attention_kernel(self) -> str:
        """Which attention computes: ``phi-api`` (its operator, over int8 keys and values) or ``onnxruntime``."""
        return "phi-api" if self.model.spec.kv_layout else "onnxruntime"

    @property
    def ready(self) -> bool:
        """Whether this process can generate: engine thread up with its session, not shutting down."""
        return self.loop.running and not self.draining

    def _report(self, choice: Choice, finished: Finished) -> None:
        for observer in self.observers:
            observer(choice, finished)
        if choice.on_report is not None:  # the request side has stopped listening: it is told here (it may wait,
            spawn(choice.on_report, finished)  # for a database say: not in the hub's callback)

    def stop(self) -> None:
        """Cancel running generations and stop the engine thread."""
        self.loop.stop()

    def retire(self) -> None:
        """The model is unloaded: take nothing new, finish what runs, then free the session."""
        self.draining = True
        self.loop.retire()

    def end_all(self, reason: str) -> None:
        """End every generation now, each reported with ``reason``."""
        self.loop.end_all(reason)


def log_generation(choice: Choice, finished: Finished, model: str = "") -> None:
    """The one log line of every generation (run on the hub's thread, never the engine's)."""
    ttft = f"{finished.time_to_first_token * 1000:.0f}" if finished.time_to_first_token is not None else "-"
    rate = finished.decode_tokens_per_second
    fields = {"model": model, "finish_reason": finished.reason, "prompt_tokens": finished.prompt_tokens,
              "cached_tokens": finished.cached_tokens, "completion_tokens": finished.completion_tokens,
              "ttft_ms": round(finished.time_to_first_token * 1000) if finished.time_to_first_token else None,
              "tokens_per_s": round(rate, 1) if rate else None, "priority": choice.priority}
    extra = {"request_id": choice.request_id, "fields": fields}
    log.info(
        "generation finish_reason=%s prompt_tokens=%d cached_tokens=%d completion_tokens=%d ttft_ms=%s "
        "tokens_per_s=%s batch_rows=%.1f",
        finished.reason, finished.prompt_tokens, finished.cached_tokens, finished.completion_tokens, ttft,
        f"{rate:.1f}" if rate else "-", finished.batch_rows, extra=extra,
    )
    if finished.reason == "grammar":  # the request's own grammar: a warning, without the grammar it quotes
        log.warning("%s", (finished.error or "").splitlines()[0] if finished.error else "", extra=extra)
    elif finished.error:
        log.error("generation failed in the engine", extra={**extra, "traceback": finished.error})
