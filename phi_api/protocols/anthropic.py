"""Anthropic's Messages API over the one generation path: a typed request made into a chat, and a renderer.

:class:`MessagesRequest` is a ``POST /v1/messages`` body, parsed: ``system``
(a string or text blocks), messages whose content is a string or blocks
(``text``; an assistant's ``tool_use``; a user's ``tool_result``), client
tools with their ``input_schema``, and ``tool_choice`` (``auto``, ``any``,
``tool``, ``none``; the last three enforced by the grammar where they force
a call). :class:`MessageRenderer` shapes the run's events as Anthropic's
message object, or as its events (``message_start``, ``content_block_*``,
``message_delta``, ``message_stop``, and ``ping``).

Refused with 400: images and documents, server tools (web search, code
execution, ...), MCP servers, containers. Accepted and left without effect, as
vLLM and llama.cpp's server do: ``cache_control`` (every prompt is reused
automatically; ``usage.cache_read_input_tokens`` says how much), ``thinking``
(``budget_tokens`` bounds a reasoning model's thinking, which comes as a
``thinking`` block), ``output_config.effort``, ``citations``,
``service_tier`` and ``metadata``. ``output_config.format`` (structured
output) holds the answer to its JSON Schema through the grammar.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from phi_api.engine import Finished
from phi_api.errors import (
    APIError,
    InvalidParameterError,
    InvalidRequestError,
    UnsupportedParameterError,
    anthropic_body,
)
from phi_api.protocols.contract import Framing, given
from phi_api.service import prompts
from phi_api.service.choices import Calls, ChoiceResult, Done, Text, Thinking
from phi_api.service.generation import KEEPALIVE, Run, events
from phi_api.service.requests import ChatRequest, Sampling
from phi_api.service.tools import ToolCall, tool_plan

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_IGNORED_BLOCKS = ("thinking", "redacted_thinking")  # a thinking model's own notes, sent back: these models have none


def new_id(prefix: str) -> str:
    """An id in Anthropic's form: a prefix and 24 random characters."""
    return f"{prefix}_{secrets.token_hex(12)}"


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _text_of(blocks: list[dict[str, Any]], where: str) -> str:
    texts = []
    for block in blocks:
        if block.get("type") != "text":
            raise UnsupportedParameterError(f"{where}: content blocks of type '{block.get('type')}' are not "
                                            "supported here; this is a text model.", param="messages")
        texts.append(block.get("text", ""))
    return "\n".join(texts)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as chat messages: tool_use blocks as the assistant's tool calls, tool_result
    blocks as tool messages."""
    messages = []
    system = given(body, "system")
    if system:
        messages.append({"role": "system", "content": _text_of(_blocks(system), "system")})
    for index, message in enumerate(body["messages"]):
        where = f"messages[{index}]"
        _check_content(body["messages"], index)
        texts, calls, results = [], [], []
        for block in _blocks(message["content"]):
            kind = block.get("type")
            if kind == "text":
                texts.append(block.get("text", ""))
            elif kind == "tool_use" and message["role"] == "assistant":
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and message["role"] == "user":
                content = block.get("content", "")
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                "content": content if isinstance(content, str) else _text_of(content, where)})
            elif kind in _IGNORED_BLOCKS:
                continue
            else:
                raise UnsupportedParameterError(f"{where}: content blocks of type '{kind}' are not supported; this is "
                                                "a text model with client tools.", param="messages")
        messages.extend(results)  # a tool's result comes before what the user says next
        if texts or calls:
            entry: dict[str, Any] = {"role": message["role"], "content": "\n".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    return messages


def _check_content(messages: list[dict[str, Any]], index: int) -> None:
    """Anthropic's 400s for empty content: a message with none (only a final assistant message, the start of the
    answer, may be empty), and an empty text block."""
    content = messages[index]["content"]
    last_assistant = index == len(messages) - 1 and messages[index]["role"] == "assistant"
    if not content and not last_assistant:
        raise InvalidRequestError(f"messages.{index}: all messages must have non-empty content except for the "
                                  "optional final assistant message", param="messages")
    if isinstance(content, list) and any(block.get("type") == "text" and not block.get("text") for block in content):
        raise InvalidRequestError("messages: text content blocks must be non-empty", param="messages")
    final_text = content if isinstance(content, str) else (content[-1].get("text") if content else None)
    if last_assistant and isinstance(final_text, str) and final_text != final_text.rstrip():
        raise InvalidRequestError("messages: final assistant content cannot end with trailing whitespace",
                                  param="messages")


def _prefilled(messages: list[dict[str, Any]]) -> bool:
    """Whether the chat ends with the assistant's text: the answer's start, which the answer goes on from
    (Anthropic's prefill); the answer holds only what follows it."""
    return bool(messages) and messages[-1]["role"] == "assistant" and bool(messages[-1]["content"]) \
        and not messages[-1].get("tool_calls")


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, bool]:
    """Client tools and ``tool_choice`` in the chat form (tools, tool_choice, parallel calls allowed)."""
    tools = []
    for index, tool in enumerate(given(body, "tools", [])):
        if tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise UnsupportedParameterError(f"tools[{index}]: server tools ('{tool.get('type')}') are not supported; "
                                            "only client tools with an input_schema are.", param="tools")
        function = {"name": tool["name"], "description": tool.get("description", ""),
                    "parameters": tool["input_schema"]}
        tools.append({"type": "function", "function": function})
    choice = given(body, "tool_choice", {"type": "auto"})
    if choice["type"] in ("any", "tool") and not tools:  # a call forced with nothing to call
        raise InvalidParameterError(f"tool_choice of type '{choice['type']}' needs tools.", param="tool_choice")
    parallel = not choice.get("disable_parallel_tool_use", False)
    chat_choice: Any = {"auto": "auto", "any": "required", "none": "none"}.get(choice["type"])
    if choice["type"] == "tool":
        chat_choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools, (chat_choice if tools else None), parallel


def _refuse(body: dict[str, Any]) -> None:
    for name in ("mcp_servers", "container"):
        if given(body, name):
            raise UnsupportedParameterError(f"{name} is not supported.", param=name)


@dataclass(frozen=True)
class MessagesRequest:
    """A ``POST /v1/messages`` (or ``count_tokens``) body, parsed (see the module's docstring)."""

    model: str
    chat: ChatRequest
    stream: bool

    @classmethod
    def from_anthropic(cls, body: dict[str, Any]) -> MessagesRequest:
        """A schema-valid body."""
        _refuse(body)
        tools, choice, parallel = _tools(body)
        sampling = Sampling(max_tokens=given(body, "max_tokens"), temperature=given(body, "temperature", 1.0),
                            top_p=given(body, "top_p"), top_k=given(body, "top_k"),
                            stop=tuple(given(body, "stop_sequences", ())))
        output_format = given(given(body, "output_config", {}), "format")  # structured output
        messages = chat_messages(body)
        prompts.check_call_pairs(messages)  # (a tool_result is a tool message, before the user's text)
        chat = ChatRequest(model=body["model"], messages=tuple(messages), sampling=sampling,
                           stream=bool(given(body, "stream", False)), tools=tool_plan(tools, choice, parallel),
                           output_schema=output_format["schema"] if output_format else None,
                           output_param="output_config.format", cache_salt=given(body, "cache_salt"),
                           thinking_budget=_budget(given(body, "thinking", {})),
                           continue_final=_prefilled(messages))
        return cls(body["model"], chat, chat.stream)


class MessageRenderer:
    """A run's answer as Anthropic's message object, or as its stream of events."""

    framing: ClassVar[Framing] = Framing.NAMED_SSE

    def __init__(self, request: MessagesRequest, run: Run) -> None:
        self.request = request
        self.run = run
        self.id = new_id("msg")

    def message(self, content: list[dict[str, Any]], done: Done | None, output_tokens: int = 0) -> dict[str, Any]:
        """The message object (``done`` None: as it starts)."""
        finished = done.finished if done else None
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.request.model,
                "content": content, "stop_reason": _stop_reason(done), "stop_sequence": _stop_sequence(done),
                "usage": _usage(self.run.generation.prompt_tokens, finished, output_tokens)}

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        """The finished message of a collected run."""
        [result] = results
        # a reasoning model's thinking first, as a thinking block (no signature: nothing here checks one)
        content = [{"type": "thinking", "thinking": result.reasoning, "signature": ""}] if result.reasoning else []
        content += [{"type": "text", "text": result.text}] if result.text else []  # (text around calls too)
        content += [_tool_use(call) for call in result.calls]
        return self.message(content, result.ended)

    def stream(self) -> Iterator[Any]:
        """Anthropic's events, each ``(type, data)`` (and ``KEEPALIVE``, for which a ``ping`` is sent)."""
        yield "message_start", {"type": "message_start", "message": self.message([], None)}
        yield "ping", {"type": "ping"}
        blocks = _Blocks()
        for event in events(self.run):
            if event is KEEPALIVE:
                yield "ping", {"type": "ping"}
            elif isinstance(event, Thinking):
                yield from blocks.add("thinking", event.text)
            elif isinstance(event, Text) and event.text:
                yield from blocks.add("text", event.text)
            elif isinstance(event, Calls):
                yield from blocks.close()
                for call in event.calls:
                    yield from _tool_use_events(blocks.count, call)
                    blocks.count += 1
            elif isinstance(event, Done):
                yield from blocks.close()
                yield "message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": _stop_reason(event),
                                                  "stop_sequence": _stop_sequence(event)},
                                        # the whole count, as Anthropic's API now sends it: the cache's share
                                        # of the prompt is known only once the prompt is read
                                        "usage": _usage(self.run.generation.prompt_tokens, event.finished, 0)}
                yield "message_stop", {"type": "message_stop"}

    def failed(self, error: APIError) -> tuple[str, dict[str, Any]]:
        """The ``error`` event that ends a stream that failed."""
        return "error", anthropic_body(error)


class _Blocks:
    """The content blocks of a streamed message: the open one (thinking or text) and how many there are."""

    def __init__(self) -> None:
        self.count = 0
        self._open: tuple[int, str] | None = None  # the open block's index and type

    def add(self, kind: str, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """``text`` of a block of ``kind``: the open block goes on, or another one starts."""
        if self._open is None or self._open[1] != kind:
            yield from self.close()
            self._open, self.count = (self.count, kind), self.count + 1
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            yield "content_block_start", {"type": "content_block_start", "index": self._open[0],
                                          "content_block": start}
        yield "content_block_delta", {"type": "content_block_delta", "index": self._open[0],
                                      "delta": {"type": f"{kind}_delta", kind: text}}

    def close(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The open block's end, if one is open."""
        if self._open is not None:
            yield "content_block_stop", {"type": "content_block_stop", "index": self._open[0]}
            self._open = None


def _budget(thinking: dict[str, Any]) -> int | None:
    """``thinking``'s ``budget_tokens`` when it is enabled: a reasoning model's thinking ends there."""
    return thinking.get("budget_tokens") if thinking.get("type") == "enabled" else None


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": call.arguments_object}


def _tool_use_events(index: int, call: ToolCall) -> Iterator[tuple[str, dict[str, Any]]]:
    block = _tool_use(call)
    yield "content_block_start", {"type": "content_block_start", "index": index,
                                  "content_block": {**block, "input": {}}}
    yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                  "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}
    yield "content_block_stop", {"type": "content_block_stop", "index": index}


def _stop_reason(done: Done | None) -> str | None:
    if done is None:
        return None
    if done.reason == "stop" and done.finished.stop_string is not None:
        return "stop_sequence"
    return STOP_REASONS.get(done.reason, "end_turn")


def _stop_sequence(done: Done | None) -> str | None:
    return done.finished.stop_string if done is not None and done.reason == "stop" else None


def _usage(prompt_tokens: int, finished: Finished | None, output_tokens: int) -> dict[str, Any]:
    cached = finished.cached_tokens if finished else 0
    return {"input_tokens": prompt_tokens - cached, "output_tokens": finished.completion_tokens if finished
            else output_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
