"""The one generation path: a typed request in, the events of its choices out, for every protocol.

:func:`start` checks a request, builds its prompt and engine parameters,
takes a concurrency slot (or 429) and submits it; :func:`events` then yields
what its choices tell (:mod:`service.choices`), with :data:`KEEPALIVE` in
long silences; :func:`collect` waits for whole choices instead. The
protocols (OpenAI's JSON and SSE, Ollama's JSON and NDJSON) only render these.
The service knows no Flask: its dependencies come in as :class:`Services`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Final, TypeVar

import numpy as np

from phi_api.engine import Engine, Finished, Generation, ModelInfo, PromptLogprobs, SamplingParams, TextDelta
from phi_api.engine.threads.native import off_hub
from phi_api.errors import (
    APIError,
    ClientClosedRequestError,
    ContextLengthExceededError,
    GenerationTimeoutError,
    InternalError,
    InvalidParameterError,
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
)
from phi_api.limits.slots import Limiter, Slot
from phi_api.models.registry import Models
from phi_api.service import prompts, reasoning
from phi_api.service.choices import ChoiceAssembler, ChoiceResult, Event, Prompt
from phi_api.service.grammar import json_schema_grammar
from phi_api.service.reasoning import Reasoning
from phi_api.service.requests import ChatRequest, CompletionRequest, GenerationRequest, Sampling
from phi_api.service.tool_formats import FORMATS, ToolFormat, detect
from phi_api.service.tools import ToolPlan
from phi_api.settings import Settings

T = TypeVar("T")

KEEPALIVE_SECONDS = 1.0
MAX_CHOICES = 128  # choices of one request, every prompt's n together
# Log-probability entries one answer may hold (each scored token of each choice, and each of its alternatives): an
# answer is bounded before it is computed (lm-eval's scoring of a batch of prompts stays far below).
MAX_LOGPROB_ENTRIES = 1_000_000
DISCONNECT_POLL_SECONDS = 0.25
RUN_GRACE_SECONDS = 30.0  # past the engine's timeout, how long the request side still waits for the engine's end


class Keepalive(enum.Enum):
    """The type of :data:`KEEPALIVE` (an enum of one, so that ``event is KEEPALIVE`` narrows an event's type)."""

    KEEPALIVE = "keepalive"


KEEPALIVE: Final = Keepalive.KEEPALIVE  # yielded by events() after KEEPALIVE_SECONDS of silence: a moment to
# notice a gone client


@dataclass(frozen=True)
class Services:
    """What the service works with, handed to it by the web layer."""

    models: Models
    limiter: Limiter
    settings: Settings


@dataclass(frozen=True)
class Plan:
    """A request made concrete: its prompt's tokens, one parameter set per choice, and what shapes its answer."""

    prompts: list[np.ndarray]  # one, but for a completion request's list of prompts
    params: list[SamplingParams]  # each prompt's choices in turn: choice index = prompt index x per_prompt + its own
    tools: ToolPlan | None = None
    echo: tuple[str, ...] = ()  # each prompt's text, when the answer repeats it
    reasoning: Reasoning | None = None  # how a reasoning model's thinking is told apart from its answer

    @property
    def per_prompt(self) -> int:
        """Choices of each prompt (``n``)."""
        return len(self.params) // len(self.prompts)

    def echo_of(self, index: int) -> str:
        """The prompt text choice ``index`` repeats ("" without echo)."""
        return self.echo[index // self.per_prompt] if self.echo else ""


def _chat_plan(engine: Engine, settings: Settings, request: ChatRequest) -> Plan:
    """The chat's plan; one whose context is full drops its oldest truncatable messages, as few as make it fit
    (OpenAI's ``truncation: "auto"``), or is refused when even dropping them all does not."""
    prediction = _prediction_tokens(engine, request.sampling)  # once: truncation below does not change it
    try:
        return _chat_plan_whole(engine, settings, request, prediction)
    except ContextLengthExceededError:
        if not request.truncatable:
            raise
    low, high = 1, request.truncatable  # fits when dropping high (else raise); find the fewest dropped that fit
    plan = _chat_plan_whole(engine, settings, request.truncated(high), prediction)
    while low < high:
        middle = (low + high) // 2
        try:
            plan, high = _chat_plan_whole(engine, settings, request.truncated(middle), prediction), middle
        except ContextLengthExceededError:
            low = middle + 1
    return plan


def _chat_plan_whole(engine: Engine, settings: Settings, request: ChatRequest,
                     prediction: tuple[int, ...]) -> Plan:
    plan = request.tools and dataclasses.replace(request.tools, format=tool_format(engine))
    prompt = prompts.chat_prompt(engine, list(request.messages), plan,
                                 variables=reasoning.template_variables(engine, request),
                                 continue_final=request.continue_final)
    thinking = reasoning.reasoning_of(engine, request, prompt)
    # A forced call is the whole answer, so its grammar wins (as with OpenAI, where response_format shapes content).
    guidance = plan.grammar() if plan and plan.forced else _guidance(request)
    if plan and plan.forced:  # the call is the answer: thinking its template opened is closed first
        prompt, thinking = reasoning.closed_for_an_answer(engine, prompt, thinking)
    params = request.sampling.to_params(prompt_tokens=len(prompt), prompt_param=request.prompt_param,
                                        model=engine.info, settings=settings,
                                        defaults=dict(engine.config.sampling_defaults), logprobs=request.logprobs,
                                        guidance=guidance,
                                        thinking=reasoning.thinking_budget(engine, request, thinking),
                                        prediction=prediction)
    return Plan([prompt], params, tools=plan, reasoning=thinking)


def _prediction_tokens(engine: Engine, sampling: Sampling) -> tuple[int, ...]:
    """The tokens of the answer a request expects (its predicted output), drafted from before the prompt's; no more
    than the model's context holds (no answer is longer: the rest could never be drafted)."""
    if not sampling.prediction:
        return ()
    return tuple(int(token) for token in engine.encode(sampling.prediction)[:engine.info.context_length])


def tool_format(engine: Engine) -> ToolFormat:
    """How the engine's model writes tool calls: its TOOL_PARSER, or what its folder says (found once a model)."""
    return _tool_format(engine.config.tool_parser, engine.info)


@functools.lru_cache(maxsize=64)
def _tool_format(parser: str, info: ModelInfo) -> ToolFormat:
    return FORMATS[detect(info.added_tokens, info.chat_template) if parser == "auto" else parser]


def _guidance(request: GenerationRequest) -> tuple[str, str] | None:
    """The grammar a request's answer must match, as the engine takes it; None for free text."""
    if request.output_grammar is not None:
        return request.output_grammar.guidance()
    if request.output_schema is not None:
        return json_schema_grammar(request.output_schema, request.output_param)
    return None


def _completion_plan(engine: Engine, settings: Settings, request: CompletionRequest) -> Plan:
    parts = prompts.completion_prompts(engine, request.prompt, most=MAX_CHOICES // (request.sampling.n or 1),
                                       infill=request.infill)
    guidance, params = _guidance(request), []
    for prompt, _ in parts:
        # With echo, logprobs covers the prompt's tokens too (the first has none), as lm-eval's loglikelihood needs.
        params += request.sampling.to_params(prompt_tokens=len(prompt), prompt_param=request.prompt_param,
                                             model=engine.info, settings=settings,
                                             defaults=dict(engine.config.sampling_defaults),
                                             logprobs=request.logprobs,
                                             prompt_logprobs=request.logprobs if request.echo else None,
                                             guidance=guidance)
    echo = tuple(text for _, text in parts) if request.echo else ()
    return Plan([prompt for prompt, _ in parts], params, echo=echo)


_PLANNERS: dict[type, Callable[[Engine, Settings, Any], Plan]] = {ChatRequest: _chat_plan,
                                                                  CompletionRequest: _completion_plan}


@dataclass
class Run:
    """A started generation: the request, the engine of its model, its plan, the engine's handle, the slot.

    Each choice's end is told to ``observers`` once, however the run ends: as the request side reads it
    (:func:`events`), or, for the choices still running when the run is closed (a client that left, an error in
    another choice), when the engine reports them ended; ``on_done`` is told once every choice has ended.
    """

    request: GenerationRequest
    engine: Engine
    plan: Plan
    generation: Generation
    slot: Slot
    observers: list[Callable[[Finished], None]] = field(default_factory=list)  # told each choice's end, once
    on_close: list[Callable[[], None]] = field(default_factory=list)  # told when the run is closed
    on_done: list[Callable[[], None]] = field(default_factory=list)  # told once every choice has ended
    # Past this (the engine's own timeout, and a grace), the request side gives up waiting: no request is ever left
    # without an answer or an error, whatever happens in the engine.
    deadline: float = float("inf")
    _ended: set[int] = field(default_factory=set)

    def observe(self, finished: Finished) -> None:
        """Choice ``finished.index`` has ended: tell the observers (once a choice), and ``on_done`` after the last."""
        if finished.index in self._ended:
            return
        self._ended.add(finished.index)
        for observer in self.observers:
            observer(finished)
        if len(self._ended) == len(self.plan.params):
            for done in self.on_done:
                done()

    def close(self) -> None:
        """Stop whatever still runs and give the slot back (idempotent). ``on_close`` is told first, while the ends
        observed are those the request side read; the others are observed when the engine reports them."""
        self.slot.release()
        try:
            for closed in self.on_close:
                closed()
        finally:  # whatever a callback does, the engine lets the rows go
            self.generation.close(then=self.observe)

    def scored(self, build: Callable[[], T]) -> T:
        """What ``build`` makes of this run's log-probabilities, made on a pooled thread while the hub serves the
        worker's other streams: the lists of a long prompt or answer are seconds of pure Python (45,000 tokens:
        ~0.9 s)."""
        self.engine.token_bytes(0)  # the vocabulary's table loaded here first: the thread must not wait on the hub
        return off_hub(build)


@dataclass(frozen=True)
class Prepared:
    """A checked request made concrete for its model's engine, before it holds a slot or the engine's attention."""

    request: GenerationRequest
    engine: Engine
    plan: Plan

    @property
    def worst_tokens(self) -> int:
        """The most tokens it can use: each prompt once, and every choice's ``max_tokens`` and the prediction's
        tokens its checks may refuse (at most the prediction's length:
        :class:`phi_api.engine.sampling.draft.Drafter`)."""
        return sum(len(prompt) for prompt in self.plan.prompts) + \
            sum(one.max_tokens + len(one.prediction) for one in self.plan.params)


def check_open(draining: bool) -> None:
    """A 503 while this worker shuts down (a client retries, on another)."""
    if draining:
        raise ServiceUnavailableError("This server is shutting down; please retry.")


def prepare(services: Services, request: GenerationRequest) -> Prepared:
    """Check ``request`` and make its plan (its prompts' tokens, each choice's parameters) on its model's engine;
    refuse one this server could never hold (the engine's CapacityError)."""
    engine, settings = services.models.engine(request.model), services.settings
    check_open(engine.draining)
    plan = _PLANNERS[type(request)](engine, settings, request)
    # The engine's own exceptions (CapacityError here, ChatTemplateError or GuidanceError on the way) become API
    # errors in one place: phi_api.web.foreign.FOREIGN, applied by the web layer's error handlers.
    for index, prompt in enumerate(plan.prompts):
        engine.check_capacity(len(prompt), plan.params[index * plan.per_prompt].max_tokens, plan.per_prompt)
    _check_logprob_entries(plan)
    return Prepared(request, engine, plan)


def _check_logprob_entries(plan: Plan) -> None:
    """400 for an answer whose log-probabilities would exceed :data:`MAX_LOGPROB_ENTRIES` (choices x scored tokens
    x alternatives), before anything is computed."""
    entries, scored = 0, 0
    for index, one in enumerate(plan.params):
        prompt = len(plan.prompts[index // plan.per_prompt]) if one.prompt_logprobs is not None else 0
        if one.logprobs is not None or one.prompt_logprobs is not None:
            top = max(one.logprobs or 0, one.prompt_logprobs or 0)
            scored += prompt + one.max_tokens
            entries += (prompt + one.max_tokens) * (1 + top)
    if entries > MAX_LOGPROB_ENTRIES:
        raise InvalidParameterError(
            f"This request asks for {entries:,} log-probabilities ({len(plan.params)} choices, {scored:,} scored "
            f"tokens with echo and max_tokens, each with its alternatives), more than one answer may hold "
            f"({MAX_LOGPROB_ENTRIES:,}): lower n, the number of prompts, echo, max_tokens or logprobs "
            "(top_logprobs).", param="logprobs")


def launch(services: Services, prepared: Prepared, request_id: str = "-", cache_key: str = "",
           observers: tuple[Callable[[Finished], None], ...] = (),
           on_done: tuple[Callable[[], None], ...] = ()) -> Run:
    """Take a concurrency slot (or 429) and start generating at the request's priority (lower is sooner; none
    given: 0), reusing only prompts of its ``cache_key``; ``observers`` and ``on_done`` as :class:`Run`'s. Requests
    come here through the one gate, :func:`phi_api.service.admission.admit`."""
    request, engine, plan = prepared.request, prepared.engine, prepared.plan
    slot = services.limiter.try_acquire()
    if slot is None:
        raise RateLimitError("Too many concurrent requests. Please try again later.")
    try:
        handle = engine.submit_prompts(plan.prompts, plan.params, request_id=request_id,
                                       priority=request.priority or 0, cache_key=cache_key)
    except BaseException:  # RetiredError (unloaded a moment ago) becomes a 404 through phi_api.web.foreign.FOREIGN
        slot.release()
        raise
    return Run(request, engine, plan, handle, slot, list(observers), on_done=list(on_done),
               deadline=time.monotonic() + engine.config.timeout + RUN_GRACE_SECONDS)


def start(services: Services, request: GenerationRequest, request_id: str = "-", cache_key: str = "") -> Run:
    """:func:`prepare` then :func:`launch`, with nothing between them (tests, and callers without keys)."""
    return launch(services, prepare(services, request), request_id, cache_key)


def events(run: Run, keepalive: float | None = KEEPALIVE_SECONDS) -> Iterator[Event | Keepalive]:
    """What the run's choices tell, as it happens, with :data:`KEEPALIVE` after ``keepalive`` seconds of
    silence. A choice that ends without an answer raises its error (see :func:`failure`)."""
    assemblers = [ChoiceAssembler(index, run.plan.tools, run.plan.reasoning) for index in range(len(run.plan.params))]
    for event in run.generation.events(idle_timeout=keepalive):
        # The engine ends every choice by its timeout, so past the deadline only a client that reads slower than
        # the answer was made still holds the run (and its slot, and the answer's events): checked at every event,
        # not only at silences, which never come once the engine is done.
        if time.monotonic() > run.deadline:
            raise GenerationTimeoutError("The generation took longer than the server's GENERATION_TIMEOUT.")
        if event is None:
            yield KEEPALIVE
        elif isinstance(event, TextDelta):
            yield from assemblers[event.index].add(event)
        elif isinstance(event, PromptLogprobs):
            yield Prompt(event.index, event.records)
        else:
            run.observe(event)
            if not event.ok:
                raise failure(event)
            yield from assemblers[event.index].close(event)


def collect(run: Run, gone: Callable[[], bool] = lambda: False) -> list[ChoiceResult]:
    """Every choice, whole; closes the run. A client that goes meanwhile (``gone``) is noticed within
    ``DISCONNECT_POLL_SECONDS``: the generation is cancelled and its slot freed at once, rather than when an
    answer nobody reads is done."""
    results = [ChoiceResult(index) for index in range(len(run.plan.params))]
    next_poll = time.monotonic() + DISCONNECT_POLL_SECONDS
    try:
        for event in events(run, keepalive=DISCONNECT_POLL_SECONDS):
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + DISCONNECT_POLL_SECONDS
                if gone():
                    raise ClientClosedRequestError("The client closed the connection before the answer was ready.")
            if event is not KEEPALIVE:
                results[event.index].take(event)
    finally:
        run.close()
    return results


def failure(finished: Finished) -> APIError:
    """The error for a generation that ended without an answer."""
    if finished.reason == "timeout":
        return GenerationTimeoutError("The generation took longer than the server's GENERATION_TIMEOUT.")
    if finished.reason == "shutdown":  # its worker exits (past the drain's grace): another may take it again
        return ServiceUnavailableError("This server shut down before the answer was finished; please retry.")
    if finished.reason == "capacity":  # the budget shrank (another model loaded, a worker measured) while it waited
        return ContextLengthExceededError("This request needs more key/value memory than this server holds now "
                                          "(MEMORY_LIMIT_MB, KV_CACHE_MB): lower max_tokens or the prompt.",
                                          param="max_tokens")
    if finished.reason == "grammar":  # e.g. a character whose bytes the model's byte-level vocabulary lacks
        return InvalidRequestError("The requested output format cannot be written with this model's tokens: it "
                                   "needs text the model's vocabulary cannot spell.")
    return InternalError()


def cached_tokens(finished: list[Finished]) -> int:
    """Prompt tokens reused: each prompt's best choice (its choices share its prefill), summed over the prompts."""
    ordered = sorted(finished, key=lambda choice: choice.index)
    firsts = [index for index, choice in enumerate(ordered) if choice.first_of_prompt] + [len(ordered)]
    return sum(max(choice.cached_tokens for choice in ordered[start:end]) for start, end in pairwise(firsts))
