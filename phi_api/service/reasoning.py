"""A reasoning model's thinking, told apart from its answer: the text between the model's thinking markers
(``<think>`` and ``</think>`` for Qwen3, DeepSeek-R1-Distill, Phi-4-mini-reasoning), found as the text streams.

A template may open the thinking itself (DeepSeek-R1-Distill ends the prompt with ``<think>\\n``): then the
answer starts inside it and only the end marker appears. Text that may still be the start of a marker is held
back until it cannot be; the markers themselves are told to nobody, nor are the blanks around the thinking.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from phi_api.engine import ThinkingBudget
from phi_api.engine.runtime.folder import THINK_MARKERS
from phi_api.errors import UnsupportedParameterError

if TYPE_CHECKING:  # the request types import nothing of this module; only their annotations are needed here
    from phi_api.engine import Engine
    from phi_api.service.requests import ChatRequest


@dataclass(frozen=True)
class Reasoning:
    """How one chat answer's thinking is found: its markers, and whether the prompt left the model inside it."""

    start: str
    end: str
    inside: bool = False


class ReasoningSplitter:
    """Splits one answer's text, as it streams, into (is thinking, text) pieces in order."""

    def __init__(self, reasoning: Reasoning) -> None:
        self._start, self._end = reasoning.start, reasoning.end
        self._state = "thinking" if reasoning.inside else "opening"
        self._pending = ""
        self._trim = reasoning.inside  # blanks that open the thinking, or the answer after it, are dropped

    def feed(self, text: str) -> list[tuple[bool, str]]:
        """Take more text; the pieces that can be told now."""
        self._pending += text
        pieces: list[tuple[bool, str]] = []
        while True:
            before = (self._state, self._pending)
            pieces += self._step()
            if (self._state, self._pending) == before:
                return [piece for piece in pieces if piece[1]]

    def flush(self) -> list[tuple[bool, str]]:
        """The end of the answer: whatever was held back."""
        pending, self._pending = self._pending, ""
        if self._trim:
            pending = pending.lstrip()
        return [(self._state == "thinking", pending)] if pending else []

    def _step(self) -> list[tuple[bool, str]]:
        if self._trim:
            stripped = self._pending.lstrip()
            if not stripped:
                return []
            self._pending, self._trim = stripped, False
        if self._state == "opening":
            return self._opening()
        if self._state == "thinking":
            return self._thinking()
        pending, self._pending = self._pending, ""
        return [(False, pending)]

    def _opening(self) -> list[tuple[bool, str]]:
        """At the answer's start: the start marker (after blanks) opens the thinking; anything else is answer."""
        head = self._pending.lstrip()
        if head.startswith(self._start):
            self._pending, self._state, self._trim = head[len(self._start):], "thinking", True
        elif not (self._start.startswith(head)):  # cannot become the marker: no thinking in this answer
            self._state = "answer"
        return []

    def _thinking(self) -> list[tuple[bool, str]]:
        found = self._pending.find(self._end)
        if found >= 0:
            thought = self._pending[:found].rstrip()
            self._pending, self._state, self._trim = self._pending[found + len(self._end):], "answer", True
            return [(True, thought)]
        # held back: what may start the end marker, and the blanks before it (dropped if the marker follows)
        cut = len(self._pending) - _held_suffix(self._pending, self._end)
        cut = len(self._pending[:cut].rstrip())
        told, self._pending = self._pending[:cut], self._pending[cut:]
        return [(True, told)]


def _held_suffix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def thinking_markers(engine: Engine) -> tuple[str, str] | None:
    """The model's thinking markers, start and end, by its REASONING_PARSER: those its tokenizer holds (auto),
    ``<think>`` and ``</think>`` read in the text whatever the tokenizer (think: Phi-4-mini-reasoning writes them
    as plain text), or none; None for a model whose thinking is not told apart."""
    parser = engine.config.reasoning_parser
    if parser == "none":
        return None
    return THINK_MARKERS[0] if parser == "think" else engine.info.think_markers


def template_variables(engine: Engine, request: ChatRequest) -> dict[str, Any]:
    """What the chat template reads besides the conversation: the request's ``chat_template_kwargs``, and
    ``enable_thinking`` false for a request that turns a reasoning model's thinking off, where its template has it
    (Qwen3's)."""
    variables = dict(request.template_variables)
    if request.reasoning_effort == "none" and _can_stop_thinking(engine):
        variables.setdefault("enable_thinking", False)
    return variables


def _can_stop_thinking(engine: Engine) -> bool:
    return thinking_markers(engine) is not None and "enable_thinking" in engine.info.chat_template


def reasoning_of(engine: Engine, request: ChatRequest, prompt: np.ndarray) -> Reasoning | None:
    """How the answer's thinking is found, for a reasoning model (one whose tokenizer has thinking markers, or
    REASONING_PARSER=think); 400 for a request about thinking that the model cannot honour."""
    markers, effort = thinking_markers(engine), request.reasoning_effort
    if markers is None:
        if effort not in (None, "none"):
            raise UnsupportedParameterError(f"{request.reasoning_param} applies to reasoning models only, and this "
                                            "model does not reason.", param=request.reasoning_param)
        return None
    if effort == "none" and not _can_stop_thinking(engine):
        raise UnsupportedParameterError(f"This model's thinking cannot be turned off ({request.reasoning_param}): "
                                        "its chat template has no enable_thinking.", param=request.reasoning_param)
    opened = engine.decode(prompt[-8:]).rstrip().endswith(markers[0])  # the template opened the thinking itself
    return Reasoning(markers[0], markers[1], inside=opened)


def closed_for_an_answer(engine: Engine, prompt: np.ndarray,
                         found: Reasoning | None) -> tuple[np.ndarray, Reasoning | None]:
    """``prompt`` with the thinking its template opened closed (the end marker after it), when it opened one: a
    forced call's grammar then writes the answer, not thinking (a request's own grammar shapes the whole output,
    thinking included, as llama.cpp's does: it may spell the end marker itself)."""
    if found is None or not found.inside:
        return prompt, found
    closing = engine.encode(f"{found.end}\n\n").astype(prompt.dtype)
    return np.concatenate([prompt, closing]), dataclasses.replace(found, inside=False)


def thinking_budget(engine: Engine, request: ChatRequest, found: Reasoning | None) -> ThinkingBudget | None:
    """The request's thinking budget in engine terms (vLLM's ``thinking_token_budget``, Anthropic's
    ``budget_tokens``); None without one, or for a model that does not think (it keeps any budget); 400 where the
    thinking's markers are text rather than tokens (the budget ends the thinking with the end marker's token)."""
    if request.thinking_budget is None or found is None:
        return None
    if engine.info.think_token_ids is None or (found.start, found.end) != engine.info.think_markers:
        raise UnsupportedParameterError("A thinking budget needs thinking markers that are tokens of the model's "
                                        "tokenizer; this model writes them as text.", param="thinking_token_budget")
    start, end = engine.info.think_token_ids
    return ThinkingBudget(start, end, request.thinking_budget, inside=found.inside)
