"""What differs between OpenAI's chat completions and (legacy) completions, a :class:`Shape` for each: their object
names, the shape of a choice, the log-probability format and what a stream opens with; and the envelope they
share."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Collection, Iterable
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
        return {"content": answer_entries(self.token_bytes, self.run.engine.info.eos_token_ids, records),
                "refusal": None}

    @staticmethod
    def _chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None
               ) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def answer_entries(token_bytes: Callable[[int], bytes], ends: Collection[int],
                   records: Iterable[tuple[str, TokenLogprob]]) -> list[dict[str, Any]]:
    """The entries of an answer's tokens as OpenAI's chat and Ollama list them: the end of sequence left out, as it
    adds nothing to the answer (the legacy completions' lists keep it: lm-eval reads the token before it)."""
    return [logprob_entry(token_bytes, record) for _, record in records if record.token not in ends]


def logprob_entry(token_bytes: Callable[[int], bytes], record: TokenLogprob) -> dict[str, Any]:
    """One token's log-probability entry, as OpenAI's chat and Ollama write it: its text, log-probability and bytes,
    and its most likely alternatives. A token is spelled as itself (part of a character: ``bytes:\\xe4\\xbd``),
    as in its alternatives, not as the text it completed: the chosen token is then found among them."""
    return {
        "token": _token_text(token_bytes, record.token),
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
            offset, text = 0, codecs.getincrementaldecoder("utf-8")("replace")  # what each token adds to the text
            for token, record in records:
                offset = self._append_at(lists, offset, token, len(text.decode(self.token_bytes(token))), record)
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
            self._offsets[index] = self._append_at(lists, self._offsets[index], record.token, len(text), record)
        return lists

    def _append_at(self, lists: dict[str, list[Any]], offset: int, token: int, adds: int,
                   record: TokenLogprob | None) -> int:
        """Append ``token``'s entries at text ``offset`` (the token spelled as itself, as its alternatives are: the
        chosen one found among them); the offset after the ``adds`` characters it adds to the text (none for part
        of a character, the whole character with its last byte)."""
        spelled = _token_text(self.token_bytes, token)
        top = None
        if record is not None:
            top = {_token_text(self.token_bytes, other): logprob for other, logprob in record.top}
            top.setdefault(spelled, record.logprob)
        for name, value in (("tokens", spelled), ("token_logprobs", record.logprob if record else None),
                            ("top_logprobs", top), ("text_offset", offset)):
            lists[name].append(value)
        return offset + adds

    def _choice(self, index: int, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": logprobs if self.logprobs else None,
                "finish_reason": finish_reason}
