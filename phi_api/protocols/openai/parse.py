"""OpenAI's Chat Completions and Completions bodies, parsed (after their JSON Schema check) into the service's typed
requests."""

from __future__ import annotations

from typing import Any

from phi_api.engine.runtime.template import RESERVED
from phi_api.errors import InvalidParameterError
from phi_api.protocols.contract import given
from phi_api.service import features, prompts
from phi_api.service.constraints import constraint_fields
from phi_api.service.requests import ChatRequest, CompletionRequest, Infill, Sampling
from phi_api.service.tools import tool_plan


def sampling(body: dict[str, Any]) -> Sampling:
    """The sampling fields of a schema-valid OpenAI chat or completion body."""
    limit_param = "max_completion_tokens" if given(body, "max_completion_tokens") is not None else "max_tokens"
    stop = given(body, "stop", ())
    return Sampling(
        max_tokens=given(body, limit_param), limit_param=limit_param, temperature=given(body, "temperature"),
        top_p=given(body, "top_p"), top_k=given(body, "top_k"), min_p=given(body, "min_p"),
        seed=given(body, "seed"), stop=(stop,) if isinstance(stop, str) else tuple(stop),
        presence_penalty=given(body, "presence_penalty"), frequency_penalty=given(body, "frequency_penalty"),
        repetition_penalty=given(body, "repetition_penalty"),
        logit_bias=tuple(given(body, "logit_bias", {}).items()), min_tokens=given(body, "min_tokens", 0),
        ignore_eos=bool(given(body, "ignore_eos", False)), n=given(body, "n", 1),
        draft_max=given(body, "speculative", {}).get("n_max"), draft_min=_draft_min(body), prediction=_prediction(body),
    )


def _draft_min(body: dict[str, Any]) -> int:
    """llama.cpp's ``speculative.n_min`` (0: any draft is checked); above ``n_max`` no draft could ever be, a 400."""
    speculative = given(body, "speculative", {})
    least, most = speculative.get("n_min") or 0, speculative.get("n_max")
    if most is not None and least > most:
        raise InvalidParameterError(f"speculative.n_min ({least}) is above speculative.n_max ({most}).",
                                    param="speculative.n_min")
    return least


def _prediction(body: dict[str, Any]) -> str | None:
    """OpenAI's ``prediction`` (``{"type": "content", "content": text or text parts}``) as its text."""
    prediction = given(body, "prediction")
    if prediction is None:
        return None
    content = prediction["content"]
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def chat_request(body: dict[str, Any], known_fields: set[str]) -> ChatRequest:
    """A schema-valid ``/v1/chat/completions`` body (``known_fields``: its schema's, for the log)."""
    features.check_supported(body, features.CHAT_GATES, known_fields)
    prompts.check_call_pairs(body["messages"])
    return ChatRequest(
        model=body["model"], messages=tuple(body["messages"]), sampling=sampling(body),
        stream=bool(given(body, "stream", False)), include_usage=_include_usage(body),
        logprobs=_chat_logprobs(body), **constraint_fields(body),
        tools=tool_plan(given(body, "tools", []), given(body, "tool_choice"),
                        bool(given(body, "parallel_tool_calls", True))),
        priority=given(body, "priority"), cache_salt=given(body, "cache_salt"),
        reasoning_effort=given(body, "reasoning_effort"), template_variables=_template_variables(body),
        thinking_budget=given(body, "thinking_token_budget"),
    )


def completion_request(body: dict[str, Any], known_fields: set[str]) -> CompletionRequest:
    """A schema-valid ``/v1/completions`` body (``known_fields``: its schema's, for the log)."""
    features.check_supported(body, features.COMPLETION_GATES, known_fields)
    return CompletionRequest(model=body["model"], prompt=body["prompt"], sampling=sampling(body),
                             stream=bool(given(body, "stream", False)), include_usage=_include_usage(body),
                             logprobs=given(body, "logprobs"), echo=bool(given(body, "echo", False)),
                             infill=_infill(body), **constraint_fields(body), priority=given(body, "priority"),
                             cache_salt=given(body, "cache_salt"))


def _infill(body: dict[str, Any]) -> Infill | None:
    """OpenAI's ``suffix``: the text after the hole; an empty one is a plain completion (the hole is at the end)."""
    suffix = given(body, "suffix")
    if not suffix:
        return None
    if given(body, "echo", False):
        raise InvalidParameterError("echo cannot be combined with suffix.", param="echo")
    return Infill(suffix)


def _template_variables(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``chat_template_kwargs``: variables for the chat template, none of them one the conversation fills."""
    variables = given(body, "chat_template_kwargs", {})
    taken = sorted(set(variables) & RESERVED)
    if taken:
        raise InvalidParameterError(f"chat_template_kwargs may not set {taken[0]}: the conversation fills it.",
                                    param="chat_template_kwargs")
    return dict(variables)


def _include_usage(body: dict[str, Any]) -> bool:
    return bool(given(body, "stream_options", {}).get("include_usage"))


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    top = given(body, "top_logprobs")
    if not given(body, "logprobs", False):
        if top is not None:
            raise InvalidParameterError("top_logprobs needs logprobs set to true.", param="top_logprobs")
        return None
    return top or 0
