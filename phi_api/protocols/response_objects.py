"""The Responses API's objects: the response object (:func:`response_object`) with its output items, its identity
(:class:`Identity`), a background response's queued, cancelled and failed forms, and a response's output as chat
messages (what a follow-up continues from). The renderer (:mod:`phi_api.protocols.responses`) and the background
runner build on them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phi_api.engine import Finished
from phi_api.protocols.contract import given
from phi_api.protocols.responses_request import ResponsesRequest, new_id
from phi_api.service.choices import Done
from phi_api.service.tools import ToolCall


@dataclass(frozen=True)
class Identity:
    """A response's id and creation time, and whether it runs in the background (made when it was queued)."""

    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    background: bool = False


def response_object(request: ResponsesRequest, identity: Identity, status: str, output: list[dict[str, Any]],
                    done: Done | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The response object (``status``: queued, in_progress, completed, incomplete or failed)."""
    body = request.body
    finished = done.finished if done else None
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    # Absent rather than null, as OpenAI's schema has them: usage until the end; user (deprecated) unless given.
    optional = {"usage": _usage(finished) if finished else None, "user": given(body, "user"),
                "conversation": {"id": request.conversation_id} if request.conversation_id else None}
    return {
        "id": identity.id, "object": "response", "created_at": identity.created_at, "status": status,
        "background": identity.background, "error": error, "incomplete_details": incomplete,
        "instructions": request.instructions, "max_output_tokens": given(body, "max_output_tokens"),
        "model": request.model, "output": output,
        "parallel_tool_calls": bool(given(body, "parallel_tool_calls", True)),
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "store": request.store,
        "temperature": given(body, "temperature"), "text": given(body, "text", {"format": {"type": "text"}}),
        "tool_choice": given(body, "tool_choice", "auto"),
        "tools": [_echoed(tool) for tool in given(body, "tools", [])], "top_p": given(body, "top_p"),
        "truncation": given(body, "truncation", "disabled"),
        "metadata": given(body, "metadata", {}),
        **{name: value for name, value in optional.items() if value is not None},
    }


QUEUED_EVENTS = ("response.created", "response.queued")  # told when a background response is queued


def queued_response(request: ResponsesRequest, identity: Identity) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A background response's object as queued, and the events a stream of it starts with."""
    response = response_object(request, identity, "queued", [])
    return response, [{"type": kind, "sequence_number": number, "response": response}
                      for number, kind in enumerate(QUEUED_EVENTS)]


def cancelled(response: dict[str, Any]) -> dict[str, Any]:
    """A background response's object once cancelled."""
    return {**response, "status": "cancelled"}


def failed(message: str, status: int = 500) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What a background response's object becomes when it fails with ``message`` (an error of HTTP ``status``, as
    one of OpenAI's response error codes)."""
    code = "rate_limit_exceeded" if status == 429 else "server_error" if status >= 500 else "invalid_prompt"
    return lambda response: {**response, "status": "failed", "error": {"code": code, "message": message}}


def status_of(done: Done | None) -> str:
    return "incomplete" if done is not None and done.reason == "length" else "completed"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """A reasoning model's thinking, as the Responses API gives it (its text, no summary)."""
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    """A function call (``incomplete`` when the token limit cut its arguments short)."""
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def _echoed(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the response object repeats it (its ``strict`` and ``parameters`` always present)."""
    return {"type": "function", "name": tool["name"], "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict")}


def _usage(finished: Finished) -> dict[str, Any]:
    return {"input_tokens": finished.prompt_tokens,
            "input_tokens_details": {"cached_tokens": finished.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": finished.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def output_messages(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A response's output as chat messages (what a follow-up's conversation continues from)."""
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                      "arguments": item["arguments"]}}
             for item in response["output"] if item["type"] == "function_call"]
    text = "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return [message]

