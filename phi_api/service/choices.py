"""One choice of an answer, as the engine's events turn into what a client is told, in no protocol's shape.

The engine reports text; a chat choice may turn out to be a tool call. A :class:`ChoiceAssembler` receives its choice's
engine events and says what can be told now: :class:`Text` (with each token's log-probability record), :class:`Calls`,
and :class:`Done` last. Text that may still become a call is held back (``tool_choice`` ``auto``: until it cannot start
one; forced calls: to the end). A forced call cut by ``max_tokens`` is told as far as it got, ending with ``length``, as
OpenAI does. A reasoning model's thinking is told apart, as :class:`Thinking` (:mod:`.reasoning`); only the answer after
it may be a call. The renderers (:mod:`phi_api.protocols.openai`, :mod:`phi_api.protocols.ollama`, ...) shape these for
their protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phi_api.engine import Finished, TextDelta
from phi_api.service.reasoning import Reasoning, ReasoningSplitter
from phi_api.service.tools import ToolCall, ToolPlan


@dataclass(frozen=True)
class Text:
    """Text of choice ``index``, and the (text, log-probability record) of each token it came from."""

    index: int
    text: str
    logprobs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Thinking:
    """Thinking of choice ``index``: a reasoning model's text before its answer (its tokens' log-probabilities are
    not reported)."""

    index: int
    text: str


@dataclass(frozen=True)
class Calls:
    """The tool calls choice ``index`` made, and the log-probability records of the tokens that spelled them."""

    index: int
    calls: tuple[ToolCall, ...]
    logprobs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Prompt:
    """The prompt's tokens of choice ``index``, each with its log-probability record (the first: None), when the
    request asked for them (echo with logprobs)."""

    index: int
    records: tuple[tuple[int, Any], ...]


@dataclass(frozen=True)
class Done:
    """Choice ``index`` is over: ``reason`` is ``stop``, ``length`` or ``tool_calls``; ``finished`` has the
    engine's counts and times."""

    index: int
    reason: str
    finished: Finished


Event = Text | Thinking | Calls | Prompt | Done


@dataclass
class ChoiceResult:
    """A whole choice: its text, every token's log-probability record, its calls, and how it ended."""

    index: int
    text: str = ""
    reasoning: str = ""
    logprobs: list[tuple[str, Any]] = field(default_factory=list)
    calls: tuple[ToolCall, ...] = ()
    prompt: tuple[tuple[int, Any], ...] = ()
    done: Done | None = None

    @property
    def ended(self) -> Done:
        """How the choice ended (asked only of the whole choices :func:`service.generation.collect` returns)."""
        assert self.done is not None, f"choice {self.index} has not ended"
        return self.done

    def take(self, event: Event) -> None:
        """Add what ``event`` tells."""
        if isinstance(event, Prompt):
            self.prompt = event.records
        elif isinstance(event, Thinking):
            self.reasoning += event.text
        elif isinstance(event, Text):
            self.text += event.text
            self.logprobs += event.logprobs
        elif isinstance(event, Calls):
            self.calls = event.calls
            self.logprobs += event.logprobs
        else:
            self.done = event


class ChoiceAssembler:
    """Turns one choice's engine events into the events a client is told (see the module's docstring)."""

    def __init__(self, index: int, plan: ToolPlan | None, reasoning: Reasoning | None = None) -> None:
        self.index = index
        self._plan = plan
        # text: told as it comes; forced: all held; undecided: held while it may start a call; watching: told until
        # the model's call marker may be opening, then held (a format whose calls start anywhere)
        self._mode = "text" if plan is None else "forced" if plan.forced else \
            "watching" if plan.finds_calls_anywhere else "undecided"
        self._parts: list[str] = []
        self._held: list[Text] = []
        self._thinking = ReasoningSplitter(reasoning) if reasoning is not None else None

    def add(self, delta: TextDelta) -> list[Event]:
        """Take new text; what can be told now."""
        if self._thinking is None:
            return self._answer(Text(self.index, delta.text, delta.logprobs))
        return self._split(self._thinking.feed(delta.text), delta.logprobs)

    def _split(self, pieces: list[tuple[bool, str]], logprobs: tuple[tuple[str, Any], ...] = ()) -> list[Event]:
        """Thinking told as it is; the answer's pieces (carrying the delta's log-probabilities) as any answer."""
        events: list[Event] = []
        for thinking, text in pieces:
            if thinking:
                events.append(Thinking(self.index, text))
            else:
                events += self._answer(Text(self.index, text, logprobs))
                logprobs = ()
        return events

    def _answer(self, text: Text) -> list[Event]:
        self._parts.append(text.text)
        if self._mode == "text":
            return [text]
        self._held.append(text)
        assert self._plan is not None
        if self._mode == "undecided" and not self._plan.could_start("".join(self._parts)):
            self._mode = "text"
            return self._release_held()
        if self._mode == "watching" and not self._plan.format.may_open("".join(held.text for held in self._held)):
            return self._release_held()
        return []

    def close(self, finished: Finished) -> list[Event]:
        """The end of the choice: held thinking and text, or tool calls, then :class:`Done`."""
        told = self._split(self._thinking.flush()) if self._thinking is not None else []
        return told + self._end(finished)

    def _end(self, finished: Finished) -> list[Event]:
        content, calls, reason = self._calls(finished)
        if calls:
            records = tuple(record for text in self._held for record in text.logprobs)
            told: list[Event] = [Text(self.index, content)] if content else []
            return told + [Calls(self.index, tuple(calls), records), Done(self.index, reason, finished)]
        return self._release_held() + [Done(self.index, reason, finished)]

    def _calls(self, finished: Finished) -> tuple[str, list[ToolCall], str]:
        """The text still to tell around the calls, the calls, and the reason the choice ended."""
        if self._plan is None or self._mode == "text":  # (an answer that did not open with a call: text, all told)
            return "", [], finished.reason
        # a format whose calls start anywhere: the text told already is the answer's; the rest holds the calls
        watched = self._mode == "watching"
        text = "".join(held.text for held in self._held) if watched else "".join(self._parts)
        content, calls = self._plan.split(text)
        if calls:
            return content if watched else "", calls, "tool_calls"
        partial = self._plan.partial_call(text) if finished.reason == "length" else None
        return "", ([partial] if partial else []), "length" if partial else finished.reason

    def _release_held(self) -> list[Event]:
        held, self._held = self._held, []
        if not held:
            return []
        return [Text(self.index, "".join(text.text for text in held),
                     tuple(record for text in held for record in text.logprobs))]
