"""The two OpenAI response formats: chat completions and (legacy) completions.

Both endpoints share one generation path (``service.completions``); what
differs is only how a prompt is built and how text is wrapped, which each
format states here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from phi_api.engine import Engine
from phi_api.service import features, prompts


@dataclass(frozen=True)
class Format:
    """How one endpoint builds its prompt and shapes its answers."""

    schema: str
    object: str
    chunk_object: str
    id_prefix: str
    prompt_param: str
    gates: tuple[features.Gate, ...]
    build_prompt: Callable[[Engine, dict[str, Any]], tuple[np.ndarray, str]]
    choice: Callable[[str, str | None], dict[str, Any]]
    delta: Callable[[str, str | None], dict[str, Any]]
    opens_with_role: bool


def _chat_prompt(engine: Engine, body: dict[str, Any]) -> tuple[np.ndarray, str]:
    return prompts.chat_prompt(engine, body["messages"]), ""


def _chat_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def _chat_delta(text: str, finish_reason: str | None) -> dict[str, Any]:
    delta = {"content": text} if finish_reason is None else {}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _completion_prompt(engine: Engine, body: dict[str, Any]) -> tuple[np.ndarray, str]:
    ids, text = prompts.completion_prompt(engine, body["prompt"])
    return ids, text if body.get("echo") else ""


def _completion_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


CHAT = Format(
    schema="chat_completion",
    object="chat.completion",
    chunk_object="chat.completion.chunk",
    id_prefix="chatcmpl",
    prompt_param="messages",
    gates=features.CHAT_GATES,
    build_prompt=_chat_prompt,
    choice=_chat_choice,
    delta=_chat_delta,
    opens_with_role=True,
)

COMPLETION = Format(
    schema="completion",
    object="text_completion",
    chunk_object="text_completion.chunk",
    id_prefix="cmpl",
    prompt_param="prompt",
    gates=features.COMPLETION_GATES,
    build_prompt=_completion_prompt,
    choice=_completion_choice,
    delta=_completion_choice,
    opens_with_role=False,
)


def role_delta() -> dict[str, Any]:
    """The first chat chunk's choice: the assistant role, no text yet."""
    return {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
