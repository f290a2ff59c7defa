"""Prompts: chat messages through the model's template, completion prompts as they are."""

from __future__ import annotations

from typing import Any

import numpy as np

from phi_api.engine import ChatTemplateError, Engine
from phi_api.errors import InvalidMessagesError, InvalidParameterError, UnsupportedParameterError

# The template sees these roles; "developer" is OpenAI's newer name for "system".
_TEMPLATE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: a role and plain-text content."""
    rendered = []
    for index, message in enumerate(messages):
        role = _TEMPLATE_ROLES.get(message["role"])
        if role is None or message.get("tool_calls"):
            raise UnsupportedParameterError(
                f"messages[{index}]: tool and function messages are not supported.", param="messages"
            )
        entry = {"role": role, "content": _text_content(message.get("content"), index)}
        if message.get("name"):
            entry["name"] = message["name"]
        rendered.append(entry)
    return rendered


def _text_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part["type"] != "text":
            raise UnsupportedParameterError(
                f"messages[{index}]: content parts of type '{part['type']}' are not supported; this is a text model.",
                param="messages",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def chat_prompt(engine: Engine, messages: list[dict[str, Any]]) -> np.ndarray:
    """Token ids of the templated conversation, ending with the assistant's turn."""
    try:
        text = engine.render_chat(chat_messages(messages))
    except ChatTemplateError as exc:
        raise InvalidMessagesError(f"The chat template rejected the messages: {exc}") from None
    return engine.encode(text)


def completion_prompt(engine: Engine, prompt: Any) -> tuple[np.ndarray, str]:
    """Token ids and text of a completion prompt (a string or token ids; one prompt only)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > 1:
            raise UnsupportedParameterError("Several prompts in one request are not supported.", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = engine.encode(prompt)
        text = prompt
    else:
        vocab = engine.info.vocab_size
        if vocab and max(prompt) >= vocab:
            raise InvalidParameterError(f"prompt has a token id beyond the vocabulary ({vocab}).", param="prompt")
        ids = np.array(prompt, dtype=np.int32)
        text = engine.decode(ids)
    if len(ids) == 0:
        raise InvalidParameterError("prompt must not be empty.", param="prompt")
    return ids, text
