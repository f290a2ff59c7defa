"""Settings, in one place: defaults, then the environment, then explicit overrides.

Names follow the specification (``MODEL_PATH``, ``SERVER_PORT``, ...). Every
value is parsed and checked here; a bad one raises :class:`ConfigError` naming
the setting, and start-up stops with that message.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phi_api.errors import ConfigError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# how a model writes tool calls (phi_api.service.tool_formats.FORMATS, and auto: what its folder says)
TOOL_PARSERS = ("auto", "generic", "hermes", "phi4_mini", "mistral", "llama3_json", "pythonic")
# how a model's thinking is told apart (phi_api.service.reasoning.thinking_markers)
REASONING_PARSERS = ("auto", "think", "none")


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


@dataclass(frozen=True)
class Settings:
    """The server's settings; see the README's configuration table.

    Each is declared once, with its default, its parser (which checks its
    bounds) and its description: a new setting is one line here.
    """

    MODEL_PATH: str = setting("", _stripped, "ONNX Runtime GenAI model folder to serve (or MODEL, or MODELS_FILE; "
                              "`phi-api serve` without any of them prepares the default model)")
    MODEL_ID: str = setting("phi-3.5-mini", _text(), "The model name clients must send")
    MODEL: str = setting("", _stripped, "A model to serve by name (an alias of the catalog, or REPO[/SUBFOLDER][@REV] "
                         "on the Hugging Face Hub), pulled at start-up unless it is in the cache, served under that "
                         "name; instead of MODEL_PATH and MODEL_ID")
    SERVER_HOST: str = setting("0.0.0.0", _text(), "Listen address")
    SERVER_PORT: int = setting(8000, _integer(1, 65535), "Listen port")
    WEB_CONCURRENCY: int = setting(1, _integer(1, 64), "gunicorn workers; the cores are shared among them")
    PRELOAD_MODEL: bool = setting(True, _boolean, "Load and check the model in the master, before the fork")
    MAX_CONCURRENT_REQUESTS: int = setting(10, _integer(1, 10_000),
                                           "Generations running at once in the whole server; more get 429")
    DEFAULT_MAX_TOKENS: int = setting(1024, _integer(1, 1_000_000), "max_tokens when a request gives none")
    DEFAULT_TEMPERATURE: float = setting(0.7, _number(0.0, 2.0), "temperature when a request gives none")
    GENERATION_TIMEOUT: float = setting(600.0, _number(0.0, exclusive_low=True),
                                        "Seconds a generation may run (waiting for room included)", engine="timeout")
    REQUEST_READ_TIMEOUT: float = setting(30.0, _number(0.0, exclusive_low=True),
                                          "Seconds a request body may take to arrive; then 408")
    STREAM_WRITE_TIMEOUT: float = setting(1.0, _number(0.0, exclusive_low=True),
                                          "Seconds a streamed write may wait on a client that does not read")
    CORS_ORIGINS: str = setting("*", _text(), "Allowed origins, comma-separated")
    API_KEYS: str = setting("", lambda name, raw: str(raw), "Comma-separated keys; none: no authentication")
    API_KEYS_FILE: str = setting("", _stripped, "A JSON file of named keys with optional limits (requests and "
                                 "tokens per minute, tokens per day); with API_KEYS, the accepted keys")
    MAX_REQUEST_SIZE_MB: float = setting(10.0, _number(0.0, 1024.0, exclusive_low=True), "Larger bodies get 413")
    LOG_LEVEL: str = setting("INFO", _text(choices=LOG_LEVELS, upper=True), "Logging level")
    LOG_FORMAT: str = setting("text", _text(choices=("text", "json")),
                              "Log lines as text, or one JSON object each (json)")
    INTRA_OP_THREADS: int = setting(0, _integer(0, 256), "ONNX Runtime threads per worker; 0: cores / workers",
                                 engine="threads", per_model=True, value=lambda s: s.intra_op_threads)
    MEMORY_LIMIT_MB: float = setting(0.0, _number(0.0, 10_000_000.0),
                                     "Memory of the whole server: weights, processes, keys and values of every model "
                                     "in every worker; 0: three quarters of the machine's or container's memory")
    KV_CACHE_MB: float = setting(0.0, _number(0.0, 10_000_000.0),
                                 "Key/value memory one model may hold in one worker at most; 0: the worker's share "
                                 "of MEMORY_LIMIT_MB",
                                 engine="kv_budget_bytes", per_model=True, value=lambda s: s.kv_budget_bytes)
    KV_IDLE_SECONDS: float = setting(600.0, _number(0.0, exclusive_low=True),
                                     "Kept prefixes no request used for this long give their memory back")
    MAX_BATCH_ROWS: int = setting(32, _integer(1, 1024), "Sequences one worker advances together at most",
                                  engine="max_rows", per_model=True)
    PREFILL_CHUNK_TOKENS: int = setting(64, _integer(1, 1_000_000), "Prompt tokens per engine step",
                                        engine="prefill_chunk", per_model=True)
    PREFIX_CACHE: str = setting("on", _text(choices=("on", "exact", "off")),
                                "Reuse of earlier requests' keys and values: on (prompts and answers), exact (prompts "
                                "only, answering bit for bit as cold), off", engine="prefix_cache", per_model=True)
    PREFIX_CACHE_DIR: str = setting("", _stripped,
                                    "Folder of prompts' keys and values on disk, shared by the workers and kept across "
                                    "restarts; empty: prefixes/ in phi-api's cache folder",
                                    engine="prefix_disk_dir", value=lambda s: s.prefix_disk_dir)
    PREFIX_CACHE_DISK_MB: float = setting(8192.0, _number(0.0, 1_000_000_000.0),
                                          "Most the prefixes on disk take (least recently used leave first); 0 turns "
                                          "the disk tier off",
                                          engine="prefix_disk_bytes",
                                          value=lambda s: int(s.PREFIX_CACHE_DISK_MB * 2**20))
    PREFILL_SLICE_SECONDS: float = setting(0.2, _number(0.0, 60.0, exclusive_low=True),
                                           "Most time one engine iteration spends on a prompt while others wait or "
                                           "run (BATCH_INVARIANT false, PREFIX_CACHE on or off)",
                                           engine="prefill_slice", per_model=True)
    BATCH_INVARIANT: bool = setting(True, _boolean,
                                    "A request's tokens do not depend on what else runs: every decode step has an even "
                                    "row count, prompts go in chunks on the grid, drafts are checked as alone; false: "
                                    "faster under load, answers may differ in the last bits", engine="batch_invariant",
                                    per_model=True)
    TOOL_PARSER: str = setting("auto", _text(choices=TOOL_PARSERS),
                               "How the model writes tool calls: auto (what its folder says), generic, hermes, "
                               "phi4_mini, mistral, llama3_json or pythonic", engine="tool_parser", per_model=True)
    REASONING_PARSER: str = setting("auto", _text(choices=REASONING_PARSERS),
                                    "How the model's thinking is told apart from its answer: auto (by the thinking "
                                    "markers its tokenizer holds), think (<think>...</think> in the text, also where "
                                    "they are no tokens of its own), or none (the thinking stays in the answer)",
                                    engine="reasoning_parser", per_model=True)
    SPECULATIVE_DRAFT_MAX: int = setting(8, _integer(0, 64),
                                         "Most prompt-lookup draft tokens one step verifies (adaptive below it); 0 "
                                         "turns speculative decoding off", engine="draft_max", per_model=True)
    KV_CACHE_DTYPE: str = setting("auto", _text(choices=("auto", "float32", "int8")),
                                  "Keys and values in memory: float32, int8 (a quarter of the memory), or auto (int8 "
                                  "where float32 would take 256 KB a token or more)", per_model=True)
    INT4_KERNEL: str = setting("auto", _text(choices=("auto", "phi-api", "mlas")),
                               "The kernel of 4-bit weights: phi-api's own (AVX-512 VNNI, one pass over the weights "
                               "for all rows of a step), mlas (ONNX Runtime's), or auto (phi-api's where the CPU "
                               "and its built library allow, else mlas)", per_model=True)
    PLAYGROUND: bool = setting(True, _boolean, "Serve the chat playground at /; false: / is a 404")
    MODELS_FILE: str = setting("", _stripped,
                               "A JSON file declaring several models (ids, folders, options); else MODEL_PATH")
    ALLOW_PULL: bool = setting(False, _boolean, "Let clients make the server download models (Ollama's /api/pull, "
                               "POST /v1/models/load by name) without API keys; with API_KEYS, a key is enough")
    MODEL_IDLE_SECONDS: float = setting(0.0, _number(0.0),
                                        "Models loaded at run time that no request used for this long are unloaded "
                                        "(Ollama's keep_alive may ask for longer); 0: kept until unloaded")
    MAX_MODELS: int = setting(4, _integer(1, 64), "Most models the server holds at once; more loads get 400")
    DATA_DIR: str = setting("", _stripped,
                            "Folder of what must last across restarts and upgrades: keys' usage, stored responses, "
                            "the Batch API's files and batches; empty: data/ in phi-api's cache folder")
    BATCH_DIR: str = setting("", _stripped,
                             "Folder of the Batch API's files and batches; empty: batches/ in DATA_DIR")
    DATABASE_URL: str = setting("", _database_url,
                                "A postgresql:// URL: keys' usage and limits, stored responses, files and batches live "
                                "there, shared by every replica; empty: SQLite files in DATA_DIR (one machine)")
    BATCH_LEASE_SECONDS: float = setting(60.0, _number(1.0, 86_400.0),
                                         "How long a claimed batch line stays its worker's without word from it (the "
                                         "worker renews it while the line runs); then another worker or replica "
                                         "takes it")
    BATCH_CONCURRENCY: int = setting(2, _integer(0, 1024),
                                     "Batch lines each worker runs at once, at the lowest priority and outside "
                                     "MAX_CONCURRENT_REQUESTS; 0: batches wait")
    BATCH_FILE_MB: float = setting(100.0, _number(0.0, 100_000.0, exclusive_low=True),
                                   "Largest file POST /v1/files takes; larger get 413")
    RESPONSES_STORE_MAX: int = setting(1000, _integer(0, 10_000_000),
                                       "Most Responses API responses kept for previous_response_id, per API key (one "
                                       "key's never evict another's); 0 keeps none")
    RESPONSES_STORE_SECONDS: float = setting(30 * 86_400.0, _number(0.0, exclusive_low=True),
                                             "How long a stored Responses API response is kept (OpenAI: 30 days)")
    PREFIX_CACHE_SHARED: bool = setting(False, _boolean,
                                        "Let API keys reuse each other's prompts (in memory and on disk); off: a "
                                        "prompt is reused only for requests of the key that sent it")
    MAX_QUEUED_REQUESTS: int = setting(0, _integer(0, 100_000),
                                       "Generation requests each worker lets wait for a free slot, shared fairly among "
                                       "keys, before answering 429; 0: 429 at once when every slot is taken")
    QUEUE_TIMEOUT: float = setting(30.0, _number(0.0, exclusive_low=True),
                                   "Seconds a request may wait in that line; then 429")

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
