"""A chat template rendered by phi-api itself, for what ONNX Runtime GenAI's template call cannot pass: the
variables a template reads besides the conversation (``chat_template_kwargs``, such as Qwen3's
``enable_thinking``).

Templates come from model folders, and the variables from clients: they run in Jinja2's immutable sandbox
(no attribute or method that changes anything, nothing private), with the helpers Hugging Face's templates use
(``raise_exception``, ``strftime_now``, ``tojson`` with ``indent``, loop controls).
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from phi_api.errors import ChatTemplateError

# names the conversation itself fills; a client's variables may not replace them
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool, variables: dict[str, Any], tokens: dict[str, str]) -> str:
    """``template`` rendered for the conversation, with ``variables`` and the tokenizer's ``tokens``
    (``bos_token``, ``eos_token``); :class:`ChatTemplateError` when the template fails or refuses."""
    from jinja2 import TemplateError

    try:
        return _compiled(template).render(
            **variables, **tokens, messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)
    except TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from None


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """``template`` compiled in the sandbox, once per template (a model's, for every request that needs it);
    :class:`jinja2.TemplateError` when it does not parse."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, strftime_now=time.strftime)
    return environment.from_string(template)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def reads(template: str) -> frozenset[str]:
    """The variables ``template`` reads from outside (``tools``, ``enable_thinking``, ...); none when it does not
    parse (ONNX Runtime GenAI's own template engine will say why)."""
    from jinja2 import Environment, TemplateSyntaxError, meta

    try:
        return frozenset(meta.find_undeclared_variables(Environment(extensions=["jinja2.ext.loopcontrols"])
                                                        .parse(template)))
    except TemplateSyntaxError:
        return frozenset()


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
