"""One choice of an answer, as it streams and as it ends, in each endpoint's shape.

A choice builder receives the engine's events for its choice and returns the
choice objects to send: chunks' choices while streaming (``add``, ``close``)
or the final choice (``result``). Chat choices also turn tool calls into
OpenAI's ``tool_calls``, holding text back while it may still become one.
"""

from __future__ import annotations

from typing import Any

from phi_api.engine import Engine, Finished, TextDelta
from phi_api.service.tools import ToolCall, ToolPlan, could_be_call


def _token_text(engine: Engine, token: int) -> str:
    raw = engine.token_bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # part of a character: OpenAI's spelling for raw bytes
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


class ChatChoice:
    """A chat completion choice: content, or tool calls."""

    def __init__(self, index: int, engine: Engine, plan: ToolPlan | None, logprobs: bool) -> None:
        self.index = index
        self._engine = engine
        self._plan = plan
        self._logprobs = logprobs
        self._mode = "text" if plan is None else ("forced" if plan.forced else "undecided")
        self._parts: list[str] = []
        self._entries: list[dict[str, Any]] = []
        self._held: list[tuple[str, list[dict[str, Any]]]] = []

    def open(self) -> list[dict[str, Any]]:
        """The first chunk's choice: the role."""
        return [self._chunk({"role": "assistant", "content": ""})]

    def add(self, delta: TextDelta) -> list[dict[str, Any]]:
        """Take new text; the chunk choices it lets us send now."""
        entries = [self._entry(text, record) for text, record in delta.logprobs]
        self._parts.append(delta.text)
        self._entries += entries
        if self._mode == "text":
            return [self._content_chunk(delta.text, entries)]
        self._held.append((delta.text, entries))
        if self._mode == "undecided" and not could_be_call("".join(self._parts)):
            self._mode = "text"
            return self._release_held()
        return []

    def close(self, finished: Finished) -> list[dict[str, Any]]:
        """The last chunks of a stream: held text or tool calls, then the finish reason."""
        calls, reason = self._calls(finished)
        if calls:
            chunks = []
            for position, call in enumerate(calls):
                chunks.append(self._chunk({"tool_calls": [{"index": position, "id": call.id, "type": "function",
                                                           "function": {"name": call.name, "arguments": ""}}]}))
                chunks.append(self._chunk({"tool_calls": [{"index": position,
                                                           "function": {"arguments": call.arguments}}]}))
            return chunks + [self._chunk({}, finish_reason=reason)]
        return self._release_held() + [self._chunk({}, finish_reason=reason)]

    def result(self, finished: Finished) -> dict[str, Any]:
        """The whole choice, for a non-streaming answer."""
        calls, reason = self._calls(finished)
        # OpenAI's schema requires "refusal" (null: this server never refuses in a separate field).
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else "".join(self._parts),
                                   "refusal": None}
        if calls:
            message["tool_calls"] = [call.to_openai() for call in calls]
        return {
            "index": self.index,
            "message": message,
            "logprobs": {"content": self._entries, "refusal": None} if self._logprobs else None,
            "finish_reason": reason,
        }

    def _calls(self, finished: Finished) -> tuple[list[ToolCall], str]:
        """The answer's tool calls and its finish reason; a forced call cut by ``max_tokens`` is
        returned as far as it got, with ``length`` (as OpenAI does)."""
        if self._plan is None:
            return [], finished.reason
        text = "".join(self._parts)
        calls = self._plan.parse(text)
        if calls:
            return calls, "tool_calls"
        partial = self._plan.partial_call(text) if finished.reason == "length" else None
        return ([partial], "length") if partial else ([], finished.reason)

    def _release_held(self) -> list[dict[str, Any]]:
        held, self._held = self._held, []
        text = "".join(part for part, _ in held)
        entries = [entry for _, part_entries in held for entry in part_entries]
        return [self._content_chunk(text, entries)] if text or entries else []

    def _content_chunk(self, text: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        return self._chunk({"content": text}, {"content": entries, "refusal": None} if self._logprobs else None)

    def _chunk(self, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def _entry(self, text: str, record: Any) -> dict[str, Any]:
        engine = self._engine
        return {
            "token": text,
            "logprob": record.logprob,
            "bytes": list(engine.token_bytes(record.token)),
            "top_logprobs": [{"token": _token_text(engine, token), "logprob": logprob,
                              "bytes": list(engine.token_bytes(token))} for token, logprob in record.top],
        }


class CompletionChoice:
    """A (legacy) text completion choice, with OpenAI's completion log-probability lists."""

    def __init__(self, index: int, engine: Engine, echo: str, logprobs: bool) -> None:
        self.index = index
        self._engine = engine
        self._echo = echo
        self._logprobs = logprobs
        self._parts = [echo]
        self._offset = len(echo)
        self._lists: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                             "text_offset": []}

    def open(self) -> list[dict[str, Any]]:
        """The echoed prompt, first, when asked for."""
        return [self._choice(self._echo, None, None)] if self._echo else []

    def add(self, delta: TextDelta) -> list[dict[str, Any]]:
        """Take new text; the chunk choice carrying it."""
        lists = self._record(delta)
        self._parts.append(delta.text)
        return [self._choice(delta.text, lists, None)]

    def close(self, finished: Finished) -> list[dict[str, Any]]:
        """The last chunk of a stream: the finish reason."""
        return [self._choice("", None, finished.reason)]

    def result(self, finished: Finished) -> dict[str, Any]:
        """The whole choice, for a non-streaming answer."""
        return self._choice("".join(self._parts), self._lists, finished.reason)

    def _record(self, delta: TextDelta) -> dict[str, list[Any]] | None:
        if not self._logprobs:
            return None
        lists: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for text, record in delta.logprobs:
            top = {_token_text(self._engine, token): logprob for token, logprob in record.top}
            top.setdefault(text, record.logprob)
            for name, value in (("tokens", text), ("token_logprobs", record.logprob), ("top_logprobs", top),
                                ("text_offset", self._offset)):
                lists[name].append(value)
                self._lists[name].append(value)
            self._offset += len(text)
        return lists

    def _choice(self, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        return {"text": text, "index": self.index, "logprobs": logprobs if self._logprobs else None,
                "finish_reason": finish_reason}
