"""Function calling: tools into the prompt, grammars for forced calls, tool calls out of the answer.

- ``tool_choice`` ``none``: the tools are left out and the model just answers.
- ``auto`` (the default when tools are given): the model sees the tools and
  may call one; its answer is searched for calls, in the model family's
  native form (``<tool_call>{...}</tool_call>``) or as a bare JSON object with
  ``name`` and ``arguments`` (the convention of seed 003).
- ``required``, or a named function: the output is constrained by a JSON
  Schema grammar to a call of one of those functions, so its arguments
  always validate against the function's parameter schema.

A chat template that knows about tools renders them itself; for one that
does not, the tools and the calling convention go into a system message,
and earlier tool calls and results into plain turns the template knows.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from phi_api import jsontext
from phi_api.engine.threads.native import off_hub
from phi_api.errors import InvalidFunctionParametersError, InvalidParameterError
from phi_api.service.grammar import check_json_schema, json_schema_grammar, strict_violation
from phi_api.service.tool_formats import FORMATS, ToolFormat

# The forced-call grammar writes {"name": "<function>", "arguments": {...}} in this order.
_NAME = re.compile(r'^\s*\{\s*"name"\s*:\s*"([^"\\]*)"')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A call the model made."""

    name: str
    arguments: str  # JSON text, as OpenAI sends it (as far as it got, for a call cut short)
    id: str
    value: Any = None  # the arguments as an object (None for a call cut short), as Ollama sends them

    @property
    def arguments_object(self) -> Any:
        """The arguments as an object ({} for a call cut short)."""
        return self.value if self.value is not None else {}

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools mean for its prompt, its grammar and its answer."""

    functions: tuple[dict[str, Any], ...]  # the "function" objects of the request's tools
    forced: tuple[str, ...]  # names the answer must call (required / named); empty for auto
    parallel: bool
    format: ToolFormat = FORMATS["generic"]  # how the model writes calls (set when its model is known)

    @property
    def names(self) -> set[str]:
        return {function["name"] for function in self.functions}

    def grammar(self) -> tuple[str, str] | None:
        """The grammar that forces a call, in the model family's own shape (its JSON between the family's
        markers), or None for auto; 400 naming the tool whose parameters are not a schema the grammar can be built
        from."""
        if not self.forced:
            return None
        options = []
        for index, function in enumerate(self.functions):
            if function["name"] in self.forced:
                schema = _call_schema(function, self.format.arguments_key)
                check_json_schema(schema, f"tools[{index}].function.parameters")
                options.append(schema)
        kind, schema_text = json_schema_grammar(options[0] if len(options) == 1 else {"anyOf": options}, "tools")
        before, after = self.format.forced
        if not before and not after:
            return kind, schema_text
        lark = f"start: {json.dumps(before)} call {json.dumps(after)}\ncall: %json {schema_text}"
        return "llguidance", LLMatcher.grammar_from_lark(lark)

    def system_prompt(self) -> str:
        """The tools and the calling convention, for templates that cannot render tools: an example call of the
        first tool with a value of the right type for each required argument (a small model copies placeholders
        such as ``<function name>`` into its call and never finishes it)."""
        specs = json.dumps([{"name": f["name"], "description": f.get("description", ""),
                             "parameters": f.get("parameters", {"type": "object", "properties": {}})}
                            for f in self.functions], ensure_ascii=False)
        first = self.functions[0]
        example = json.dumps({"name": first["name"], "arguments": example_arguments(first.get("parameters") or {})},
                             ensure_ascii=False)
        return "You can call these functions:\n" + specs + "\nTo call one, answer with only JSON like: " + example

    def parse(self, text: str) -> list[ToolCall]:
        """The calls to known functions in ``text`` (only the first unless parallel calls are allowed)."""
        return self.split(text)[1]

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """``text`` as the answer's own text (markup out) and its calls to known functions, in the model's format
        (a forced call, written by the grammar as bare JSON, in any)."""
        content, found = self.format.split(text)
        if not found and self.forced:
            content, found = FORMATS["generic"].split(text)
        calls = []
        for call in found:
            name, arguments = call["name"], call["arguments"]
            if name not in self.names:
                continue
            if isinstance(arguments, str):
                try:
                    arguments = jsontext.loads(arguments)
                except (ValueError, RecursionError):
                    continue
            calls.append(ToolCall(name, json.dumps(arguments, ensure_ascii=False), new_call_id(), arguments))
        return content, calls if self.parallel else calls[:1]

    @property
    def finds_calls_anywhere(self) -> bool:
        """Whether a call may start anywhere in the answer (a format with an opening marker) rather than only at
        its start."""
        return bool(self.format.open)

    def could_start(self, text: str) -> bool:
        """Whether an answer beginning with ``text`` may turn out to be a call (auto mode, streaming)."""
        head = text.lstrip()
        starts = ["[" if self.format.body == "pythonic" else "{", _TAG_OPEN, self.format.open]
        return not head or any(start and (head.startswith(start) or start.startswith(head)) for start in starts)


    def partial_call(self, text: str) -> ToolCall | None:
        """A forced call cut short (``max_tokens``): its name and the arguments written so far, as OpenAI
        returns them; None when not even the function is known yet."""
        if not self.forced or not text:
            return None
        text = text.lstrip().removeprefix(self.format.forced[0])  # the family's markers before the JSON
        named = _NAME.search(text)
        name = named.group(1) if named else (self.forced[0] if len(self.forced) == 1 else None)
        if name not in self.forced:
            return None
        arguments = _ARGUMENTS.search(text)
        return ToolCall(name, text[arguments.end():] if arguments else "", new_call_id())


_EXAMPLES = {"string": "text", "integer": 1, "number": 1.5, "boolean": True, "null": None}


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """A value of the right type for each required argument of a function's ``parameters`` schema."""
    found = schema.get("properties")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    listed = schema.get("required")
    required = dict.fromkeys(name for name in listed if isinstance(name, str)) if isinstance(listed, list) else {}
    # (once each: a name listed K times at each of D levels made K**D values)
    return {name: example_value(properties.get(name), name) for name in required}


def example_value(schema: Any, name: str = "") -> Any:
    """A plausible value of ``schema``: its own example, default or first choice, else one of its type (a string
    says what it holds: its property's name)."""
    if not isinstance(schema, dict):
        return name.replace("_", " ") or "text"
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    if "default" in schema or "const" in schema:
        return schema.get("const", schema.get("default"))
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "array":
        return [example_value(schema.get("items"), name)]
    if kind == "object":
        return example_arguments(schema)
    if kind == "string" or kind not in _EXAMPLES:
        return name.replace("_", " ") or "text"
    return _EXAMPLES[kind]


def new_call_id() -> str:
    """OpenAI's form of tool call ids."""
    return "call_" + secrets.token_hex(12)


def _call_schema(function: dict[str, Any], arguments_key: str = "arguments") -> dict[str, Any]:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def tool_plan(tools: list[dict[str, Any]], tool_choice: Any = None, parallel: bool = True) -> ToolPlan | None:
    """The plan for a validated chat request's ``tools`` and ``tool_choice`` (None: not given); None when no
    tool is in play."""
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    if choice == "none" or not tools:
        if isinstance(choice, dict) or choice == "required":
            raise InvalidParameterError("tool_choice needs tools.", param="tool_choice")
        return None
    functions = tuple(tool["function"] for tool in tools)
    for function in functions:
        violation = off_hub(strict_violation, function.get("parameters") or {}) if function.get("strict") else None
        if violation:
            raise InvalidFunctionParametersError(f"Invalid schema for function '{function['name']}': {violation}",
                                                 param="tools")
    names = [function["name"] for function in functions]
    if len(set(names)) != len(names):
        raise InvalidParameterError("tools must have distinct function names.", param="tools")
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        if name not in names:
            raise InvalidParameterError(f"tool_choice names '{name}', which is not among the tools.",
                                        param="tool_choice")
        forced: tuple[str, ...] = (name,)
    else:
        forced = tuple(names) if choice == "required" else ()
    return ToolPlan(functions, forced, parallel)


def template_messages(messages: list[dict[str, Any]], plan: ToolPlan | None, template_knows_tools: bool
                      ) -> list[dict[str, Any]]:
    """Messages as the chat template should see them, tool turns included."""
    if template_knows_tools:
        # Templates that render tool calls expect the arguments as objects, not JSON text.
        rendered = [{**m, "tool_calls": [{**call, "function": {**call["function"],
                                                               "arguments": _arguments(call["function"]["arguments"])}}
                                         for call in m["tool_calls"]]} if m.get("tool_calls") else m
                    for m in messages]
        return _tools_in_system(rendered, plan) if plan is not None and plan.format.tools_in_system else rendered
    rendered = []
    if plan is not None:
        rendered.append({"role": "system", "content": plan.system_prompt()})
    for message in messages:
        if message["role"] == "tool":
            rendered.append({"role": "user",
                             "content": f"Result of tool call {message.get('tool_call_id', '')}: {message['content']}"})
        elif message.get("tool_calls"):
            calls = [json.dumps({"name": call["function"]["name"],
                                 "arguments": _arguments(call["function"]["arguments"])}, ensure_ascii=False)
                     for call in message["tool_calls"]]
            text = message.get("content") or ""
            rendered.append({"role": "assistant", "content": "\n".join(([text] if text else []) + calls)})
        else:
            rendered.append(message)
    return _merge_systems(rendered)


def _tools_in_system(messages: list[dict[str, Any]], plan: ToolPlan) -> list[dict[str, Any]]:
    """The tools as Phi-4-mini's template reads them: JSON text in the system message's ``tools`` (one is added)."""
    system = next((m for m in messages if m["role"] == "system"), {"role": "system", "content": ""})
    with_tools = {**system, "tools": json.dumps(list(plan.functions), ensure_ascii=False)}
    return [with_tools] + [m for m in messages if m is not system]


def _arguments(arguments: Any) -> Any:
    """A call's arguments as an object: OpenAI sends JSON text, Ollama the object itself."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return jsontext.loads(arguments)
    except (ValueError, RecursionError):
        return arguments


def _merge_systems(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One leading system message (several confuse many templates)."""
    systems = [m["content"] for m in messages if m["role"] == "system"]
    others = [m for m in messages if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(systems)}] if systems else []) + others
