"""Prompts: chat messages through the model's template, completion prompts as they are."""

from __future__ import annotations

import logging
import re
from typing import Any

import numpy as np

from phi_api.engine import Engine
from phi_api.errors import (
    ContextLengthExceededError,
    InvalidMessagesError,
    InvalidParameterError,
    UnsupportedParameterError,
)
from phi_api.service.requests import Infill
from phi_api.service.tools import ToolPlan, template_messages

log = logging.getLogger(__name__)

# Byte-level BPE takes time superlinear in the length of a run of text without
# whitespace (600 KB of random letters in one run: about a minute of a core,
# while the same bytes as words take 0.2 s). Longer runs are refused.
MAX_RUN_CHARS = 4096
_LONG_RUN = re.compile(rf"(?<!\S)\S{{{MAX_RUN_CHARS + 1}}}")  # anchored at run starts: linear time

# "developer" is OpenAI's newer name for "system"; templates know the older one.
_ROLE_NAMES = {"developer": "system", "function": "tool"}


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with plain-text content, as chat templates expect them."""
    rendered = []
    for index, message in enumerate(messages):
        entry = {"role": _ROLE_NAMES.get(message["role"], message["role"]),
                 "content": _text_content(message.get("content"), index)}
        for field in ("name", "tool_calls", "tool_call_id"):
            if message.get(field):
                entry[field] = message[field]
        rendered.append(entry)
    return rendered


def check_call_pairs(messages: list[dict[str, Any]] | tuple[dict[str, Any], ...], param: str = "messages") -> None:
    """400 unless every tool call of an assistant message is answered by the tool messages right after it, and each
    tool message answers a call of the assistant message before it: OpenAI's and Anthropic's rule (an agent loop
    that lost a result would otherwise get an answer made up over the gap). Messages in the chat form. Linear in
    the calls and answers: their ids are counted in a dict, not looked for in a list (that was calls x answers).
    ``param``: the request's field the messages came from."""
    waiting: dict[Any, int] = {}  # the calls of the last assistant message not yet answered: id -> how many
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            answered = message.get("tool_call_id")
            if not waiting.get(answered):
                raise InvalidMessagesError(f"messages[{index}]: a tool message must answer a tool call of the "
                                           f"assistant message before it; '{answered}' is none of them.", param=param)
            waiting[answered] -= 1
            if not waiting[answered]:
                del waiting[answered]
            continue
        _check_answered(waiting, param)
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict):
                    waiting[call.get("id")] = waiting.get(call.get("id"), 0) + 1
    _check_answered(waiting, param)


def _check_answered(waiting: dict[Any, int], param: str) -> None:
    if waiting:
        raise InvalidMessagesError("An assistant message with tool calls must be followed by a tool message "
                                   f"answering each; no answer for: {', '.join(map(str, waiting))}.", param=param)


def _text_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part["type"] not in ("text", "refusal"):
            raise UnsupportedParameterError(
                f"messages[{index}]: content parts of type '{part['type']}' are not supported; this is a text model.",
                param="messages",
            )
        texts.append(part.get("text") or part.get("refusal") or "")
    return "\n".join(texts)


def chat_prompt(engine: Engine, messages: list[dict[str, Any]], plan: ToolPlan | None = None,
                add_generation_prompt: bool = True, must_fit: bool = True,
                variables: dict[str, Any] | None = None, continue_final: bool = False) -> np.ndarray:
    """Token ids of the templated conversation (tools included), ending with the assistant's turn, or, with
    ``continue_final``, within it: right after the last message's text (:func:`continued`); ``variables``: what else
    the template reads (``chat_template_kwargs``)."""
    knows_tools = engine.info.template_knows_tools
    rendered = template_messages(chat_messages(messages), plan, knows_tools)
    tools = [{"type": "function", "function": f} for f in plan.functions] if plan and knows_tools else None
    # ChatTemplateError: see web.foreign.FOREIGN
    text = engine.render_chat(rendered, tools, add_generation_prompt and not continue_final, variables or None)
    if continue_final:
        text = continued(text, rendered[-1]["content"])
    return text_tokens(engine, text, "messages", must_fit=must_fit)


def continued(text: str, final: str) -> str:
    """The templated chat ``text`` cut right after its last message's text ``final``, so that the answer goes on
    from it (as vLLM's ``continue_final_message`` does): templates close every turn, the last one too, with their
    own marks. Some trim a message's blanks, so the text is found trimmed; 400 if the template changed it more."""
    final = final.strip()
    end = text.rfind(final)
    if not final or end < 0:
        raise InvalidMessagesError("The model's chat template changes the last message's text, so the answer cannot "
                                   "continue it.")
    return text[:end + len(final)]


def text_tokens(engine: Engine, text: str, param: str, *, must_fit: bool = True) -> np.ndarray:
    """Token ids of ``text``, given as ``param``; refuses, without tokenizing, what cannot be done quickly.

    With ``must_fit``, a text longer in bytes than the context times the
    vocabulary's longest token cannot fit the context: 400
    ``context_length_exceeded`` at once. A run of more than ``MAX_RUN_CHARS``
    characters without whitespace: 400.
    """
    longest = engine.longest_token_bytes
    if must_fit and longest and len(text.encode("utf-8")) > engine.info.context_length * longest:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {engine.info.context_length} tokens, "
            f"and the {param} are too long to fit it.", param=param)
    if _LONG_RUN.search(text):
        message = (f"{param} holds a run of more than {MAX_RUN_CHARS} characters without whitespace, "
                   "which this server does not tokenize.")
        raise InvalidMessagesError(message) if param == "messages" else InvalidParameterError(message, param=param)
    return engine.encode(text)


def completion_prompts(engine: Engine, prompt: Any, most: int, infill: Infill | None = None
                       ) -> list[tuple[np.ndarray, str]]:
    """Token ids and text of each prompt of a completion request: a string, token ids, or a list of either (at
    most ``most`` of them; answered as one choice per prompt, times ``n``, as OpenAI does). With ``infill``, each
    prompt is the text before a hole (:func:`infill_prompt`)."""
    several = isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
    if several and len(prompt) > most:
        raise InvalidParameterError(f"prompt holds {len(prompt)} prompts; at most {most} fit in one request (with "
                                    "this n).", param="prompt")
    prompts = prompt if several else [prompt]
    if infill is None:
        return [completion_prompt(engine, one) for one in prompts]
    if not all(isinstance(one, str) for one in prompts):
        raise InvalidParameterError("With suffix, the prompt is text (the code before the hole).", param="prompt")
    return [(infill_prompt(engine, one, infill), one) for one in prompts]


def infill_prompt(engine: Engine, prefix: str, infill: Infill) -> np.ndarray:
    """Token ids for filling the hole between ``prefix`` and the infill's suffix with the model's fill-in-the-middle
    tokens, laid out as llama.cpp's server does: extra context, then prefix-suffix-middle as the families that
    have them train on, then the tail; 400 for a model without them."""
    tokens = engine.info.fim_tokens
    if tokens is None:
        raise UnsupportedParameterError("suffix (fill-in-the-middle) needs a model whose tokenizer has "
                                        "fill-in-the-middle tokens, and this one has none.", param="suffix")
    fim_prefix, fim_suffix, fim_middle = tokens

    def text(piece: str, param: str) -> list[int]:
        return text_tokens(engine, piece, param).tolist() if piece else []

    ids = [*text(infill.extra, "input_extra"), fim_prefix, *text(prefix, "prompt"), fim_suffix,
           *text(infill.suffix, "suffix"), fim_middle, *text(infill.tail, "prompt")]
    return with_prefix(engine, np.array(ids, dtype=np.int32))


def completion_prompt(engine: Engine, prompt: Any) -> tuple[np.ndarray, str]:
    """Token ids and text of one completion prompt (a string or token ids)."""
    if isinstance(prompt, str):
        ids = with_prefix(engine, text_tokens(engine, prompt, "prompt"))
        text = prompt
    else:
        check_token_ids(engine, prompt, "prompt")
        ids = np.array(prompt, dtype=np.int32)
        text = engine.decode(ids)
    if len(ids) == 0:
        raise InvalidParameterError("prompt must not be empty.", param="prompt")
    return ids, text


def with_prefix(engine: Engine, ids: np.ndarray) -> np.ndarray:
    """A raw text's ``ids`` as the model's own tokenizer gives them: after the tokens it puts first (Gemma's
    ``<bos>``, which ONNX Runtime GenAI's tokenizer leaves out and without which such a model babbles), unless the
    text spelled them itself. Chat prompts have them from their template."""
    prefix = engine.info.prompt_prefix
    if not prefix or tuple(ids[:len(prefix)].tolist()) == prefix:
        return ids
    return np.concatenate([np.array(prefix, dtype=ids.dtype), ids])


def detokenized(engine: Engine, tokens: list[int], param: str) -> str:
    """``tokens`` (given as ``param``) as text; 400 for an id beyond the vocabulary, or more tokens than the model's
    context holds (a token may be dozens of bytes of text: the answer is bounded as a sequence the model reads)."""
    longest = engine.info.context_length
    if len(tokens) > longest:
        raise InvalidParameterError(f"{param} holds {len(tokens)} tokens; at most {longest} (the model's context "
                                    "length) are turned back into text at once.", param=param)
    check_token_ids(engine, tokens, param)
    return engine.decode(tokens) if tokens else ""


def check_token_ids(engine: Engine, tokens: list[int], param: str) -> None:
    """400 if ``tokens`` (given as ``param``) holds an id beyond the model's vocabulary."""
    vocab = engine.info.vocab_size
    if vocab and tokens and max(tokens) >= vocab:
        raise InvalidParameterError(f"{param} has a token id beyond the vocabulary ({vocab}).", param=param)
