"""Ollama's API (seed 004 and the official ``ollama`` client), served natively.

An Ollama body is parsed straight into the typed requests every protocol
runs through (:mod:`service.requests`), and the run's events are rendered in
Ollama's shapes: newline-delimited JSON objects, the last with ``done: true``
and Ollama's counts and durations (nanoseconds), or that last object alone.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from phi_api.errors import APIError, InvalidParameterError, UnsupportedParameterError, ollama_body
from phi_api.protocols.contract import Framing, given
from phi_api.protocols.openai.shapes import answer_entries
from phi_api.service.choices import ChoiceResult, Done, Text, Thinking
from phi_api.service.generation import KEEPALIVE, Run, events
from phi_api.service.requests import ChatRequest, CompletionRequest, Infill, Sampling
from phi_api.service.tools import ToolCall, new_call_id

log = logging.getLogger(__name__)


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def model_id(name: str) -> str:
    """The model id an Ollama name means (``name:latest`` is ``name``)."""
    return name.removesuffix(":latest")


def only_loads(body: dict[str, Any], chat: bool) -> bool:
    """Whether the body asks for nothing but the model (loaded, or unloaded with ``keep_alive`` 0), as Ollama reads
    a chat without messages and a generate without a prompt: ``ollama run`` and UIs send it to preload a model."""
    if chat:
        return not given(body, "messages")
    return not given(body, "prompt") and not given(body, "suffix")


def load_answer(model: str, chat: bool, unloaded: bool) -> dict[str, Any]:
    """Ollama's answer to a request that only loads (or unloads) the model."""
    said = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": model, "created_at": created_at(), **said, "done": True,
            "done_reason": "unload" if unloaded else "load"}


def keeps_alive(body: dict[str, Any]) -> bool:
    """False when ``keep_alive`` asks for the model to be unloaded after this request (``0``, as ``ollama
    stop`` sends)."""
    return given(body, "keep_alive", -1) not in (0, "0", "0s", "0m", "0h")


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
FOREVER_SECONDS = 10 * 365 * 86400.0


def keep_alive_seconds(body: dict[str, Any]) -> float | None:
    """How long Ollama's ``keep_alive`` asks to keep the model after this request, in seconds (a number of
    seconds, or a duration such as ``"5m"``; negative: for ever, as is anything longer, which no clock can
    hold); None when not given or not understood."""
    value = given(body, "keep_alive")
    if isinstance(value, bool) or value is None:
        return None
    found = _DURATION.match(str(value))
    if found is None:
        return None
    seconds = float(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    return FOREVER_SECONDS if seconds < 0 else min(seconds, FOREVER_SECONDS)


# Ollama's documented options that have a meaning here (the rest are accepted and logged: see _sampling).
APPLIED_OPTIONS = frozenset({"temperature", "top_p", "top_k", "min_p", "num_predict", "stop", "seed", "repeat_penalty",
                             "repeat_last_n", "presence_penalty", "frequency_penalty", "num_ctx"})
OLLAMA_PENALTY_WINDOW = 64  # Ollama's default repeat_last_n
# The ignored options' log line names this many, each cut to this length: a body's keys are the client's, and a
# megabyte of them must not become a megabyte of log a request.
LOGGED_NAMES, LOGGED_NAME_CHARS = 10, 64


def _sampling(body: dict[str, Any]) -> Sampling:
    """Ollama's ``options`` (already checked against their schema): those with a meaning here applied, the others
    (``mirostat``, ``num_thread``, ``typical_p``, ...) accepted, as Ollama does, and named in one log line."""
    options = given(body, "options", {}) or {}

    def option(name: str) -> Any:
        return options.get(name)

    ignored = sorted(name for name, value in options.items() if name not in APPLIED_OPTIONS and value is not None)
    if ignored:
        log.info("Ollama options without effect here, ignored: %s", _listed(ignored))
    window = option("repeat_last_n")
    stop = option("stop") or ()
    num_predict = option("num_predict")
    return Sampling(
        penalty_window=OLLAMA_PENALTY_WINDOW if window is None else (None if window == -1 else window),
        context_limit=option("num_ctx"),
        max_tokens=num_predict if num_predict is not None and num_predict >= 0 else None,  # -1, -2: no limit
        limit_param="num_predict", temperature=option("temperature"), top_p=option("top_p"), top_k=option("top_k"),
        min_p=option("min_p"), seed=option("seed"), stop=(stop,) if isinstance(stop, str) else tuple(stop),
        presence_penalty=option("presence_penalty"), frequency_penalty=option("frequency_penalty"),
        repetition_penalty=option("repeat_penalty"),
    )


def _listed(names: list[str]) -> str:
    """``names`` for a log line, bounded: the first ``LOGGED_NAMES``, each cut to ``LOGGED_NAME_CHARS``, and how
    many more there are."""
    shown = [name if len(name) <= LOGGED_NAME_CHARS else name[:LOGGED_NAME_CHARS] + "..."
             for name in names[:LOGGED_NAMES]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def _output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """Ollama's ``format``: ``"json"`` (any JSON object) or a JSON Schema; None: free text."""
    output_format = given(body, "format", "")
    if output_format == "json":
        return {"type": "object"}
    return output_format if isinstance(output_format, dict) else None


def _common(body: dict[str, Any]) -> dict[str, Any]:
    return {"model": model_id(body["model"]), "sampling": _sampling(body), "stream": bool(given(body, "stream", True)),
            "cache_salt": given(body, "cache_salt"), "logprobs": _logprobs(body)}


def _logprobs(body: dict[str, Any]) -> int | None:
    """Ollama's ``logprobs`` and ``top_logprobs``: the alternatives each token's entry lists, or None (no entries)."""
    top = given(body, "top_logprobs")
    if not given(body, "logprobs", False):
        if top:
            raise InvalidParameterError("top_logprobs needs logprobs set to true.", param="top_logprobs")
        return None
    return top or 0


def _thinking(body: dict[str, Any]) -> dict[str, Any]:
    """Ollama's ``think`` (true, false, or an effort: ``low``, ``medium``, ``high``) as a chat's reasoning effort."""
    think = given(body, "think")
    if think is None:
        return {}
    effort = think if isinstance(think, str) else ("medium" if think else "none")
    return {"reasoning_effort": effort, "reasoning_param": "think"}


def generate_request(body: dict[str, Any]) -> ChatRequest | CompletionRequest:
    """An Ollama generate body: a chat turn, the raw prompt for ``raw``, or the code around a hole for ``suffix``
    (fill-in-the-middle, with the model's own tokens for it)."""
    for unsupported in ("images", "template", "context"):
        if given(body, unsupported):
            raise UnsupportedParameterError(f"'{unsupported}' is not supported.", param=unsupported)
    common = _common(body)
    prompt = given(body, "prompt", "")
    infill = Infill(given(body, "suffix")) if given(body, "suffix") else None
    if given(body, "raw", False) or infill is not None:
        if _output_schema(body) is not None:
            raise UnsupportedParameterError("format needs a templated prompt (not raw, no suffix).", param="format")
        return CompletionRequest(prompt=prompt, infill=infill, **common)
    system = given(body, "system")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return ChatRequest(messages=tuple(messages), output_schema=_output_schema(body), output_param="format",
                       **_thinking(body), **common)


def chat_request(body: dict[str, Any]) -> ChatRequest:
    """An Ollama chat body."""
    from phi_api.service.tools import tool_plan

    messages = []
    for message in body["messages"]:
        if message.get("images"):
            raise UnsupportedParameterError("images are not supported: this is a text model.", param="messages")
        converted: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
        if message["role"] == "tool":
            converted["tool_call_id"] = message.get("tool_name") or "call_ollama"
        if message.get("tool_calls"):  # their arguments stay objects: the template renders them as such
            converted["tool_calls"] = [
                {"id": new_call_id(), "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": call["function"].get("arguments") or {}}}
                for call in message["tool_calls"]]
        messages.append(converted)
    return ChatRequest(messages=tuple(messages), output_schema=_output_schema(body), output_param="format",
                       tools=tool_plan(given(body, "tools", [])), **_thinking(body), **_common(body))


class Reply:
    """Ollama's response objects for one run."""

    framing: ClassVar[Framing] = Framing.NDJSON

    def __init__(self, run: Run, started: float, *, chat: bool) -> None:
        self.run = run
        self._chat = chat  # /api/chat answers with messages; generate with responses, templated or not
        self._started = started

    def part(self, text: str, thinking: str = "", logprobs: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
        """A streamed fragment (of the answer, or of a reasoning model's ``thinking``), with its tokens' entries
        when the request asked for log-probabilities."""
        body: dict[str, Any] = {"model": self.run.request.model, "created_at": created_at()}
        if self._chat:
            body["message"] = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}
        else:
            body.update({"response": text, **({"thinking": thinking} if thinking else {})})
        if self.run.request.logprobs is not None:
            engine = self.run.engine
            body["logprobs"] = answer_entries(engine.token_bytes, engine.info.eos_token_ids, logprobs)
        body["done"] = False
        return body

    def final(self, result: ChoiceResult, text: str, thinking: str = "",
              logprobs: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
        """The last object: the text it still carries, the tool calls, the reason, the counts and the durations."""
        body = self.part(text, thinking, logprobs)
        if result.calls and self._chat:
            body["message"]["tool_calls"] = [_call(call) for call in result.calls]
        finished = result.ended.finished
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

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        """The one object of a non-streaming answer."""
        [result] = results
        return self.final(result, result.text if not result.calls else "", result.reasoning,
                          result.logprobs if not result.calls else ())

    def stream(self) -> Iterator[dict[str, Any]]:
        """The objects of a stream: fragments, then the last one."""
        result = ChoiceResult(0)
        for event in events(self.run):
            if event is KEEPALIVE:
                yield self.part("")  # an empty fragment: the client ignores it, a gone client is noticed
            elif isinstance(event, Text):
                if event.text or event.logprobs:
                    yield self.part(event.text, logprobs=event.logprobs)
            elif isinstance(event, Thinking):
                yield self.part("", event.text)
            elif isinstance(event, Done):
                result.take(event)
                yield self.final(result, "")
            else:
                result.take(event)

    def failed(self, error: APIError) -> dict[str, Any]:
        """Ollama's error object, which ends a stream that failed."""
        return ollama_body(error)


def _call(call: ToolCall) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": call.arguments_object}}
