"""The per-worker engine thread: runs every active generation, a step at a time.

One native OS thread per worker owns all generators. Each pass over the
active jobs advances each by one unit of work: a prefill chunk of
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

from phi_api.engine.job import Finished, Job, TextDelta
from phi_api.engine.logits import LogitsEditor
from phi_api.engine.native import Signal, start_thread
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

    def new_generator(self, search_options: dict[str, float | bool]) -> Generator: ...
    def create_stream(self) -> Any: ...


class _Running:
    """Engine-thread state of one job."""

    def __init__(self, model: Model, job: Job, prefill_chunk: int, report: Report) -> None:
        self.job = job
        self.finished = False
        self._report = report
        self._model = model
        self._chunk = prefill_chunk
        self._generator: Generator | None = None
        self._stream: Any = None
        self._text: TextAssembler | None = None
        self._editor = LogitsEditor(job.params) if job.params.edits_logits else None
        self._prefilled = 0
        self._generated = 0
        self._first_token_at: float | None = None

    def advance(self) -> None:
        """Do one unit of work: start, a prefill chunk, or one token."""
        job = self.job
        if job.cancelled:
            self._finish("cancelled")
        elif time.monotonic() > job.deadline:
            self._finish("timeout")
        elif self._generator is None:
            self._start()
        elif self._prefilled < len(job.prompt):
            chunk = job.prompt[self._prefilled:self._prefilled + self._chunk]
            self._generator.append_tokens(chunk)
            self._prefilled += len(chunk)
        else:
            self._decode_one()

    def fail(self, error: Exception) -> None:
        """End the job because the engine raised ``error``."""
        detail = "".join(traceback.format_exception(error)).rstrip()
        try:
            self._finish("error", error=detail)
        except Exception as release_error:  # releasing a broken generator failed too: still end the job
            self._generator = self._stream = None
            detail += "\nwhile releasing it: " + "".join(traceback.format_exception(release_error)).rstrip()
            self._publish(Finished("error", len(self.job.prompt), self._generated, None, 0.0, detail))

    def _start(self) -> None:
        self._generator = self._model.new_generator(self.job.params.search_options(len(self.job.prompt)))
        self._stream = self._model.create_stream()
        self._text = TextAssembler(self._stream, self.job.params.stop)

    def _decode_one(self) -> None:
        assert self._generator is not None and self._text is not None
        if self._editor is not None:
            self._generator.process_logits(self._editor)
        token = self._generator.generate_next_token()
        self._generated += 1
        if self._first_token_at is None:
            self._first_token_at = time.monotonic()
        if self._editor is not None:
            self._editor.observe(token)
        if token in self._model.info.eos_token_ids:
            self._finish("stop")
            return
        text, stopped = self._text.add(token)
        if text:
            self.job.emit(TextDelta(text))
        if stopped:
            self._finish("stop", flush=False)
        elif self._generated >= self.job.params.max_tokens:
            self._finish("length")
        elif self._generator.is_done():
            self._finish("stop")

    def _finish(self, reason: str, *, flush: bool = True, error: str | None = None) -> None:
        if flush and self._text is not None and reason in ("stop", "length"):
            tail = self._text.finish()
            if tail:
                self.job.emit(TextDelta(tail))
        self._release()
        now = time.monotonic()
        first = self._first_token_at
        self._publish(Finished(
            reason=reason,
            prompt_tokens=len(self.job.prompt),
            completion_tokens=self._generated,
            time_to_first_token=(first - self.job.submitted_at) if first is not None else None,
            decode_seconds=(now - first) if first is not None else 0.0,
            error=error,
        ))

    def _publish(self, finished: Finished) -> None:
        self.finished = True
        self.job.emit(finished)
        self._report(self.job, finished)

    def _release(self) -> None:
        for resource in (self._generator, self._stream):
            if resource is not None:
                resource.close()
        self._generator = self._stream = None


class Scheduler:
    """Owns the engine thread of this process and the generations it runs."""

    def __init__(self, model: Model, *, prefill_chunk: int, report: Report, idle_wait: float = 1.0) -> None:
        self._model = model
        self._prefill_chunk = prefill_chunk
        self._report = report
        self._relay: HubRelay | None = None
        self._idle_wait = idle_wait
        self._inbox: collections.deque[Job] = collections.deque()
        self._signal = Signal()
        self._thread_pid: int | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        """Whether this process's engine thread is up."""
        return self._thread_pid == os.getpid() and not self._stopping

    def start(self) -> None:
        """Start the engine thread in this process (after a fork, a new one); call from the hub's thread."""
        if self._thread_pid != os.getpid():
            self._thread_pid = os.getpid()
            self._stopping = False
            self._signal = Signal()
            self._relay = HubRelay(lambda item: self._report(*item))
            start_thread(self._run)

    def submit(self, job: Job) -> None:
        """Queue ``job``; it starts within one pass of the engine loop."""
        self.start()
        self._inbox.append(job)
        self._signal.set()

    def stop(self) -> None:
        """Ask the engine thread to cancel what it runs and exit."""
        self._stopping = True
        self._signal.set()

    def _running(self, job: Job) -> _Running:
        relay = self._relay
        return _Running(self._model, job, self._prefill_chunk, lambda job, finished: relay.send((job, finished)))

    def _run(self) -> None:
        active: list[_Running] = []
        while not self._stopping:
            while self._inbox:
                active.append(self._running(self._inbox.popleft()))
            if not active:
                self._signal.wait(self._idle_wait)
                continue
            for running in active:
                try:
                    running.advance()
                except Exception as exc:  # one broken generation must not stop the others
                    running.fail(exc)
            active = [running for running in active if not running.finished]
        while self._inbox:
            active.append(self._running(self._inbox.popleft()))
        for running in active:
            running.job.cancel()
            running.advance()
