"""The two OpenAI endpoints' differences: how a prompt is built, what shapes the answer.

Both endpoints share one generation path (``service.completions``); each
format here says how its requests turn into a prompt and engine options, and
which choice builder shapes its answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from phi_api.engine import Engine
from phi_api.errors import InvalidParameterError, UnsupportedParameterError
from phi_api.service import features, prompts
from phi_api.service.choices import ChatChoice, CompletionChoice
from phi_api.service.grammar import json_schema_grammar
from phi_api.service.params import given
from phi_api.service.tools import ToolPlan, tool_plan


@dataclass(frozen=True)
class Request:
    """A request's prompt, and what it asks of the engine and of the answer's shape."""

    prompt: np.ndarray
    echo: str = ""
    logprobs: int | None = None  # alternatives per token; None: no log-probabilities
    guidance: tuple[str, str] | None = None
    tools: ToolPlan | None = None


@dataclass(frozen=True)
class Format:
    """How one endpoint builds its prompt and shapes its answers."""

    schema: str
    object: str
    chunk_object: str
    id_prefix: str
    prompt_param: str
    gates: tuple[features.Gate, ...]
    read: Callable[[Engine, dict[str, Any]], Request]
    new_choice: Callable[[int, Engine, Request], Any]


def _chat_request(engine: Engine, body: dict[str, Any]) -> Request:
    plan = tool_plan(body)
    return Request(
        prompt=prompts.chat_prompt(engine, body["messages"], plan),
        logprobs=_chat_logprobs(body),
        guidance=plan.grammar() if plan and plan.forced else _response_grammar(body),
        tools=plan,
    )


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    top = given(body, "top_logprobs")
    if not given(body, "logprobs", False):
        if top is not None:
            raise InvalidParameterError("top_logprobs needs logprobs set to true.", param="top_logprobs")
        return None
    return top or 0


def _response_grammar(body: dict[str, Any]) -> tuple[str, str] | None:
    """The grammar ``response_format`` asks for: any JSON object, or one matching a schema."""
    response_format = given(body, "response_format", {"type": "text"})
    kind = response_format["type"]
    if kind == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format")
    if kind == "json_schema":
        return json_schema_grammar(response_format["json_schema"].get("schema") or {"type": "object"},
                                   "response_format.json_schema.schema")
    return None


def _completion_request(engine: Engine, body: dict[str, Any]) -> Request:
    ids, text = prompts.completion_prompt(engine, body["prompt"])
    echo = text if given(body, "echo", False) else ""
    logprobs = given(body, "logprobs")
    if echo and logprobs is not None:
        raise UnsupportedParameterError("logprobs of the echoed prompt are not supported.", param="logprobs")
    return Request(prompt=ids, echo=echo, logprobs=logprobs)


CHAT = Format(
    schema="chat_completion",
    object="chat.completion",
    chunk_object="chat.completion.chunk",
    id_prefix="chatcmpl",
    prompt_param="messages",
    gates=features.CHAT_GATES,
    read=_chat_request,
    new_choice=lambda index, engine, request: ChatChoice(index, engine, request.tools, request.logprobs is not None),
)

COMPLETION = Format(
    schema="completion",
    object="text_completion",
    chunk_object="text_completion.chunk",
    id_prefix="cmpl",
    prompt_param="prompt",
    gates=features.COMPLETION_GATES,
    read=_completion_request,
    new_choice=lambda index, engine, request: CompletionChoice(index, engine, request.echo,
                                                               request.logprobs is not None),
)
