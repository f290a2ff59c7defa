"""Valid requests for things this server cannot do get a clear 400, never a silent drop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phi_api.errors import InvalidParameterError, UnsupportedParameterError

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


def _present(value: Any) -> bool:
    return value is not None


CHAT_GATES = (
    Gate("functions", _truthy, "the deprecated functions parameter is not supported; use tools"),
    Gate("function_call", _present, "the deprecated function_call parameter is not supported; use tool_choice"),
    Gate("audio", _present, "audio output is not supported: this is a text model"),
    Gate("modalities", lambda value: bool(value) and "audio" in value, "only the text modality is supported"),
    Gate("web_search_options", _present, "web search is not supported"),
    Gate("store", lambda value: value is True, "storing completions is not supported"),
    Gate("service_tier", lambda value: value not in (None, "auto", "default"), "only the default service tier exists"),
)

COMPLETION_GATES = (
    Gate("best_of", _more_than_one, "best_of > 1 is not supported"),
)


def check_supported(body: dict[str, Any], gates: tuple[Gate, ...], known: set[str]) -> None:
    """Raise 400 for a parameter value we refuse; log (debug) fields outside the API."""
    for gate in gates:
        value = body.get(gate.param)
        if gate.refuses(value):
            raise UnsupportedParameterError(f"Unsupported value for '{gate.param}': {gate.reason}.", param=gate.param)
    if body.get("stream_options") is not None and not body.get("stream"):
        raise InvalidParameterError("stream_options is only allowed when stream is true.", param="stream_options")
    unknown = sorted(set(body) - known)
    if unknown:
        log.debug("Ignoring unknown request fields: %s", ", ".join(unknown))
