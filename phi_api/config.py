"""Settings, in one place: defaults, then the environment, then explicit overrides.

Names follow the specification (``MODEL_PATH``, ``SERVER_PORT``, ...). Every
value is parsed and checked here; a bad one raises :class:`ConfigError` naming
the setting, and start-up stops with that message.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

DEFAULT_MODEL_PATH = (
    "/home/wan/Downloads/models/Phi-3.5-mini-instruct-onnx/cpu_and_mobile/cpu-int4-awq-block-128-acc-level-4"
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(ValueError):
    """A setting has a value the server cannot run with."""


@dataclass(frozen=True)
class Settings:
    """The server's settings; see the README's configuration table."""

    MODEL_PATH: str = DEFAULT_MODEL_PATH
    MODEL_ID: str = "phi-3.5-mini"
    SERVER_HOST: str = "0.0.0.0"
    SERVER_PORT: int = 8000
    WEB_CONCURRENCY: int = 1
    PRELOAD_MODEL: bool = True
    MAX_CONCURRENT_REQUESTS: int = 10
    DEFAULT_MAX_TOKENS: int = 1024
    DEFAULT_TEMPERATURE: float = 0.7
    GENERATION_TIMEOUT: float = 600.0
    REQUEST_READ_TIMEOUT: float = 30.0
    STREAM_WRITE_TIMEOUT: float = 1.0
    CORS_ORIGINS: str = "*"
    API_KEYS: str = ""
    MAX_REQUEST_SIZE_MB: float = 10.0
    LOG_LEVEL: str = "INFO"
    INTRA_OP_THREADS: int = 0
    KV_CACHE_MB: float = 0.0
    MAX_BATCH_ROWS: int = 32
    PREFILL_CHUNK_TOKENS: int = 64
    PROMPT_CACHE_MB: float = 256.0

    @property
    def cors_origins(self) -> list[str] | str:
        """``CORS_ORIGINS`` as flask-cors wants it: ``"*"`` or a list of origins."""
        origins = [origin.strip() for origin in self.CORS_ORIGINS.split(",") if origin.strip()]
        return "*" if origins == ["*"] else origins

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The accepted API keys (``API_KEYS``, comma-separated); none means authentication is off."""
        return tuple(key.strip() for key in self.API_KEYS.split(",") if key.strip())

    @property
    def max_request_bytes(self) -> int:
        """``MAX_REQUEST_SIZE_MB`` in bytes."""
        return int(self.MAX_REQUEST_SIZE_MB * 1024 * 1024)

    @property
    def workers(self) -> int:
        """gunicorn workers (``WEB_CONCURRENCY``)."""
        return self.WEB_CONCURRENCY

    @property
    def _cores_per_worker(self) -> int:
        return max(1, (os.cpu_count() or 1) // self.workers)

    @property
    def intra_op_threads(self) -> int:
        """ONNX Runtime threads each worker's engine computes a step with: the worker's share of the cores.

        Each worker's engine thread makes its own session after the fork (a
        session inherited through the fork computes on one thread), on the
        host's prepacked model file, whose weights all workers share.
        """
        return self.INTRA_OP_THREADS or self._cores_per_worker

    @property
    def kv_budget_bytes(self) -> int:
        """Key/value memory each worker's running generations may hold (``KV_CACHE_MB``; 0: a quarter of the
        machine's memory, split between the workers)."""
        if self.KV_CACHE_MB:
            return int(self.KV_CACHE_MB * 2**20)
        return _memory_bytes() // 4 // self.workers


def _memory_bytes() -> int:
    """The machine's memory (MemTotal), or 8 GiB when it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 8 * 2**30


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
        if value != value or below or (high is not None and value > high) or value == float("inf"):
            bound = f"between {low} and {high}" if high is not None else f"{'above' if exclusive_low else 'at least'} {low}"
            raise ConfigError(f"{name} must be a number {bound}, got {raw!r}")
        return value

    return parse


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


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "MODEL_PATH": _text(),
    "MODEL_ID": _text(),
    "SERVER_HOST": _text(),
    "SERVER_PORT": _integer(1, 65535),
    "WEB_CONCURRENCY": _integer(1, 64),
    "PRELOAD_MODEL": _boolean,
    "MAX_CONCURRENT_REQUESTS": _integer(1, 10_000),
    "DEFAULT_MAX_TOKENS": _integer(1, 1_000_000),
    "DEFAULT_TEMPERATURE": _number(0.0, 2.0),
    "GENERATION_TIMEOUT": _number(0.0, exclusive_low=True),
    "REQUEST_READ_TIMEOUT": _number(0.0, exclusive_low=True),
    "STREAM_WRITE_TIMEOUT": _number(0.0, exclusive_low=True),
    "CORS_ORIGINS": _text(),
    "API_KEYS": lambda name, raw: str(raw),
    "MAX_REQUEST_SIZE_MB": _number(0.0, 1024.0, exclusive_low=True),
    "LOG_LEVEL": _text(choices=LOG_LEVELS, upper=True),
    "INTRA_OP_THREADS": _integer(0, 256),
    "KV_CACHE_MB": _number(0.0, 10_000_000.0),
    "MAX_BATCH_ROWS": _integer(1, 1024),
    "PREFILL_CHUNK_TOKENS": _integer(1, 1_000_000),
    "PROMPT_CACHE_MB": _number(0.0, 1_000_000.0),
}

SETTING_NAMES = tuple(field.name for field in dataclasses.fields(Settings))


def load_settings(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build :class:`Settings` from defaults, then ``environ``, then ``overrides``.

    Keys of ``overrides`` that are not settings are ignored here (Flask keeps
    them in ``app.config``). Raises :class:`ConfigError` on the first bad value.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name in SETTING_NAMES:
        if overrides is not None and name in overrides:
            values[name] = _PARSERS[name](name, overrides[name])
        elif environ.get(name, "").strip():
            values[name] = _PARSERS[name](name, environ[name])
    return Settings(**values)
