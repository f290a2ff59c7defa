"""Settings, in one place: defaults, then the environment, then explicit overrides (declared in
:mod:`phi_api.settings.declared`, their values parsed by :mod:`phi_api.settings.parsing`).

Names follow the specification (``MODEL_PATH``, ``SERVER_PORT``, ...). Every
value is parsed and checked here; a bad one raises :class:`ConfigError` naming
the setting, and start-up stops with that message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from phi_api.errors import ConfigError
from phi_api.settings.declared import LOG_LEVELS, REASONING_PARSERS, TOOL_PARSERS, Declared

__all__ = ["LOG_LEVELS", "REASONING_PARSERS", "SETTING_NAMES", "TOOL_PARSERS", "ConfigError", "Settings",
           "cache_root", "describe", "engine_values", "load_settings", "parse_option"]


class Settings(Declared):
    """The server's settings (see :class:`Declared`), and what derives from them."""

    @property
    def cors_origins(self) -> list[str] | str:
        """``CORS_ORIGINS`` as flask-cors wants it: ``"*"`` (any origin, never with credentials) or a list of origins
        named (those alone get credentials); a ``*`` among names means any."""
        origins = [origin.strip() for origin in self.CORS_ORIGINS.split(",") if origin.strip()]
        return "*" if "*" in origins else origins

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
    def memory_limit_bytes(self) -> int:
        """The whole server's memory (``MEMORY_LIMIT_MB``; 0: three quarters of the machine's or container's)."""
        if self.MEMORY_LIMIT_MB:
            return int(self.MEMORY_LIMIT_MB * 2**20)
        return int(_memory_bytes() * 0.75)  # the rest: the system, the page cache, the VM's other services

    @property
    def prefix_disk_dir(self) -> str:
        """The disk tier's folder ("" when ``PREFIX_CACHE_DISK_MB`` is 0 or ``PREFIX_CACHE`` off)."""
        if not self.PREFIX_CACHE_DISK_MB or self.PREFIX_CACHE == "off":
            return ""
        if self.PREFIX_CACHE_DIR:
            return str(Path(self.PREFIX_CACHE_DIR).expanduser())
        return str(cache_root() / "prefixes")

    @property
    def data_dir(self) -> Path:
        """The folder of what must last (``DATA_DIR``; default ``data/`` in the cache folder)."""
        return Path(self.DATA_DIR).expanduser() if self.DATA_DIR else cache_root() / "data"

    @property
    def batch_dir(self) -> Path:
        """The Batch API's folder (``BATCH_DIR``; default ``batches/`` in the data folder)."""
        return Path(self.BATCH_DIR).expanduser() if self.BATCH_DIR else self.data_dir / "batches"

    @property
    def kv_budget_bytes(self) -> int:
        """Key/value memory one model may hold in one worker at most (``KV_CACHE_MB``; 0: no cap of its own, the
        worker's share of the memory limit bounds it)."""
        if self.KV_CACHE_MB:
            return int(self.KV_CACHE_MB * 2**20)
        return self.memory_limit_bytes


def _memory_bytes() -> int:
    """The memory this server may use: the machine's (MemTotal), or its container's limit when lower (cgroup
    v2 ``memory.max``, v1 ``memory.limit_in_bytes``); 8 GiB when neither can be read."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            found += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:")]
    except (OSError, ValueError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit, encoding="ascii") as text:
                found.append(int(text.read().strip()))  # "max" (no limit) does not parse: skipped
        except (OSError, ValueError):
            pass
    return min(found) if found else 8 * 2**30


def cache_root() -> Path:
    """Where prepared models live: ``PHI_API_CACHE_DIR``, else the XDG cache."""
    explicit = os.environ.get("PHI_API_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "phi-api"


SETTING_NAMES = tuple(field.name for field in dataclasses.fields(Settings))
_PARSERS: dict[str, Callable[[str, Any], Any]] = {field.name: field.metadata["parse"]
                                                  for field in dataclasses.fields(Settings)}


# Settings a model may set for itself (models.json options, a load's options): its engine's.
ENGINE_OPTIONS = tuple(field.name for field in dataclasses.fields(Settings) if field.metadata["per_model"])
# Settings that are gone, and what replaced them: a deployment that still sets one is told, not ignored.
REPLACED = {"PROMPT_CACHE_MB": "kept prompts now share the KV_CACHE_MB budget; PREFIX_CACHE=off turns reuse off"}


def parse_option(name: str, raw: Any) -> Any:
    """One model's engine option, checked like the setting of that name."""
    if name in REPLACED:
        raise ConfigError(f"{name} is no longer a setting: {REPLACED[name]}")
    if name not in ENGINE_OPTIONS:
        raise ConfigError(f"{name} is not a model option; these are: {', '.join(ENGINE_OPTIONS)}")
    return _PARSERS[name](name, raw)


def describe() -> dict[str, str]:
    """Every setting's description (for documentation and its test)."""
    return {field.name: field.metadata["description"] for field in dataclasses.fields(Settings)}


def load_settings(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build :class:`Settings` from defaults, then ``environ``, then ``overrides``.

    Keys of ``overrides`` that are not settings are ignored here (Flask keeps
    them in ``app.config``). Raises :class:`ConfigError` on the first bad value.
    """
    environ = os.environ if environ is None else environ
    for name, replacement in REPLACED.items():
        if environ.get(name, "").strip() or (overrides is not None and name in overrides):
            raise ConfigError(f"{name} is no longer a setting: {replacement}")
    values: dict[str, Any] = {}
    for name in SETTING_NAMES:
        if overrides is not None and name in overrides:
            values[name] = _PARSERS[name](name, overrides[name])
        elif environ.get(name, "").strip():
            values[name] = _PARSERS[name](name, environ[name])
    return Settings(**values)


def engine_values(settings: Settings) -> dict[str, Any]:
    """The engine's configuration fields, from the settings that declare one (``engine=`` in their declaration)."""
    values = {}
    for field in dataclasses.fields(Settings):
        if field.metadata["engine"]:
            derive = field.metadata["value"]
            values[field.metadata["engine"]] = derive(settings) if derive else getattr(settings, field.name)
    return values
