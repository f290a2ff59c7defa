"""The per-worker engine threads: each runs its generations, a step at a time.

Native OS threads in each worker own the generators. Each pass over a
thread's active jobs advances each by one unit of work: a prefill chunk of
``prefill_chunk`` prompt tokens, or one generated token. So a new request
starts within one pass instead of waiting for someone else's whole answer,
and a long prompt cannot stall the others' streams for its whole prefill.

Model steps go through the C API with the GIL released, so the worker's
gevent hub keeps serving while the thread computes. The thread never logs:
under gevent a logging handler's lock is a gevent lock, unsafe from another
OS thread. It reports each finished generation to the hub's thread instead.
"""

from __future__ import annotations

import collections
import os
import time
import traceback
from typing import Any, Callable, Protocol

from phi_api.engine.cache import PromptCache
from phi_api.engine.job import Finished, Job, TextDelta
from phi_api.engine.logits import LogitsEditor
from phi_api.engine.native import Signal, new_lock, start_thread
from phi_api.engine.text import TextAssembler
from phi_api.engine.wakeup import HubRelay

Report = Callable[[Job, Finished], None]


class Generator(Protocol):
    def append_tokens(self, tokens: Any) -> None: ...
    def generate_next_token(self) -> int: ...
    def is_done(self) -> bool: ...
    def process_logits(self, process: Any) -> None: ...
    def close(self) -> None: ...


class Model(Protocol):
    """What the scheduler needs from a model (``LanguageModel``, or a fake in tests)."""

    info: Any

    def new_generator(self, search_options: dict[str, float | bool],
                      guidance: tuple[str, str] | None = None) -> Generator: ...
    def create_stream(self) -> Any: ...


class _Running:
    """Engine-thread state of one job."""

    def __init__(self, model: Model, job: Job, prefill_chunk: int, report: Report, cache: Any,
                 headroom: int) -> None:
        self.job = job
        self.finished = False
        self._report = report
        self._model = model
        self._chunk = prefill_chunk
        self._cache = cache
        self._headroom = headroom
        self._reuse_key = job.params.reuse_key if cache.enabled else None
        self._generator: Generator | None = None
        self._capacity = 0
        self._stream: Any = None
        self._text: TextAssembler | None = None
        self._editor = LogitsEditor(job.params) if job.params.edits_logits else None
        self._prefilled = 0
        self._reused = 0
        self._generated: list[int] = []
        self._first_token_at: float | None = None

    def advance(self) -> None:
        """Do one unit of work: a prefill chunk (the first one starts the generation), or one token."""
        job = self.job
        if job.cancelled:
            self._finish("cancelled")
            return
        if time.monotonic() > job.deadline:
            self._finish("timeout")
            return
        if self._generator is None:
            self._start()
        if self._prefilled < len(job.prompt):
            # Chunks on a fixed grid (see engine.cache: what makes reuse exact on any CPU).
            end = min(self._prefilled + self._chunk, len(job.prompt))
            self._generator.append_tokens(job.prompt[self._prefilled:end])
            self._prefilled = end
        else:
            self._decode_one()

    def fail(self, error: Exception) -> None:
        """End the job because the engine raised ``error``."""
        detail = "".join(traceback.format_exception(error)).rstrip()
        self._reuse_key = None  # a generator that failed is not kept
        try:
            self._finish("error", error=detail)
        except Exception as release_error:  # releasing a broken generator failed too: still end the job
            self._generator = self._stream = None
            detail += "\nwhile releasing it: " + "".join(traceback.format_exception(release_error)).rstrip()
            self._publish(Finished("error", len(self.job.prompt), len(self._generated), None, 0.0, detail,
                                   index=self.job.index))

    def _start(self) -> None:
        prompt, params = self.job.prompt, self.job.params
        needed = len(prompt) + params.max_tokens
        taken = self._cache.take(prompt, needed, self._reuse_key) if self._reuse_key is not None else None
        if taken is not None:
            self._generator, self._reused, self._capacity = taken
            self._prefilled = self._reused
        else:
            # Room for the next turn of the conversation, when this one may be kept.
            extra = self._headroom if self._reuse_key is not None else 0
            self._capacity = min(self._model.info.context_length, needed + extra)
            self._generator = self._model.new_generator(params.search_options(len(prompt), self._capacity),
                                                        params.guidance)
        self._stream = self._model.create_stream()
        self._text = TextAssembler(self._stream, params.stop)

    def _decode_one(self) -> None:
        assert self._generator is not None and self._text is not None
        if self._editor is not None:
            self._generator.process_logits(self._editor)
        token = self._generator.generate_next_token()
        self._generated.append(token)
        if self._first_token_at is None:
            self._first_token_at = time.monotonic()
        record = self._editor.observe(token) if self._editor is not None else None
        if token in self._model.info.eos_token_ids:
            self._finish("stop")
            return
        pieces, stopped = self._text.add(token, record)
        self._emit(pieces)
        if stopped:
            self._finish("stop", flush=False)
        elif len(self._generated) >= self.job.params.max_tokens:
            self._finish("length")
        elif self._generator.is_done():
            self._finish("stop")

    def _emit(self, pieces: list) -> None:
        records = tuple((piece.text, piece.logprob) for piece in pieces if piece.logprob is not None)
        text = "".join(piece.text for piece in pieces)
        if text or records:
            self.job.emit(TextDelta(text, records, self.job.index))

    def _finish(self, reason: str, *, flush: bool = True, error: str | None = None) -> None:
        if flush and self._text is not None and reason in ("stop", "length"):
            self._emit(self._text.finish())
        self._release(keep=reason in ("stop", "length"))
        now = time.monotonic()
        first = self._first_token_at
        self._publish(Finished(
            reason=reason,
            prompt_tokens=len(self.job.prompt),
            completion_tokens=len(self._generated),
            time_to_first_token=(first - self.job.submitted_at) if first is not None else None,
            decode_seconds=(now - first) if first is not None else 0.0,
            error=error,
            cached_tokens=self._reused,
            index=self.job.index,
        ))

    def _publish(self, finished: Finished) -> None:
        self.finished = True
        self.job.emit(finished)
        self._report(self.job, finished)

    def _release(self, keep: bool) -> None:
        if self._stream is not None:
            self._stream.close()
        generator, self._generator, self._stream = self._generator, None, None
        if generator is None:
            return
        # Only the prompt is offered for reuse, though the KV cache also holds the
        # answer: keys and values computed token by token while decoding differ
        # in the last bits from those a prefill computes (measured: logits off by
        # up to 1.5), while prefill chunking changes nothing. Re-prefilling the
        # answer keeps a reused conversation's output identical to a cold one's.
        if keep and self._reuse_key is not None and self._cache.put(generator, self.job.prompt, self._capacity,
                                                                    self._reuse_key):
            return
        generator.close()


class _SharedCache:
    """The prompt cache, shared by the engine threads of a process (each call takes a native lock)."""

    def __init__(self, cache: PromptCache) -> None:
        self._cache = cache
        self._lock = new_lock()

    @property
    def enabled(self) -> bool:
        return self._cache.enabled

    def take(self, *args: Any) -> Any:
        with self._lock:
            return self._cache.take(*args)

    def put(self, *args: Any) -> bool:
        with self._lock:
            return self._cache.put(*args)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()


class _Lane:
    """One engine thread and the generations it runs, each advanced a step per pass."""

    def __init__(self) -> None:
        self.inbox: collections.deque[Job] = collections.deque()
        self.signal = Signal()
        self.assigned = 0  # written by the hub's thread only
        self.finished = 0  # written by this lane's thread only

    @property
    def load(self) -> int:
        """Generations given to this lane and not finished yet."""
        return self.assigned - self.finished


class Scheduler:
    """Owns this process's engine threads ("lanes") and the generations they run.

    A model preloaded before the fork computes on one core per call (ONNX
    Runtime's thread pool does not survive the fork), so a worker runs one lane
    per core it may use, and a new generation goes to the least loaded lane.
    """

    def __init__(self, model: Model, *, prefill_chunk: int, report: Report, lanes: int = 1, cache_bytes: int = 0,
                 cache_headroom: int = 0, idle_wait: float = 1.0) -> None:
        self._model = model
        self._prefill_chunk = prefill_chunk
        self._report = report
        self._lane_count = lanes
        self._cache = _SharedCache(PromptCache(cache_bytes, model.info.kv_bytes_per_token, prefill_chunk))
        self._headroom = cache_headroom
        self._relay: HubRelay | None = None
        self._idle_wait = idle_wait
        self._lanes: list[_Lane] = []
        self._started_pid: int | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        """Whether this process's engine threads are up."""
        return self._started_pid == os.getpid() and not self._stopping

    def start(self) -> None:
        """Start the engine threads in this process (after a fork, new ones); call from the hub's thread."""
        if self._started_pid != os.getpid():
            self._started_pid = os.getpid()
            self._stopping = False
            self._relay = HubRelay(lambda item: self._report(*item))
            self._lanes = [_Lane() for _ in range(self._lane_count)]
            for lane in self._lanes:
                start_thread(lambda lane=lane: self._run(lane))

    def submit(self, job: Job) -> None:
        """Queue ``job`` on the least loaded lane; it starts within one pass of that lane's loop."""
        self.start()
        lane = min(self._lanes, key=lambda candidate: candidate.load)
        lane.assigned += 1
        lane.inbox.append(job)
        lane.signal.set()

    def stop(self) -> None:
        """Ask the engine threads to cancel what they run and exit."""
        self._stopping = True
        for lane in self._lanes:
            lane.signal.set()

    def _running(self, job: Job) -> _Running:
        relay = self._relay
        return _Running(self._model, job, self._prefill_chunk, lambda job, finished: relay.send((job, finished)),
                        self._cache, self._headroom)

    def _run(self, lane: _Lane) -> None:
        active: list[_Running] = []
        while not self._stopping:
            while lane.inbox:
                active.append(self._running(lane.inbox.popleft()))
            if not active:
                lane.signal.wait(self._idle_wait)
                continue
            for running in active:
                try:
                    running.advance()
                except Exception as exc:  # one broken generation must not stop the others
                    running.fail(exc)
            still = [running for running in active if not running.finished]
            lane.finished += len(active) - len(still)
            active = still
        while lane.inbox:
            active.append(self._running(lane.inbox.popleft()))
        for running in active:
            running.job.cancel()
            running.advance()
        self._cache.clear()
