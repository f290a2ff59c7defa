"""How a setting is declared (:func:`setting`) and how each kind of value is parsed and checked: a bad one raises
:class:`ConfigError` naming the setting."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

from phi_api.errors import ConfigError


def _integer(low: int, high: int | None = None) -> Callable[[str, Any], int]:
    def parse(name: str, raw: Any) -> int:
        try:
            value = int(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{name} must be an integer {bound}, got {raw!r}")
        return value

    return parse


def _number(low: float, high: float | None = None, *, exclusive_low: bool = False) -> Callable[[str, Any], float]:
    def parse(name: str, raw: Any) -> float:
        try:
            value = float(raw) if not isinstance(raw, bool) else float("nan")
        except (TypeError, ValueError):
            value = float("nan")
        below = value <= low if exclusive_low else value < low
        if math.isnan(value) or below or (high is not None and value > high) or value == float("inf"):
            above = "above" if exclusive_low else "at least"
            bound = f"between {low} and {high}" if high is not None else f"{above} {low}"
            raise ConfigError(f"{name} must be a number {bound}, got {raw!r}")
        return value

    return parse


def _stripped(name: str, raw: Any) -> str:
    """A free text (a path), without surrounding blanks."""
    return str(raw).strip()


def _database_url(name: str, raw: Any) -> str:
    """A PostgreSQL URL (``postgresql://user:password@host:port/database``), or "" (SQLite in DATA_DIR)."""
    value = str(raw).strip()
    if value and not value.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        raise ConfigError(f"{name} must be a postgresql:// URL (or empty for SQLite in DATA_DIR)")
    return value


def _boolean(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _text(*, choices: tuple[str, ...] = (), upper: bool = False) -> Callable[[str, Any], str]:
    def parse(name: str, raw: Any) -> str:
        value = str(raw).strip()
        if upper:
            value = value.upper()
        if not value:
            raise ConfigError(f"{name} must not be empty")
        if choices and value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


# The sampling fields a model may default (vLLM's --generation-config: the fields of generation_config.json), with
# the bounds the request schemas give them (schemas/sampling.json)
SAMPLING_FIELDS: dict[str, Callable[[str, Any], float]] = {
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0, exclusive_low=True),
    "top_k": _integer(-1, 1_000_000),
    "min_p": _number(0.0, 1.0),
    "repetition_penalty": _number(0.0, 2.0, exclusive_low=True),
    "repeat_last_n": _integer(-1, 1_000_000),  # the repetition penalty's window (Ollama's, llama.cpp's): -1 all, 0 off
    "presence_penalty": _number(-2.0, 2.0),
    "frequency_penalty": _number(-2.0, 2.0),
}


def sampling_values(name: str, values: Any) -> tuple[tuple[str, float], ...]:
    """Sampling defaults (an object of :data:`SAMPLING_FIELDS`), checked, as sorted pairs; ConfigError naming the
    first field that is not one or out of its bounds."""
    if not isinstance(values, dict):
        raise ConfigError(f"{name} must be a JSON object of sampling fields ({', '.join(SAMPLING_FIELDS)})")
    pairs = []
    for field, raw in values.items():
        if field not in SAMPLING_FIELDS:
            raise ConfigError(f"{name}: {field!r} is not a sampling field; these are: {', '.join(SAMPLING_FIELDS)}")
        pairs.append((field, SAMPLING_FIELDS[field](f"{name}.{field}", raw)))
    return tuple(sorted(pairs))


def _sampling(name: str, raw: Any) -> tuple[tuple[str, float], ...]:
    """Sampling defaults as a JSON object (the environment's text, or an object in MODELS_FILE's options)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise ConfigError(f"{name} must be a JSON object, such as {{\"temperature\": 0.6}}") from None
    if isinstance(raw, (tuple, list)):  # already parsed: pairs (a settings object's, the registry file's)
        try:
            raw = dict(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a JSON object of sampling fields") from None
    return sampling_values(name, raw)


def setting(default: Any, parse: Callable[[str, Any], Any], description: str, *, engine: str = "",
            per_model: bool = False, value: Callable[[Any], Any] | None = None) -> Any:
    """A setting's declaration: its default, the parser that checks a given value, and what it means.

    ``engine`` names the field of :class:`phi_api.engine.EngineConfig` the setting becomes (``value`` derives it
    from the settings when it is not the setting's own value); ``per_model`` lets a model set it for itself
    (``MODELS_FILE`` options, a load's options).
    """
    metadata = {"parse": parse, "description": description, "engine": engine, "per_model": per_model,
                "value": value}
    return dataclasses.field(default=default, metadata=metadata)
