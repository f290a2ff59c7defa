"""How each model family writes tool calls, and how calls come out of its answers.

- ``generic`` (models without a known format, the default model among them): a JSON object with ``name`` and
  ``arguments`` (or ``parameters``), bare or in ``<tool_call>`` tags, recognised while streaming only when the
  answer starts with it.
- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>{...}</tool_call>`` blocks.
- ``phi4_mini``: ``<|tool_call|>[{...}]<|/tool_call|>``.
- ``mistral``: ``[TOOL_CALLS]`` and a JSON list of calls, or ``name[ARGS]{...}`` as newer tokenizers write them.
- ``llama3_json`` (Llama 3.1 to 3.3): ``{"name": ..., "parameters": {...}}``, after ``<|python_tag|>`` or at the start.
- ``pythonic`` (Llama 3.2's and 4's other convention): ``[get_weather(city="Paris"), ...]`` at the start.

With an opening marker, a call is found wherever it starts, and the text around the blocks stays the answer's
text; the markup never does. A format is chosen by the model folder (its tokenizer's added tokens, its template),
or by ``TOOL_PARSER`` (per model in ``MODELS_FILE``).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from phi_api.jsontext import too_deep

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolFormat:
    """A family's way of writing calls: the markers around them ("": none) and how their body reads."""

    name: str
    open: str = ""  # the text that opens calls; "": calls are recognised only at the start of the answer
    close: str = ""  # the text that closes a block; "": the calls run to the end of the answer
    body: str = "json"  # json, mistral or pythonic
    tools_in_system: bool = False  # the template reads the tools from the system message (Phi-4-mini's)
    forced: tuple[str, str] = ("", "")  # the text a forced call's JSON is written between, in this family
    arguments_key: str = "arguments"  # the key of a call's arguments (Llama 3's: parameters)

    def split(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The answer's own text (the markup taken out) and the calls written in ``text``, as ``name`` and
        ``arguments`` objects (arguments still as written: an object, or JSON text)."""
        if self.open and self.open in text:
            return self._blocks(text)
        if self.body == "pythonic":
            calls = _pythonic(text.strip())
            return ("", calls) if calls else (text, [])
        calls = [call for found in _json_objects(text) if (call := _call(found)) is not None]
        return ("", calls) if calls else (text, [])

    def may_open(self, text: str) -> bool:
        """Whether ``text`` (not yet told) holds this format's opening marker, or ends with the start of it."""
        if not self.open:
            return False
        if self.open in text:
            return True
        return any(text.endswith(self.open[:size]) for size in range(1, len(self.open)))

    def _blocks(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        content, calls, rest = [], [], text
        while self.open in rest:
            before, _, rest = rest.partition(self.open)
            content.append(before)
            body, closed, after = rest.partition(self.close) if self.close else (rest, "", "")
            calls += self._body(body)
            rest = after if closed else ""
        content.append(rest)
        return "".join(content).strip(), calls

    def _body(self, body: str) -> list[dict[str, Any]]:
        if self.body == "mistral" and "[ARGS]" in body:
            return _mistral_args(body)
        if self.body == "pythonic":
            return _pythonic(body.strip())
        return [call for found in _json_objects(body) if (call := _call(found)) is not None]


FORMATS = {fmt.name: fmt for fmt in (
    ToolFormat("generic"),
    ToolFormat("hermes", "<tool_call>", "</tool_call>", forced=("<tool_call>\n", "\n</tool_call>")),
    ToolFormat("phi4_mini", "<|tool_call|>", "<|/tool_call|>", tools_in_system=True,
               forced=("<|tool_call|>[", "]<|/tool_call|>")),
    ToolFormat("mistral", "[TOOL_CALLS]", body="mistral", forced=("[TOOL_CALLS][", "]")),
    ToolFormat("llama3_json", "<|python_tag|>", arguments_key="parameters"),
    ToolFormat("pythonic", body="pythonic"),
)}


def detect(added_tokens: AbstractSet[str], template: str) -> str:
    """The format a model folder says its model writes: by its tokenizer's markers, else its template's words."""
    for marker, name in (("<|tool_call|>", "phi4_mini"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"),
                         ("<tool_call>", "hermes")):
        if marker in added_tokens or marker in template:
            return name
    return "generic"


def _call(found: dict[str, Any]) -> dict[str, Any] | None:
    """A call written as JSON: ``name`` with ``arguments`` (or ``parameters``), or OpenAI's nested ``function``."""
    if isinstance(found.get("function"), dict):
        found = found["function"]
    name, arguments = found.get("name"), found.get("arguments", found.get("parameters"))
    return {"name": name, "arguments": arguments} if isinstance(name, str) and arguments is not None else None


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object in ``text`` (those inside a JSON list too), in order."""
    found: list[dict[str, Any]] = []
    position = 0
    while (start := min((index for index in (text.find("{", position), text.find("[", position)) if index >= 0),
                        default=-1)) >= 0:
        try:
            value, position = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):  # not JSON here, or brackets nested past the decoder's depth
            position = start + 1
            continue
        if too_deep(value):  # deeper than any call's arguments, and than the answer's encoder could write
            continue
        items = value if isinstance(value, list) else [value]
        found += [item for item in items if isinstance(item, dict)]
    return found


def _mistral_args(body: str) -> list[dict[str, Any]]:
    """Newer Mistral calls: ``name[ARGS]{...}``, one after another."""
    calls = []
    for part in body.split("[TOOL_CALLS]"):
        name, _, arguments = part.partition("[ARGS]")
        try:
            value, _ = _DECODER.raw_decode(arguments.strip())
        except (ValueError, RecursionError):
            continue
        if name.strip():
            calls.append({"name": name.strip(), "arguments": value})
    return calls


def _pythonic(text: str) -> list[dict[str, Any]]:
    """``[f(a=1), g(b="x")]``: calls with keyword arguments of literal values only (nothing is run)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return []
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            return []
        try:
            arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords if keyword.arg}
        except ValueError:
            return []
        calls.append({"name": node.func.id, "arguments": arguments})
    return calls
