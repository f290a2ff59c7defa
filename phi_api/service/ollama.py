"""Ollama's API (seed 004 and the official ``ollama`` client), served natively.

An Ollama request is translated into the equivalent OpenAI request and runs
through the same generation path (``service.completions``); only the answer
is shaped differently: newline-delimited JSON objects, the last with
``done: true`` and Ollama's counts and durations (nanoseconds).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, Iterator

from flask import Response, jsonify

from phi_api.engine import Finished, TextDelta
from phi_api.errors import ModelNotFoundError, UnsupportedParameterError
from phi_api.extensions import get_engine, get_settings, get_validator
from phi_api.service import completions
from phi_api.service.choices import ChatChoice
from phi_api.service.formats import CHAT, COMPLETION, Format
from phi_api.service.ndjson import ndjson_response
from phi_api.service.params import given
from phi_api.service.tools import new_call_id

# Ollama option -> OpenAI request field
_OPTIONS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop",
    "seed": "seed", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens",
}


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_model(name: str) -> str:
    """The served model's id, if ``name`` names it (``name:latest`` too); else 404."""
    served = get_settings().MODEL_ID
    if name not in (served, f"{served}:latest"):
        raise ModelNotFoundError(f"model '{name}' not found")
    return served


def _common(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI fields shared by generate and chat: model, stream, options and format."""
    translated: dict[str, Any] = {"model": check_model(body["model"]), "stream": given(body, "stream", True)}
    for option, value in (given(body, "options", {}) or {}).items():
        if value is None or (option == "num_predict" and value < 0):  # -1, -2: as long as the context allows
            continue
        translated[_OPTIONS[option]] = value
    if given(body, "think", False):
        raise UnsupportedParameterError("thinking is not supported by this model.", param="think")
    output_format = given(body, "format", "")
    if output_format == "json":
        translated["response_format"] = {"type": "json_object"}
    elif isinstance(output_format, dict):
        translated["response_format"] = {"type": "json_schema", "json_schema": {"name": "format",
                                                                                "schema": output_format}}
    return translated


def generate_request(body: dict[str, Any]) -> tuple[Format, dict[str, Any]]:
    """An Ollama generate request as an OpenAI one: a chat turn, or the raw prompt for ``raw``."""
    for unsupported in ("suffix", "images", "template", "context"):
        if given(body, unsupported):
            raise UnsupportedParameterError(f"'{unsupported}' is not supported.", param=unsupported)
    translated = _common(body)
    prompt = given(body, "prompt", "")
    if given(body, "raw", False):
        if "response_format" in translated:
            raise UnsupportedParameterError("format needs a templated prompt (raw is true).", param="format")
        return COMPLETION, {**translated, "prompt": prompt}
    system = given(body, "system")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return CHAT, {**translated, "messages": messages}


def chat_request(body: dict[str, Any]) -> tuple[Format, dict[str, Any]]:
    """An Ollama chat request as an OpenAI one."""
    messages = []
    for message in body["messages"]:
        if message.get("images"):
            raise UnsupportedParameterError("images are not supported: this is a text model.", param="messages")
        converted: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
        if message["role"] == "tool":
            converted["tool_call_id"] = message.get("tool_name") or "call_ollama"
        if message.get("tool_calls"):
            converted["tool_calls"] = [
                {"id": new_call_id(), "type": "function",
                 "function": {"name": call["function"]["name"],
                              "arguments": json.dumps(call["function"].get("arguments") or {})}}
                for call in message["tool_calls"]]
        messages.append(converted)
    translated = {**_common(body), "messages": messages}
    if given(body, "tools"):
        translated["tools"] = body["tools"]
    return CHAT, translated


def serve(kind: Format, translated: dict[str, Any], *, chat: bool) -> Response:
    """Run a translated request and answer the Ollama way (NDJSON lines when streaming, else one object)."""
    started = time.monotonic()
    get_validator().validate(kind.schema, translated)
    run = completions.start(kind, translated)
    builder = ChatChoice(0, get_engine(), run.request.tools, logprobs=False) if chat else None
    shape = _Shape(translated["model"], chat, started)
    if translated["stream"]:
        return ndjson_response(_stream(run, builder, shape), on_close=(run.close,))
    parts: list[str] = []
    finished = completions.collect(run, builder.add if builder else lambda delta: parts.append(delta.text))[0]
    if builder is None:
        return jsonify(shape.final(finished, "".join(parts)))
    result = builder.result(finished)
    return jsonify(shape.final(finished, result["message"]["content"] or "", result["message"].get("tool_calls")))


def _stream(run: completions.Run, builder: ChatChoice | None, shape: "_Shape") -> Iterator[dict[str, Any]]:
    for event in run.generation.events(idle_timeout=completions.KEEPALIVE_SECONDS):
        if event is None:
            yield shape.part("")  # an empty fragment: the client ignores it, a gone client is noticed
        elif isinstance(event, TextDelta):
            for text in _texts(builder.add(event)) if builder else [event.text]:
                yield shape.part(text)
        elif event.reason not in ("stop", "length"):
            yield {"error": completions.failure(event).message}
        else:
            calls = None
            if builder is not None:
                closing = builder.close(event)
                for text in _texts(closing):
                    yield shape.part(text)
                calls = builder.result(event)["message"].get("tool_calls")
            yield shape.final(event, "", calls)


def _texts(choices: list[dict[str, Any]]) -> list[str]:
    return [choice["delta"]["content"] for choice in choices if choice["delta"].get("content")]


class _Shape:
    """Ollama's response objects for one request."""

    def __init__(self, model: str, chat: bool, started: float) -> None:
        self._model = model
        self._chat = chat
        self._started = started

    def part(self, text: str) -> dict[str, Any]:
        """A streamed fragment."""
        body: dict[str, Any] = {"model": self._model, "created_at": created_at()}
        if self._chat:
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body["done"] = False
        return body

    def final(self, finished: Finished, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The last object: the rest of the text, the reason, the counts and the durations."""
        body = self.part(text)
        if calls and self._chat:
            body["message"]["tool_calls"] = [
                {"function": {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}}
                for call in calls]
        ttft = finished.time_to_first_token or 0.0
        body.update({
            "done": True,
            "done_reason": finished.reason,
            "total_duration": int((time.monotonic() - self._started) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": finished.prompt_tokens,
            "prompt_eval_duration": int(ttft * 1e9),
            "eval_count": finished.completion_tokens,
            "eval_duration": int(finished.decode_seconds * 1e9),
        })
        return body
