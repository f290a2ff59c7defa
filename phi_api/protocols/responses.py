"""OpenAI's Responses API over the one generation path: a typed request made into a chat, and a renderer.

:class:`ResponsesRequest` is a ``POST /v1/responses`` body, parsed: its input
items as chat messages (messages with text parts, ``function_call`` and
``function_call_output`` items), its function tools and ``tool_choice``, its
``text.format`` as the answer's schema, its sampling fields. A follow-up
names its predecessor (``previous_response_id``): its conversation, kept by
the :mod:`phi_api.storage.responses`, comes first; or a conversation of the
Conversations API (``conversation``, :mod:`phi_api.protocols.conversations`). :class:`ResponseRenderer` shapes the
run's events as the response object, or as the documented stream of events
with their ``sequence_number``.

What these models cannot mean is refused (hosted tools, images, files,
background runs, stored prompts), except for fields that
only tune a reasoning model or the service (``reasoning``, ``include`` of
reasoning content, ``service_tier``, ``prompt_cache_key``, ``user``,
``safety_identifier``): accepted and left without effect, as vLLM and
llama.cpp's server do.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from phi_api.engine import Finished
from phi_api.errors import APIError, InvalidParameterError, PreviousResponseNotFoundError, UnsupportedParameterError
from phi_api.protocols.contract import Framing, given
from phi_api.service.choices import Calls, ChoiceResult, Done, Text, Thinking
from phi_api.service.constraints import output_fields
from phi_api.service.generation import KEEPALIVE, Run, events
from phi_api.service.requests import ChatRequest, Sampling
from phi_api.service.tools import ToolCall, tool_plan
from phi_api.storage.responses import ResponseStore

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_IGNORED_INCLUDES = ("reasoning.encrypted_content",)  # there is no reasoning to include


def new_id(prefix: str) -> str:
    """An id in OpenAI's form: a prefix and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined (anything else gets 400)."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content or []:
        kind = part.get("type")
        if kind not in _TEXT_PARTS:
            raise UnsupportedParameterError(f"{where}: content parts of type '{kind}' are not supported; this is a "
                                            "text model.", param="input")
        texts.append(part.get("text") or part.get("refusal") or "")
    return "\n".join(texts)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The ``input`` (a string, or a list of items) as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input[{index}]"
        if kind == "message":
            messages.append({"role": item["role"], "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            previous = messages[-1] if messages else None
            if previous and previous["role"] == "assistant" and previous.get("tool_calls") and not previous["content"]:
                previous["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else _text(output, where)})
        elif kind == "reasoning":
            continue  # a reasoning model's earlier thinking: its template leaves it out of the conversation
        else:
            raise UnsupportedParameterError(f"{where}: items of type '{kind}' are not supported.", param="input")
    return messages


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """Function tools and ``tool_choice`` in the chat form; hosted tools get 400."""
    tools = []
    for index, tool in enumerate(given(body, "tools", [])):
        if tool.get("type") != "function":
            raise UnsupportedParameterError(f"tools[{index}]: hosted tools ('{tool.get('type')}') are not supported; "
                                            "only function tools are.", param="tools")
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        tools.append({"type": "function", "function": function})
    choice = given(body, "tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise UnsupportedParameterError(f"tool_choice of type '{choice.get('type')}' is not supported.",
                                            param="tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools, choice


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``."""
    format_ = (given(body, "text", {}) or {}).get("format")
    if not format_ or format_.get("type") == "text":
        return None
    if format_["type"] == "json_object":
        return {"type": "json_object"}
    spec = {key: format_[key] for key in ("name", "schema", "strict", "description") if key in format_}
    return {"type": "json_schema", "json_schema": spec}


def _refuse(body: dict[str, Any]) -> None:
    if given(body, "background", False):
        raise UnsupportedParameterError("background responses are not supported.", param="background")
    if given(body, "prompt") is not None:
        raise UnsupportedParameterError("prompt is not supported: send the input itself, previous_response_id or "
                                        "conversation.", param="prompt")
    if given(body, "conversation") is not None and given(body, "previous_response_id") is not None:
        raise InvalidParameterError("Mutually exclusive parameters: ensure you are only providing one of: "
                                    "'previous_response_id' or 'conversation'.", param="conversation")
    if given(body, "top_logprobs"):
        raise UnsupportedParameterError("top_logprobs is not supported by this server's Responses API; the chat "
                                        "completions API has logprobs.", param="top_logprobs")
    unknown = [value for value in given(body, "include", []) if value not in _IGNORED_INCLUDES]
    if unknown:
        raise UnsupportedParameterError(f"include: {unknown[0]} is not supported.", param="include")


@dataclass(frozen=True)
class ResponsesRequest:
    """A ``POST /v1/responses`` body, parsed (see the module's docstring)."""

    body: dict[str, Any]
    model: str
    input: tuple[dict[str, Any], ...]  # this request's own input, as chat messages
    instructions: str | None
    previous_response_id: str | None
    conversation_id: str | None  # the conversation it reads and extends (the Conversations API); None: none
    store: bool
    stream: bool
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    sampling: Sampling = field(default_factory=Sampling)

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> ResponsesRequest:
        """A schema-valid body."""
        _refuse(body)
        tools, choice = _tools(body)
        sampling = Sampling(max_tokens=given(body, "max_output_tokens"), limit_param="max_output_tokens",
                            temperature=given(body, "temperature"), top_p=given(body, "top_p"))
        return cls(body=body, model=body["model"], input=tuple(input_messages(body["input"])),
                   instructions=given(body, "instructions"), previous_response_id=given(body, "previous_response_id"),
                   conversation_id=_conversation_id(given(body, "conversation")),
                   store=bool(given(body, "store", True)), stream=bool(given(body, "stream", False)),
                   tools=tuple(tools), tool_choice=choice, response_format=_response_format(body), sampling=sampling)

    def conversation(self, history: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """What the model reads: the instructions (this request's only), the predecessor's conversation, the
        input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return system + list(history or []) + list(self.input)

    def chat(self, history: list[dict[str, Any]] | None) -> ChatRequest:
        """The chat the engine is asked for."""
        if not self.conversation(history):
            raise InvalidParameterError("input must not be empty.", param="input")
        body = {"messages": self.conversation(history), "tools": list(self.tools) or None,
                "tool_choice": self.tool_choice, "parallel_tool_calls": given(self.body, "parallel_tool_calls", True),
                "response_format": self.response_format}
        # With truncation "auto" the history's oldest messages may go when the context is full (OpenAI's rule)
        truncatable = len(history or []) if given(self.body, "truncation") == "auto" else 0
        return ChatRequest(model=self.model, messages=tuple(body["messages"]), sampling=self.sampling,
                           prompt_param="conversation" if self.conversation_id else "input", truncatable=truncatable,
                           stream=self.stream, **output_fields(body["response_format"]),
                           tools=tool_plan(body["tools"] or [], body["tool_choice"], bool(body["parallel_tool_calls"])),
                           cache_salt=given(self.body, "cache_salt"))


def _conversation_id(conversation: Any) -> str | None:
    """The id a request's ``conversation`` names (a string, or an object with its ``id``)."""
    if conversation is None or isinstance(conversation, str):
        return conversation
    return str(conversation["id"])


def history_of(request: ResponsesRequest, store: ResponseStore,
               scope: str | None = None) -> list[dict[str, Any]] | None:
    """The predecessor's conversation, or OpenAI's error when it is not (or no longer) stored, or not ``scope``'s:
    another key's response is answered exactly as one that never was."""
    if request.previous_response_id is None:
        return None
    messages = store.messages(request.previous_response_id, scope)
    if messages is None:
        raise PreviousResponseNotFoundError(f"Previous response with id '{request.previous_response_id}' not found.")
    return messages


class ResponseRenderer:
    """A run's answer as a Responses API response object, or as its stream of events; ``keep`` is given the
    finished response (to store it) before it is answered."""

    framing: ClassVar[Framing] = Framing.NAMED_SSE

    def __init__(self, request: ResponsesRequest, run: Run,
                 keep: Callable[[dict[str, Any]], None] = lambda response: None) -> None:
        self.request = request
        self.run = run
        self.keep = keep
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self._sequence = 0

    # The whole response ---------------------------------------------------------------------------------

    def response(self, status: str, output: list[dict[str, Any]], done: Done | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object (``status``: in_progress, completed, incomplete or failed)."""
        body = self.request.body
        finished = done.finished if done else None
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        # Absent rather than null, as OpenAI's schema has them: usage until the end; user (deprecated) unless given.
        optional = {"usage": _usage(finished) if finished else None, "user": given(body, "user"),
                    "conversation": {"id": self.request.conversation_id} if self.request.conversation_id else None}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": error, "incomplete_details": incomplete,
            "instructions": self.request.instructions, "max_output_tokens": given(body, "max_output_tokens"),
            "model": self.request.model, "output": output,
            "parallel_tool_calls": bool(given(body, "parallel_tool_calls", True)),
            "previous_response_id": self.request.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "service_tier": "default", "store": self.request.store,
            "temperature": given(body, "temperature"), "text": given(body, "text", {"format": {"type": "text"}}),
            "tool_choice": given(body, "tool_choice", "auto"),
            "tools": [_echoed(tool) for tool in given(body, "tools", [])], "top_p": given(body, "top_p"),
            "truncation": given(body, "truncation", "disabled"),
            "metadata": given(body, "metadata", {}),
            **{name: value for name, value in optional.items() if value is not None},
        }

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        """The finished response object of a collected run (kept first)."""
        [result] = results
        status = _status(result.ended)
        output = [_reasoning_item(new_id("rs"), result.reasoning)] if result.reasoning else []
        output += ([_call_item(new_id("fc"), call, status) for call in result.calls] if result.calls else
                   [_message_item(new_id("msg"), result.text, status)])
        response = self.response(status, output, result.ended)
        self.keep(response)
        return response

    # The stream ------------------------------------------------------------------------------------------

    def stream(self) -> Iterator[Any]:
        """The documented events, each ``(type, data)`` with its ``sequence_number`` (and ``KEEPALIVE``); a
        failure ends it with ``response.failed``. The finished response is kept before ``response.completed``."""
        yield self._event("response.created", response=self.response("in_progress", []))
        yield self._event("response.in_progress", response=self.response("in_progress", []))
        output: list[dict[str, Any]] = []
        message: dict[str, Any] | None = None
        thinking: dict[str, Any] | None = None  # the reasoning item, while the model thinks
        calls: tuple[ToolCall, ...] = ()  # told at the end: only then is it known whether they were cut short
        try:
            for event in events(self.run):
                if event is KEEPALIVE:
                    yield KEEPALIVE
                elif isinstance(event, Thinking):
                    if thinking is None:
                        thinking = _reasoning_item(new_id("rs"), "")
                        yield self._event("response.output_item.added", output_index=len(output),
                                          item={**thinking, "content": []})
                    thinking["content"][0]["text"] += event.text
                    yield self._event("response.reasoning_text.delta", item_id=thinking["id"],
                                      output_index=len(output), content_index=0, delta=event.text)
                    continue
                if thinking is not None:  # the thinking is over: its item is done
                    yield from self._close_reasoning(len(output), thinking)
                    output.append(thinking)
                    thinking = None
                if isinstance(event, Text) and event.text:
                    if message is None:
                        message = _message_item(new_id("msg"), "", "in_progress")
                        yield from self._open_message(len(output), message)
                    message["content"][0]["text"] += event.text
                    yield self._event("response.output_text.delta", item_id=message["id"], output_index=len(output),
                                      content_index=0, delta=event.text, logprobs=[])
                elif isinstance(event, Calls):
                    calls = event.calls
                elif isinstance(event, Done):
                    yield from self._finish(event, output, message, calls)
        except APIError as error:
            failure = {"code": "server_error", "message": error.message}
            yield self._event("response.failed", response=self.response("failed", output, error=failure))

    def _finish(self, done: Done, output: list[dict[str, Any]], message: dict[str, Any] | None,
                calls: tuple[ToolCall, ...]) -> Iterator[Any]:
        """The items still open, then ``response.completed`` (or ``.incomplete``)."""
        status = _status(done)
        if message is not None:
            message["status"] = status
            yield from self._close_message(len(output), message)
            output.append(message)
        for call in calls:
            item = _call_item(new_id("fc"), call, status)
            yield from self._call_events(len(output), item)
            output.append(item)
        response = self.response(status, output, done)
        self.keep(response)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield self._event(kind, response=response)

    def _open_message(self, index: int, message: dict[str, Any]) -> Iterator[Any]:
        yield self._event("response.output_item.added", output_index=index, item={**message, "content": []})
        yield self._event("response.content_part.added", item_id=message["id"], output_index=index, content_index=0,
                          part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _close_reasoning(self, index: int, item: dict[str, Any]) -> Iterator[Any]:
        yield self._event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                          text=item["content"][0]["text"])
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _close_message(self, index: int, message: dict[str, Any]) -> Iterator[Any]:
        part = message["content"][0]
        yield self._event("response.output_text.done", item_id=message["id"], output_index=index, content_index=0,
                          text=part["text"], logprobs=[])
        yield self._event("response.content_part.done", item_id=message["id"], output_index=index, content_index=0,
                          part=part)
        yield self._event("response.output_item.done", output_index=index, item=message)

    def _call_events(self, index: int, item: dict[str, Any]) -> Iterator[Any]:
        yield self._event("response.output_item.added", output_index=index,
                          item={**item, "arguments": "", "status": "in_progress"})
        yield self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                          delta=item["arguments"])
        yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                          name=item["name"], arguments=item["arguments"])
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _event(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return kind, event


def _status(done: Done | None) -> str:
    return "incomplete" if done is not None and done.reason == "length" else "completed"


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """A reasoning model's thinking, as the Responses API gives it (its text, no summary)."""
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
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

