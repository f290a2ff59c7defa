"""What differs between OpenAI's chat completions and (legacy) completions, a :class:`Shape` for each: their object
names, the shape of a choice, the log-probability format and what a stream opens with; and the envelope they
share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phi_api.engine.sampling.logits import TokenLogprob
from phi_api.service.choices import Calls, ChoiceResult, Done, Prompt, Text, Thinking
from phi_api.service.generation import Run


def _token_text(token_bytes: Callable[[int], bytes], token: int) -> str:
    raw = token_bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # part of a character: OpenAI's spelling for raw bytes
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


@dataclass
class Envelope:
    """The fields every response object and chunk of one request share."""

    id: str
    created: int
    model: str
    system_fingerprint: str

    def wrap(self, object: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A response object or chunk with these ``choices``."""
        return {"id": self.id, "object": object, "created": self.created, "model": self.model,
                "system_fingerprint": self.system_fingerprint, "choices": choices, **extra}


class Shape:
    """What differs between chat completions and completions (subclassed once for each)."""

    object = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, run: Run, token_bytes: Callable[[int], bytes]) -> None:
        self.run = run
        self.token_bytes = token_bytes
        self.logprobs = run.request.logprobs is not None

    def opening(self, index: int) -> list[dict[str, Any]]:
        """The chunk choices a stream opens with."""
        return []

    def chunk_text(self, event: Text) -> dict[str, Any]:
        """A chunk choice carrying ``event``'s text."""
        raise NotImplementedError

    def chunk_calls(self, event: Calls) -> list[dict[str, Any]]:
        """Chunk choices announcing tool calls (only chats make them)."""
        return []

    def chunk_thinking(self, event: Thinking) -> list[dict[str, Any]]:
        """Chunk choices carrying a reasoning model's thinking (only chats tell it apart)."""
        return []

    def chunk_prompt(self, event: Prompt) -> list[dict[str, Any]]:
        """Chunk choices carrying the scored prompt (only echoing completions score it)."""
        return []

    def chunk_done(self, event: Done) -> dict[str, Any]:
        """The chunk choice with the finish reason."""
        raise NotImplementedError

    def whole(self, result: ChoiceResult) -> dict[str, Any]:
        """A whole choice, for a non-streaming answer."""
        raise NotImplementedError


class ChatShape(Shape):
    """``chat.completion``: a message (content, or tool calls) per choice."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def opening(self, index: int) -> list[dict[str, Any]]:
        return [self._chunk(index, {"role": "assistant", "content": ""})]

    def chunk_text(self, event: Text) -> dict[str, Any]:
        return self._chunk(event.index, {"content": event.text}, self._content(event.logprobs))

    def chunk_calls(self, event: Calls) -> list[dict[str, Any]]:
        chunks = []
        for position, call in enumerate(event.calls):
            opening = {"index": position, "id": call.id, "type": "function",
                       "function": {"name": call.name, "arguments": ""}}
            chunks.append(self._chunk(event.index, {"tool_calls": [opening]}))
            chunks.append(self._chunk(event.index, {"tool_calls": [{"index": position,
                                                                    "function": {"arguments": call.arguments}}]}))
        return chunks

    def chunk_thinking(self, event: Thinking) -> list[dict[str, Any]]:
        # vLLM's names: reasoning_content, and the newer reasoning
        return [self._chunk(event.index, {"reasoning_content": event.text, "reasoning": event.text})]

    def chunk_done(self, event: Done) -> dict[str, Any]:
        return self._chunk(event.index, {}, finish_reason=event.reason)

    def whole(self, result: ChoiceResult) -> dict[str, Any]:
        # OpenAI's schema requires "refusal" (null: this server never refuses in a separate field).
        # with calls, the text around them (a family whose calls start anywhere), or null as OpenAI writes it
        message: dict[str, Any] = {"role": "assistant", "content": (result.text or None) if result.calls
                                   else result.text, "refusal": None}
        if self.run.plan.reasoning is not None:  # a reasoning model's thinking, apart from its answer
            message["reasoning_content"] = message["reasoning"] = result.reasoning or None
        if result.calls:
            message["tool_calls"] = [call.to_openai() for call in result.calls]
        return {"index": result.index, "message": message, "logprobs": self._content(result.logprobs),
                "finish_reason": result.ended.reason}

    def _content(self, records: Any) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {"content": [self._entry(text, record) for text, record in records], "refusal": None}

    @staticmethod
    def _chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None
               ) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def _entry(self, text: str, record: TokenLogprob) -> dict[str, Any]:
        return logprob_entry(self.token_bytes, text, record)


def logprob_entry(token_bytes: Callable[[int], bytes], text: str, record: TokenLogprob) -> dict[str, Any]:
    """One token's log-probability entry, as OpenAI's chat and Ollama write it: its text, log-probability and bytes,
    and its most likely alternatives."""
    return {
        "token": text,
        "logprob": record.logprob,
        "bytes": list(token_bytes(record.token)),
        "top_logprobs": [{"token": _token_text(token_bytes, token), "logprob": logprob,
                          "bytes": list(token_bytes(token))} for token, logprob in record.top],
    }


class CompletionShape(Shape):
    """``text_completion``: text per choice, with OpenAI's completion log-probability lists."""

    object = "text_completion"
    chunk_object = "text_completion.chunk"  # vLLM's and the specification's name (OpenAI reuses text_completion)
    id_prefix = "cmpl"

    def __init__(self, run: Run, token_bytes: Callable[[int], bytes]) -> None:
        super().__init__(run, token_bytes)
        # echo with logprobs scores the prompt: its text comes with its lists once the engine has them
        self._scored = bool(run.plan.echo) and self.logprobs
        self._offsets = [0 if self._scored else len(run.plan.echo_of(index)) for index in range(len(run.plan.params))]
        self._scored_prompts: dict[int, tuple[Any, dict[str, list[Any]], int]] = {}  # (records, lists, end)

    def opening(self, index: int) -> list[dict[str, Any]]:
        echo = self.run.plan.echo_of(index)
        return [self._choice(index, echo, None, None)] if echo and not self._scored else []

    def chunk_prompt(self, event: Prompt) -> list[dict[str, Any]]:
        lists = self._prompt_lists(event.index, event.records)
        return [self._choice(event.index, self.run.plan.echo_of(event.index), lists, None)]

    def _prompt_lists(self, index: int, records: Any) -> dict[str, list[Any]]:
        """OpenAI's lists for the prompt's tokens (the first has no log-probability: null, as OpenAI and vLLM write
        it), made once for each prompt and shared by its choices (the engine shares its records)."""
        prompt = index // self.run.plan.per_prompt
        made = self._scored_prompts.get(prompt)
        if made is None or made[0] is not records:
            lists: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            offset = 0
            for token, record in records:
                offset = self._append_at(lists, offset, _token_text(self.token_bytes, token), record)
            made = self._scored_prompts[prompt] = (records, lists, offset)
        self._offsets[index] = made[2]  # the choice's own tokens follow the prompt's text
        return made[1]

    def chunk_text(self, event: Text) -> dict[str, Any]:
        return self._choice(event.index, event.text, self._lists(event.index, event.logprobs), None)

    def chunk_done(self, event: Done) -> dict[str, Any]:
        return self._choice(event.index, "", None, event.reason)

    def whole(self, result: ChoiceResult) -> dict[str, Any]:
        echo = self.run.plan.echo_of(result.index)
        self._offsets[result.index] = 0 if self._scored else len(echo)
        lists = self._prompt_lists(result.index, result.prompt) if self._scored else None
        generated = self._lists(result.index, result.logprobs)
        if lists is not None and generated is not None:
            lists = {name: lists[name] + generated[name] for name in lists}
        return self._choice(result.index, echo + result.text, lists or generated, result.ended.reason)

    def _lists(self, index: int, records: Any) -> dict[str, list[Any]] | None:
        if not self.logprobs:
            return None
        lists: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for text, record in records:
            self._append(lists, index, text, record)
        return lists

    def _append(self, lists: dict[str, list[Any]], index: int, text: str, record: TokenLogprob | None) -> None:
        self._offsets[index] = self._append_at(lists, self._offsets[index], text, record)

    def _append_at(self, lists: dict[str, list[Any]], offset: int, text: str, record: TokenLogprob | None) -> int:
        """Append a token's entries at text ``offset``; the offset after it."""
        top = None
        if record is not None:
            top = {_token_text(self.token_bytes, token): logprob for token, logprob in record.top}
            top.setdefault(text, record.logprob)
        for name, value in (("tokens", text), ("token_logprobs", record.logprob if record else None),
                            ("top_logprobs", top), ("text_offset", offset)):
            lists[name].append(value)
        return offset + len(text)

    def _choice(self, index: int, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": logprobs if self.logprobs else None,
                "finish_reason": finish_reason}
