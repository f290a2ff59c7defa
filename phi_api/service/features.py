"""Valid requests for things this server cannot do get a clear 400, never a silent drop."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from phi_api.errors import InvalidParameterError, UnsupportedParameterError
from phi_api.service.params import given

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gate:
    """A parameter value this server refuses, and why."""

    param: str
    refuses: Callable[[Any], bool]
    reason: str


def _truthy(value: Any) -> bool:
    return bool(value)


def _more_than_one(value: Any) -> bool:
    return value is not None and value > 1


def _non_zero(value: Any) -> bool:
    return bool(value)


def _present(value: Any) -> bool:
    return value is not None


_COMMON = (
    Gate("n", _more_than_one, "n > 1 (several choices) is not supported"),
    Gate("min_p", _non_zero, "min_p is not supported"),
)

CHAT_GATES = _COMMON + (
    Gate("logprobs", _truthy, "logprobs are not supported"),
    Gate("top_logprobs", _non_zero, "top_logprobs is not supported"),
    Gate("tools", _truthy, "tools are not supported"),
    Gate("tool_choice", lambda value: value not in (None, "none", "auto"), "tool_choice is not supported"),
    Gate("functions", _truthy, "functions are not supported"),
    Gate("function_call", lambda value: value not in (None, "none", "auto"), "function_call is not supported"),
    Gate("parallel_tool_calls", lambda value: value is True, "parallel_tool_calls needs tools, which are not supported"),
    Gate("response_format", lambda value: bool(value) and value.get("type") != "text",
         "response_format other than text is not supported"),
    Gate("audio", _present, "audio output is not supported: this is a text model"),
    Gate("modalities", lambda value: bool(value) and "audio" in value, "only the text modality is supported"),
    Gate("prediction", _present, "predicted outputs are not supported"),
    Gate("reasoning_effort", _present, "reasoning_effort applies to reasoning models only"),
    Gate("web_search_options", _present, "web search is not supported"),
    Gate("store", lambda value: value is True, "storing completions is not supported"),
    Gate("service_tier", lambda value: value not in (None, "auto", "default"), "only the default service tier exists"),
)

COMPLETION_GATES = _COMMON + (
    Gate("logprobs", _non_zero, "logprobs are not supported"),
    Gate("suffix", _truthy, "suffix (insertion) is not supported"),
    Gate("best_of", _more_than_one, "best_of > 1 is not supported"),
)


def check_supported(body: dict[str, Any], gates: tuple[Gate, ...], known: set[str]) -> None:
    """Raise 400 for a parameter value we refuse; log (debug) fields outside the API."""
    for gate in gates:
        value = body.get(gate.param)
        if gate.refuses(value):
            raise UnsupportedParameterError(f"Unsupported value for '{gate.param}': {gate.reason}.", param=gate.param)
    if given(body, "stream_options") is not None and not given(body, "stream", False):
        raise InvalidParameterError("stream_options is only allowed when stream is true.", param="stream_options")
    unknown = sorted(set(body) - known)
    if unknown:
        log.debug("Ignoring unknown request fields: %s", ", ".join(unknown))
