"""Typed requests: each protocol parses a body once, after its JSON Schema check, into one of these
(:mod:`phi_api.protocols`); the service reads attributes, never keys. :meth:`Sampling.to_params` is the one place a
request becomes engine parameters (as vLLM's ``ChatCompletionRequest.to_sampling_params``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from phi_api.engine import ModelInfo, SamplingParams, ThinkingBudget
from phi_api.errors import (
    ContextLengthExceededError,
    InvalidParameterError,
)
from phi_api.service.constraints import Grammar
from phi_api.service.tools import ToolPlan
from phi_api.settings import Settings


@dataclass(frozen=True)
class Sampling:
    """How to choose and when to stop, as a request gives it (``None``: not given; defaults come later)."""

    max_tokens: int | None = None
    limit_param: str = "max_tokens"  # the parameter max_tokens came as, for errors that name it
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: tuple[tuple[str, float], ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    draft_max: int | None = None  # llama.cpp's speculative.n_max; None: the server's SPECULATIVE_DRAFT_MAX
    draft_min: int = 0  # llama.cpp's speculative.n_min: shorter drafts are not checked
    prediction: str | None = None  # OpenAI's predicted output: the answer's text as the client expects it
    penalty_window: int | None = None  # Ollama's repeat_last_n: the repetition penalty's last tokens; None: all
    context_limit: int | None = None  # Ollama's num_ctx: the context this request may use, within the model's

    def to_params(self, *, prompt_tokens: int, prompt_param: str, model: ModelInfo, settings: Settings,
                  defaults: Mapping[str, float] | None = None, logprobs: int | None = None,
                  guidance: tuple[str, str] | None = None, prompt_logprobs: int | None = None,
                  thinking: ThinkingBudget | None = None, prediction: tuple[int, ...] = ()) -> list[SamplingParams]:
        """Engine parameters for a prompt of ``prompt_tokens`` tokens, one set per choice.

        A sampling field the request omits takes the model's default (``defaults``:
        :func:`phi_api.models.sampling.sampling_defaults`), else the server's.

        ``max_tokens``: when the request gives none, ``DEFAULT_MAX_TOKENS``
        clamped to the room the context leaves; when it gives one that does
        not fit, a 400 ``context_length_exceeded`` (as OpenAI does) rather
        than a silently shorter answer. A seeded request seeds its choices
        ``seed``, ``seed+1``, ... so they differ from each other but not from
        run to run. ``prediction``: the tokens of :attr:`prediction`, drafted from first.
        """
        max_tokens = self._max_tokens(prompt_tokens, prompt_param, model, settings.DEFAULT_MAX_TOKENS)
        if self.min_tokens > max_tokens:
            raise InvalidParameterError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({max_tokens}).",
                                        param="min_tokens")
        chosen = self._chosen({"temperature": settings.DEFAULT_TEMPERATURE, **(defaults or {})})
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(chosen("temperature", 1.0)),
            top_p=float(chosen("top_p", 1.0)),
            top_k=_top_k(int(chosen("top_k", 0)), model.vocab_size),
            seed=self.seed,
            stop=self.stop,
            presence_penalty=float(chosen("presence_penalty", 0.0)),
            frequency_penalty=float(chosen("frequency_penalty", 0.0)),
            repetition_penalty=float(chosen("repetition_penalty", 1.0)),
            logit_bias=_logit_bias(self.logit_bias, model.vocab_size),
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            min_p=float(chosen("min_p", 0.0)),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            guidance=guidance,
            draft_max=self.draft_max,
            draft_min=self.draft_min,
            prediction=prediction,
            penalty_window=self._penalty_window(defaults or {}),
            thinking=thinking,
        )
        if self.n == 1 or params.seed is None:
            return [params] * self.n
        return [dataclasses.replace(params, seed=params.seed + index) for index in range(self.n)]

    def _chosen(self, defaults: Mapping[str, float]) -> Callable[[str, float], float]:
        """The value of a sampling field: the request's, else ``defaults``', else the engine's neutral one."""
        def value(name: str, neutral: float) -> float:
            given = getattr(self, name)
            return given if given is not None else defaults.get(name, neutral)

        return value

    def _penalty_window(self, defaults: Mapping[str, float]) -> int | None:
        """The repetition penalty's window: the request's, else the model's ``repeat_last_n`` (-1: all tokens)."""
        if self.penalty_window is not None or "repeat_last_n" not in defaults:
            return self.penalty_window
        window = int(defaults["repeat_last_n"])
        return None if window == -1 else window

    def _max_tokens(self, prompt_tokens: int, prompt_param: str, model: ModelInfo, default: int) -> int:
        context = min(model.context_length, self.context_limit or model.context_length)
        named = "This model's maximum context length" if context == model.context_length else \
            "This request's context (num_ctx)"
        room = context - prompt_tokens
        if room < 1:
            raise ContextLengthExceededError(
                f"{named} is {context} tokens, and the {prompt_param} alone use {prompt_tokens} tokens.",
                param=prompt_param)
        if self.max_tokens is None:
            return min(default, room)
        if self.max_tokens > room:
            raise ContextLengthExceededError(
                f"{named} is {context} tokens. However, you requested "
                f"{prompt_tokens + self.max_tokens} tokens ({prompt_tokens} in the {prompt_param}, "
                f"{self.max_tokens} in the completion). Please reduce the length of the {prompt_param} or of "
                f"{self.limit_param}.", param=self.limit_param)
        return self.max_tokens


def _top_k(top_k: int, vocab_size: int) -> int:
    """vLLM's ``top_k`` (-1 or 0: off) as the engine's (0: off); k beyond the vocabulary keeps every token."""
    if top_k <= 0 or (vocab_size and top_k >= vocab_size):
        return 0
    return top_k


def _logit_bias(bias: tuple[tuple[str, float], ...], vocab_size: int) -> tuple[tuple[int, float], ...]:
    pairs = []
    for key, value in bias:
        token = int(key)
        if vocab_size and token >= vocab_size:
            raise InvalidParameterError(
                f"logit_bias has token id {token}, but the vocabulary has {vocab_size} tokens.", param="logit_bias")
        pairs.append((token, float(value)))
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class ChatRequest:
    """A chat: messages through the model's chat template, answered as content or tool calls."""

    model: str
    messages: tuple[dict[str, Any], ...]
    sampling: Sampling = Sampling()
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # alternatives per token to report; None: no log-probabilities
    output_schema: dict[str, Any] | None = None  # JSON the answer must be (a JSON Schema); None: free text
    output_param: str = "response_format"  # where the schema came from, for errors that name it
    output_grammar: Grammar | None = None  # any other grammar the answer must match (regex, choice, Lark, GBNF)
    tools: ToolPlan | None = None
    priority: int | None = None  # lower is sooner (vLLM's); None: not given
    cache_salt: str | None = None  # vLLM's: prompts are reused only among requests of the same salt (and key)
    template_variables: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs: the template reads them
    reasoning_effort: str | None = None  # how hard a reasoning model should think ("none": not at all)
    reasoning_param: str = "reasoning_effort"  # where that came from, for errors that name it
    thinking_budget: int | None = None  # the most tokens a reasoning model may think; None: no limit
    prompt_param: str = "messages"  # what the prompt came as, for errors that name it
    truncatable: int = 0  # the oldest messages after the leading system ones that may go when the context is full
    continue_final: bool = False  # the last message, the assistant's, is the answer's start (Anthropic's prefill)

    def truncated(self, count: int) -> ChatRequest:
        """This chat without the ``count`` oldest of its truncatable messages (the system messages first stay)."""
        start = next((index for index, message in enumerate(self.messages) if message.get("role") != "system"),
                     len(self.messages))
        count = min(count, self.truncatable)
        return dataclasses.replace(self, messages=self.messages[:start] + self.messages[start + count:],
                                   truncatable=self.truncatable - count)

@dataclass(frozen=True)
class CompletionRequest:
    """A (legacy) completion: the prompt as it is, text or token ids."""

    model: str
    prompt: Any  # a string, or token ids
    sampling: Sampling = Sampling()
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    echo: bool = False
    infill: Infill | None = None  # fill-in-the-middle: the prompt is the text before the hole; None: plain
    output_schema: dict[str, Any] | None = None  # JSON the answer must be (a JSON Schema); None: free text
    output_param: str = "structured_outputs"  # where the schema came from, for errors that name it
    output_grammar: Grammar | None = None  # any other grammar the answer must match (regex, choice, Lark, GBNF)
    priority: int | None = None  # lower is sooner (vLLM's); None: not given
    cache_salt: str | None = None  # vLLM's: prompts are reused only among requests of the same salt (and key)

    prompt_param: ClassVar[str] = "prompt"

GenerationRequest = ChatRequest | CompletionRequest


@dataclass(frozen=True)
class Infill:
    """What surrounds the hole a completion fills, besides the text before it (the prompt)."""

    suffix: str  # the text after the hole
    extra: str = ""  # context before everything (llama.cpp's input_extra: other files' text)
    tail: str = ""  # text the answer starts with, after the middle token (llama.cpp's prompt)


@dataclass(frozen=True)
class EmbedRequest:
    """Vectors of texts (or of token ids a client tokenized), as OpenAI's ``/v1/embeddings`` and Ollama's
    ``/api/embed`` ask them."""

    model: str
    texts: tuple[str, ...] = ()
    token_ids: tuple[tuple[int, ...], ...] = ()  # instead of texts: ids as given, no special tokens added
    input_param: str = "input"  # the field the inputs came in, for errors that name it
    dimensions: int | None = None  # a shorter vector (Matryoshka models: the first dimensions, made unit again)
    any_dimensions: bool = False  # Ollama's: any model's vector may be cut (and made unit again)
    truncate: int | None = None  # None: an input past the model's length is a 400; n: each is cut to n tokens
    priority: int | None = None  # lower is sooner (vLLM's); None: not given

    task: ClassVar[str] = "embed"

    @property
    def count(self) -> int:
        return len(self.token_ids) if self.token_ids else len(self.texts)


@dataclass(frozen=True)
class ScoreRequest:
    """Relevance scores of (query, document) pairs by a cross-encoder, as the rerank routes (Cohere's, Jina's,
    llama.cpp's, vLLM's) and vLLM's ``/v1/score`` ask them."""

    model: str
    pairs: tuple[tuple[str, str], ...]
    input_param: str = "documents"
    truncate: int | None = None  # as EmbedRequest's: each pair cut to n tokens (from the document's end)
    priority: int | None = None
    document_tokens: int | None = None  # each document cut to n tokens, its query kept (Cohere's max_tokens_per_doc)

    task: ClassVar[str] = "rerank"

    @property
    def count(self) -> int:
        return len(self.pairs)


EncodeRequest = EmbedRequest | ScoreRequest
