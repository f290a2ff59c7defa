"""From an OpenAI request body to engine parameters: the one place that does it."""

from __future__ import annotations

import dataclasses
from typing import Any

from phi_api.config import Settings
from phi_api.engine import ModelInfo, SamplingParams
from phi_api.errors import ContextLengthExceededError, InvalidParameterError


def given(body: dict[str, Any], key: str, default: Any = None) -> Any:
    """``body[key]``, where an explicit ``null`` counts as not given (as in OpenAI's API)."""
    value = body.get(key)
    return default if value is None else value


def sampling_params(body: dict[str, Any], *, prompt_tokens: int, prompt_param: str,
                    model: ModelInfo, settings: Settings, logprobs: int | None = None,
                    guidance: tuple[str, str] | None = None) -> SamplingParams:
    """Engine parameters for a validated chat or completion request whose prompt has ``prompt_tokens`` tokens.

    ``max_tokens``: when the request gives none, ``DEFAULT_MAX_TOKENS`` clamped
    to the room the context leaves; when it gives one that does not fit, a 400
    ``context_length_exceeded`` (as OpenAI does) rather than a silently shorter answer.
    """
    room = model.context_length - prompt_tokens
    if room < 1:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {model.context_length} tokens, "
            f"and the {prompt_param} alone use {prompt_tokens} tokens.",
            param=prompt_param,
        )
    limit_param = "max_completion_tokens" if given(body, "max_completion_tokens") is not None else "max_tokens"
    requested = given(body, limit_param)
    if requested is None:
        max_tokens = min(settings.DEFAULT_MAX_TOKENS, room)
    elif requested > room:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {model.context_length} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the {prompt_param}, {requested} in the "
            f"completion). Please reduce the length of the {prompt_param} or of {limit_param}.",
            param=limit_param,
        )
    else:
        max_tokens = requested
    min_tokens = given(body, "min_tokens", 0)
    if min_tokens > max_tokens:
        raise InvalidParameterError(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens}).",
                                    param="min_tokens")
    stop = given(body, "stop", ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(given(body, "temperature", settings.DEFAULT_TEMPERATURE)),
        top_p=float(given(body, "top_p", 1.0)),
        top_k=_top_k(given(body, "top_k", 0), model.vocab_size),
        seed=given(body, "seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        presence_penalty=float(given(body, "presence_penalty", 0.0)),
        frequency_penalty=float(given(body, "frequency_penalty", 0.0)),
        repetition_penalty=float(given(body, "repetition_penalty", 1.0)),
        logit_bias=_logit_bias(given(body, "logit_bias", {}), model.vocab_size),
        min_tokens=min_tokens,
        ignore_eos=bool(given(body, "ignore_eos", False)),
        min_p=float(given(body, "min_p", 0.0)),
        logprobs=logprobs,
        guidance=guidance,
    )


def _top_k(top_k: int, vocab_size: int) -> int:
    """vLLM's ``top_k`` (-1 or 0: off) as the engine's (0: off); k beyond the vocabulary keeps every token."""
    if top_k <= 0 or (vocab_size and top_k >= vocab_size):
        return 0  # ONNX Runtime GenAI refuses a top_k over its vocabulary size
    return top_k


def choices(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One parameter set per choice; a seeded request seeds its choices seed, seed+1, ... so they differ
    from each other but not from run to run."""
    if n == 1 or params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=params.seed + index) for index in range(n)]


def _logit_bias(bias: dict[str, float], vocab_size: int) -> tuple[tuple[int, float], ...]:
    pairs = []
    for key, value in bias.items():
        token = int(key)
        if vocab_size and token >= vocab_size:
            raise InvalidParameterError(
                f"logit_bias has token id {token}, but the vocabulary has {vocab_size} tokens.", param="logit_bias"
            )
        pairs.append((token, float(value)))
    return tuple(sorted(pairs))
