"""The one encoding path, beside the generation path and behind the same gate: an embedding or scoring request in,
its vectors or scores out. :func:`prepare` finds the model's encoder (400 when the model does another task),
tokenizes the inputs off the hub and holds them to the model's length (a 400, or cut when the request says so);
:func:`launch` takes a slot and submits them to the worker's encoder thread, where they are batched with other
requests'; :func:`collect` waits for them, noticing a client that leaves. Usage is one
:class:`phi_api.engine.Finished` of the tokens encoded, so the gate's observers count it as a generation's."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from phi_api.engine import Encoded, EncoderEngine, Finished, Tokens
from phi_api.engine.encoder.pooling import shortened
from phi_api.engine.encoder.tokens import truncated
from phi_api.engine.threads.native import spawn
from phi_api.errors import (
    ClientClosedRequestError,
    ContextLengthExceededError,
    GenerationTimeoutError,
    InternalError,
    InvalidParameterError,
    RateLimitError,
    UnsupportedParameterError,
)
from phi_api.limits.slots import Slot
from phi_api.service.generation import DISCONNECT_POLL_SECONDS, RUN_GRACE_SECONDS, Services, check_open
from phi_api.service.requests import EmbedRequest, EncodeRequest, ScoreRequest

MAX_INPUTS = 2048  # inputs of one request (OpenAI's limit for /v1/embeddings)


@dataclass(frozen=True)
class EncodePrepared:
    """A checked request: its model's encoder and its inputs' tokens, before it holds a slot."""

    request: EncodeRequest
    engine: EncoderEngine
    inputs: list[Tokens]

    @property
    def worst_tokens(self) -> int:
        """Its tokens: an encoder generates none."""
        return sum(len(one) for one in self.inputs)


@dataclass
class EncodeRun:
    """A submitted request: what it asked, its encoder, its inputs on their way, its slot. Its end is told to
    ``observers`` once, however it ends (a client that left: when the encoder thread is done with what it had)."""

    request: EncodeRequest
    engine: EncoderEngine
    inputs: list[Tokens]
    encoded: Encoded
    slot: Slot
    observers: list[Callable[[Finished], None]] = field(default_factory=list)
    on_close: list[Callable[[], None]] = field(default_factory=list)
    on_done: list[Callable[[], None]] = field(default_factory=list)
    deadline: float = float("inf")
    _observed: bool = False

    def observe(self) -> None:
        """Tell the observers the tokens encoded for it (once), then ``on_done``."""
        if self._observed:
            return
        self._observed = True
        job = self.encoded.job
        finished = Finished(reason=job.reason or "cancelled", prompt_tokens=job.done_tokens, completion_tokens=0,
                            time_to_first_token=None, decode_seconds=0.0)
        for observer in self.observers:
            observer(finished)
        for done in self.on_done:
            done()

    def close(self) -> None:
        """Give the slot back and stop what still waits (idempotent); its end is observed once the encoder thread
        is done with it."""
        self.slot.release()
        for closed in self.on_close:
            closed()
        self.on_close.clear()
        if self.encoded.job.ended:
            self.encoded.close()
            self.observe()
        elif not self._observed:
            self.encoded.job.cancel()
            spawn(self._observe_at_end)

    def _observe_at_end(self) -> None:
        while not self.encoded.wait(DISCONNECT_POLL_SECONDS) and time.monotonic() < self.deadline:
            pass
        self.encoded.close()
        self.observe()


def prepare(services: Services, request: EncodeRequest) -> EncodePrepared:
    """Check ``request`` against its model and tokenize its inputs."""
    engine = services.models.encoder(request.model, request.task)
    check_open(engine.draining)
    if request.count > MAX_INPUTS:
        raise InvalidParameterError(f"At most {MAX_INPUTS} inputs a request ({request.count} given).",
                                    param=request.input_param)
    if isinstance(request, EmbedRequest):
        _check_dimensions(engine, request)
        inputs = _embed_inputs(engine, request)
    else:
        inputs = engine.pairs(list(request.pairs), request.document_tokens)
    return EncodePrepared(request, engine, _within_length(engine, request, inputs))


def _embed_inputs(engine: EncoderEngine, request: EmbedRequest) -> list[Tokens]:
    if not request.token_ids:
        return engine.texts(list(request.texts))
    vocabulary = engine.vocab_size
    for ids in request.token_ids:
        if ids and not (0 <= min(ids) and max(ids) < vocabulary):  # min and max run in C: a 16 MB body is quick
            raise InvalidParameterError(f"Token ids must be from 0 to {vocabulary - 1} for this model.",
                                        param=request.input_param)
    return [engine.token_ids(list(ids)) for ids in request.token_ids]


def _check_dimensions(engine: EncoderEngine, request: EmbedRequest) -> None:
    dimensions, info = request.dimensions, engine.info
    if dimensions is None or dimensions == info.dimensions:
        return
    if not 0 < dimensions < info.dimensions:
        raise InvalidParameterError(f"dimensions must be from 1 to {info.dimensions} for this model.",
                                    param="dimensions")
    if not (request.any_dimensions or info.matryoshka):
        raise UnsupportedParameterError(
            f"The model '{request.model}' does not support shorter vectors (it is not a Matryoshka model): its "
            f"vectors have {info.dimensions} dimensions; leave dimensions out.", param="dimensions")


def _within_length(engine: EncoderEngine, request: EncodeRequest, inputs: list[Tokens]) -> list[Tokens]:
    """The inputs held to the model's length: cut when the request says so, else a 400 for the first too long."""
    longest = engine.info.context_length
    if request.truncate is not None:
        most = longest if request.truncate < 0 else min(request.truncate, longest)
        return [truncated(one, max(most, 1)) for one in inputs]
    for index, one in enumerate(inputs):
        if len(one) > longest:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {longest} tokens; input {index} has {len(one)} tokens. "
                "Shorten it, or ask for truncation.", param=request.input_param)
    return inputs


def launch(services: Services, prepared: EncodePrepared, request_id: str = "-",
           observers: tuple[Callable[[Finished], None], ...] = (),
           on_done: tuple[Callable[[], None], ...] = ()) -> EncodeRun:
    """Take a concurrency slot (or 429) and submit the inputs at the request's priority."""
    request, engine = prepared.request, prepared.engine
    slot = services.limiter.try_acquire()
    if slot is None:
        raise RateLimitError("Too many concurrent requests. Please try again later.")
    try:
        encoded = engine.submit(prepared.inputs, priority=request.priority or 0, request_id=request_id)
    except BaseException:
        slot.release()
        raise
    return EncodeRun(request, engine, prepared.inputs, encoded, slot, list(observers), on_done=list(on_done),
                     deadline=time.monotonic() + engine.config.timeout + RUN_GRACE_SECONDS)


def collect(run: EncodeRun, gone: Callable[[], bool] = lambda: False) -> np.ndarray:
    """The request's vectors (``[inputs, dims]``, cut to its ``dimensions``) or scores (``[inputs]``); closes the
    run."""
    try:
        while not run.encoded.wait(DISCONNECT_POLL_SECONDS):
            if gone():
                raise ClientClosedRequestError("The client closed the connection before the answer was ready.")
            if time.monotonic() > run.deadline:
                raise GenerationTimeoutError("The request took longer than the server's GENERATION_TIMEOUT.")
        job = run.encoded.job
        if job.reason == "timeout":
            raise GenerationTimeoutError("The request took longer than the server's GENERATION_TIMEOUT.")
        if job.reason != "stop" or job.results is None:
            raise InternalError()
        return _shaped(run, job.results)
    finally:
        run.close()


def _shaped(run: EncodeRun, results: np.ndarray) -> np.ndarray:
    request, info = run.request, run.engine.info
    if isinstance(request, ScoreRequest) or request.dimensions in (None, info.dimensions):
        return results
    assert request.dimensions is not None
    return shortened(results, request.dimensions, renormalize=info.normalize or request.any_dimensions)
