"""A ``POST /v1/responses`` body, parsed (:class:`ResponsesRequest`): its input items as chat messages (messages
with text parts, ``function_call`` and ``function_call_output`` items), its function tools and ``tool_choice``, its
``text.format`` as the answer's schema, its sampling fields, and the chat the engine is asked for. A follow-up names
its predecessor (``previous_response_id``): its conversation, kept by the :mod:`phi_api.storage.responses`, comes
first (:func:`history_of`); or a conversation of the Conversations API (``conversation``,
:mod:`phi_api.protocols.conversations`).

What these models cannot mean is refused (hosted tools, images, files, stored prompts), except for fields that only
tune a reasoning model or the service (``reasoning``, ``include`` of reasoning content, ``service_tier``,
``prompt_cache_key``, ``user``, ``safety_identifier``): accepted and left without effect, as vLLM and llama.cpp's
server do.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from phi_api.errors import InvalidParameterError, PreviousResponseNotFoundError, UnsupportedParameterError
from phi_api.protocols.contract import given
from phi_api.service import prompts
from phi_api.service.constraints import output_fields
from phi_api.service.requests import ChatRequest, Sampling
from phi_api.service.tools import tool_plan
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
    if given(body, "background", False) and not given(body, "store", True):
        raise InvalidParameterError("background responses must be stored: background requires store to be true.",
                                    param="background")
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
    background: bool = False
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
                   background=bool(given(body, "background", False)), tools=tuple(tools), tool_choice=choice,
                   response_format=_response_format(body), sampling=sampling)

    def conversation(self, history: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """What the model reads: the instructions (this request's only), the predecessor's conversation, the
        input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return system + list(history or []) + list(self.input)

    @property
    def truncates(self) -> bool:
        """Whether the history's oldest messages may go when it does not fit (``truncation: "auto"``)."""
        return given(self.body, "truncation") == "auto"

    def chat(self, history: list[dict[str, Any]] | None) -> ChatRequest:
        """The chat the engine is asked for."""
        if not self.conversation(history):
            raise InvalidParameterError("input must not be empty.", param="input")
        # OpenAI's rule, as for chat: every function_call answered by its output, every output answering a call
        prompts.check_call_pairs(self.conversation(history), param="input")
        body = {"messages": self.conversation(history), "tools": list(self.tools) or None,
                "tool_choice": self.tool_choice, "parallel_tool_calls": given(self.body, "parallel_tool_calls", True),
                "response_format": self.response_format}
        # With truncation "auto" the history's oldest messages may go when the context is full (OpenAI's rule)
        truncatable = len(history or []) if self.truncates else 0
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
