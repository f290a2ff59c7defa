"""Request validation against the JSON Schema files in ``schemas/`` (Draft 2020-12).

The files are read and compiled once, when the app is created. A failed
validation becomes exactly one error of the specification's table:

- a missing top-level field: ``missing_parameter`` with that field as ``param``;
- anything wrong inside ``messages``: ``invalid_messages``;
- any other bad value: ``invalid_parameter`` with the top-level field as ``param``.

``integer`` is strict: ``8.0`` is refused where an integer belongs, as
OpenAI refuses it.

A body may be as large as ``MAX_REQUEST_SIZE_MB`` allows, so finding what is wrong with it must cost in proportion to
the few errors reported, not to the body: at most :data:`ERRORS_KEPT` errors are drawn from the validator (and from
each branch of an ``anyOf``/``oneOf``), and an array longer than its ``maxItems`` is refused without its items being
checked.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

from phi_api.engine.threads.native import off_hub
from phi_api.errors import APIError, InvalidMessagesError, InvalidParameterError, MissingParameterError


def schema_dir() -> Path:
    """The JSON Schemas: installed, the package ``phi_api.schemas`` (setup.py puts them there); in a checkout, the
    top-level ``schemas/`` folder."""
    installed = importlib.util.find_spec("phi_api.schemas")  # a folder of data files: a namespace package
    if installed is not None and installed.submodule_search_locations:
        return Path(next(iter(installed.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "schemas"


SCHEMA_DIR = schema_dir()
REQUEST_SCHEMAS = {
    "chat_completion": "chat_completion.json",
    "completion": "completion.json",
    "embeddings": "embeddings.json",
    "rerank": "rerank.json",
    "score": "score.json",
    "ollama_generate": "ollama_generate.json",
    "ollama_chat": "ollama_chat.json",
    "ollama_show": "ollama_show.json",
    "ollama_embed": "ollama_embed.json",
    "ollama_embeddings": "ollama_embeddings.json",
    "bench": "bench.json",
    "tokenize": "tokenize.json",
    "detokenize": "detokenize.json",
    "model_load": "model_load.json",
    "model_unload": "model_unload.json",
    "openarc_load": "openarc_load.json",
    "openarc_unload": "openarc_unload.json",
    "ollama_delete": "ollama_delete.json",
    "responses": "responses.json",
    "messages": "messages.json",
    "messages_count_tokens": "messages_count_tokens.json",
    "batch_create": "batch_create.json",
    "conversation_create": "conversation_create.json",
    "conversation_update": "conversation_update.json",
    "conversation_items": "conversation_items.json",
    "ollama_pull": "ollama_pull.json",
    "infill": "infill.json",
}

_JSON_TYPES = {
    dict: "an object", list: "an array", str: "a string", bool: "a boolean",
    int: "an integer", float: "a number", type(None): "null",
}


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 8.0 as an integer; OpenAI does not, and the engine must not see floats.
    return isinstance(instance, int) and not isinstance(instance, bool)


ERRORS_KEPT = 32  # far more than an ordinary body has, so its reported error is the one all of them would give
_ITEMS = Draft202012Validator.VALIDATORS["items"]


# jsonschema's own messages for the keywords below hold repr() of the value, which costs as much as the value is
# large (a second for a 10 MB array), even where the error is then dropped (a failed anyOf branch): these name no
# value. The messages a client reads are worded by to_api_error.

def _keyword_type(validator: Any, types: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not any(validator.is_type(instance, kind) for kind in (types if isinstance(types, list) else [types])):
        yield ValidationError(f"is not of type {types!r}")


def _keyword_max_items(validator: Any, most: int, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "array") and len(instance) > most:
        yield ValidationError(f"has more than {most} items")


def _keyword_items(validator: Any, items: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    # An array past its maxItems is refused for that (the maxItems keyword reports it): checking each of its items
    # as well would cost time in proportion to a body already refused.
    if not (validator.is_type(instance, "array") and len(instance) > schema.get("maxItems", len(instance))):
        yield from _ITEMS(validator, items, instance, schema)


def _branch_errors(validator: Any, instance: Any, branches: list[Any]) -> tuple[list[ValidationError], int | None]:
    """The errors of the branches before the first one ``instance`` matches (its index; None if none does), at most
    :data:`ERRORS_KEPT` of each: jsonschema keeps them all, one per item of an array that fails a branch."""
    found: list[ValidationError] = []
    for index, branch in enumerate(branches):
        errors = list(islice(validator.descend(instance, branch, schema_path=index), ERRORS_KEPT))
        if not errors:
            return found, index
        found.extend(errors)
    return found, None


def _keyword_any_of(validator: Any, branches: list[Any], instance: Any,
                    schema: dict[str, Any]) -> Iterator[ValidationError]:
    found, matched = _branch_errors(validator, instance, branches)
    if matched is None:
        yield ValidationError("is not valid under any of the given schemas", context=found)


def _keyword_one_of(validator: Any, branches: list[Any], instance: Any,
                    schema: dict[str, Any]) -> Iterator[ValidationError]:
    found, matched = _branch_errors(validator, instance, branches)
    if matched is None:
        yield ValidationError("is not valid under any of the given schemas", context=found)
    elif any(validator.evolve(schema=branch).is_valid(instance) for branch in branches[matched + 1:]):
        yield ValidationError("is valid under more than one of the given schemas")


StrictValidator = validators.extend(
    Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
    validators={"type": _keyword_type, "maxItems": _keyword_max_items, "items": _keyword_items,
                "anyOf": _keyword_any_of, "oneOf": _keyword_one_of})


class RequestValidator:
    """Compiled validators for every request schema."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        resources = []
        for path in sorted(schema_dir.glob("*.json")):
            contents = json.loads(path.read_text(encoding="utf-8"))
            resources.append((contents["$id"], Resource.from_contents(contents)))
        registry = Registry().with_resources(resources)
        self._schemas: dict[str, dict[str, Any]] = {}
        self._validators: dict[str, Any] = {}
        for name, filename in REQUEST_SCHEMAS.items():
            schema = json.loads((schema_dir / filename).read_text(encoding="utf-8"))
            Draft202012Validator.check_schema(schema)
            self._schemas[name] = schema
            self._validators[name] = StrictValidator(schema, registry=registry)

    def known_fields(self, name: str) -> set[str]:
        """The top-level fields schema ``name`` describes."""
        return set(self._schemas[name].get("properties", {}))

    def validate(self, name: str, body: Any) -> None:
        """Raise the one :class:`~phi_api.errors.APIError` that describes what is wrong with ``body``. Checked on a
        pooled thread: a large valid body takes seconds of pure Python (a 10 MB prompt of token ids ~20 s), during
        which the hub, which gets the interpreter's lock back every switch interval, keeps serving the worker's
        other streams (and its heartbeat to gunicorn)."""
        errors = off_hub(self._errors, name, body)
        if errors:
            raise to_api_error(_most_relevant(errors))

    def _errors(self, name: str, body: Any) -> list[ValidationError]:
        return list(islice(self._validators[name].iter_errors(body), ERRORS_KEPT))


def _most_relevant(errors: list[ValidationError]) -> ValidationError:
    """A missing top-level field first; otherwise jsonschema's best match."""
    for error in errors:
        if error.validator == "required" and not error.absolute_path:
            return error
    return best_match(errors)


def to_api_error(error: ValidationError) -> APIError:
    """The error-table row for one schema violation."""
    path = list(error.absolute_path)
    if error.validator == "required" and not path:
        missing = next(name for name in error.validator_value if name not in error.instance)
        return MissingParameterError(f"Missing required parameter: '{missing}'.", param=missing)
    where = _location(path)
    message = _MESSAGES.get(str(error.validator), _generic)(where, error)
    if path and path[0] == "messages":
        return InvalidMessagesError(message)
    return InvalidParameterError(message, param=str(path[0]) if path else None)


def _location(path: list[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "the request body"


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _range(where: str, error: ValidationError) -> str:
    schema = error.schema
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is not None and high is not None:
        return f"{where} must be between {low} and {high}, got {_describe(error.instance)}"
    if low is not None:
        bound = "greater than" if "exclusiveMinimum" in schema else "at least"
        return f"{where} must be {bound} {low}, got {_describe(error.instance)}"
    return f"{where} must be at most {high}, got {_describe(error.instance)}"


def _type(where: str, error: ValidationError) -> str:
    expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    names = " or ".join(name for name in expected if name != "null")
    actual = _JSON_TYPES.get(type(error.instance), "another type")
    return f"{where} must be {names or 'null'}, got {actual}"


def _enum(where: str, error: ValidationError) -> str:
    allowed = ", ".join(_describe(value) for value in error.validator_value if value is not None)
    return f"{where} must be one of {allowed}, got {_describe(error.instance)}"


def _const(where: str, error: ValidationError) -> str:
    return f"{where} must be {_describe(error.validator_value)}, got {_describe(error.instance)}"


def _required(where: str, error: ValidationError) -> str:
    missing = next((name for name in error.validator_value if name not in error.instance), "a field")
    return f"{where}.{missing} is required"


def _items(where: str, error: ValidationError) -> str:
    if error.validator == "minItems":
        return f"{where} must have at least {error.validator_value} item(s)"
    return f"{where} must have at most {error.validator_value} items"


def _length(where: str, error: ValidationError) -> str:
    if error.validator == "minLength":
        return f"{where} must not be shorter than {error.validator_value} character(s)"
    return f"{where} must be at most {error.validator_value} characters long"


def _properties(where: str, error: ValidationError) -> str:
    return f"{where} must have at most {error.validator_value} entries"


def _pattern(where: str, error: ValidationError) -> str:
    if "propertyNames" in error.schema_path:
        return f"{where} has an invalid key {_describe(error.instance)}"
    return f"{where} has an invalid format: {_describe(error.instance)}"


def _additional(where: str, error: ValidationError) -> str:
    known = error.schema.get("properties", {})
    unknown = next((name for name in error.instance if name not in known), "a field")
    return f"{where} has no field {_describe(unknown)} (it takes {', '.join(sorted(known)) or 'none'})"


def _generic(where: str, error: ValidationError) -> str:
    return f"{where} is not valid"


_MESSAGES: dict[str, Callable[[str, ValidationError], str]] = {
    "minimum": _range, "maximum": _range, "exclusiveMinimum": _range, "exclusiveMaximum": _range,
    "type": _type,
    "enum": _enum,
    "additionalProperties": _additional,
    "const": _const,
    "required": _required,
    "minItems": _items, "maxItems": _items,
    "minLength": _length, "maxLength": _length,
    "maxProperties": _properties,
    "pattern": _pattern,
}
