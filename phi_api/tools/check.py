"""``python -m phi_api check``: the configuration and the model folders checked without starting the server.

A misspelt setting would otherwise be silently ignored: names that look like
a setting but are not one (close to a setting's name, or starting with
``PHI_API_``) are warned about. Bad values and model folders that cannot be
served are errors (exit code 1); what the server would run with (workers,
threads, memory) is printed. Models declared by name are not pulled here.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping

from phi_api.errors import ConfigError, InvalidParameterError
from phi_api.settings import SETTING_NAMES, Settings, cache_root, load_settings

# Environment variables phi-api reads that are not settings of the table.
OTHER_NAMES = frozenset({"PHI_API_CACHE_DIR", "PHI_API_TEST_MODEL_PATH", "PHI_API_TEST_EMBEDDING_PATH",
                         "XDG_CACHE_HOME", "PROMETHEUS_MULTIPROC_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT",
                         "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME"})


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """No options: the environment is what is checked."""


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """Warnings for the names in ``environ`` that look like settings but are none."""
    warnings = []
    for name in sorted(environ):
        if name in SETTING_NAMES or name in OTHER_NAMES:
            continue
        close = difflib.get_close_matches(name, SETTING_NAMES, n=1, cutoff=0.85)
        if close:
            warnings.append(f"{name} is not a setting (ignored); did you mean {close[0]}?")
        elif name.startswith("PHI_API_"):
            warnings.append(f"{name} is not a setting (ignored); `python -m phi_api settings` lists them")
    return warnings


def model_errors(settings: Settings) -> tuple[list[str], list[str]]:
    """Errors for the declared model folders that cannot be served, and notes on the models checked."""
    from phi_api.models.specs import check_folder, declared

    if settings.MODEL:
        return [], [f"model {settings.MODEL}: by name, pulled at start-up unless in the cache (not checked here)"]
    try:
        specs = declared(settings, pull=False)
    except ConfigError as error:
        return [str(error)], []
    errors, notes = [], []
    for spec in specs:
        try:
            check_folder(spec.path, spec.task)
            notes.append(f"model {spec.id}: {spec.path}")
        except InvalidParameterError as error:
            errors.append(f"model {spec.id}: {error.message}")
    return errors, notes


def facts(settings: Settings) -> list[str]:
    """What the server would run with."""
    return [f"workers: {settings.workers}, ONNX Runtime threads each: {settings.intra_op_threads}",
            f"memory limit: {settings.memory_limit_bytes / 2**20:,.0f} MB; keys and values per model and worker at "
            f"most: {settings.kv_budget_bytes / 2**20:,.0f} MB",
            f"cache folder: {cache_root()}; data folder: {settings.data_dir}"]


def exposure(settings: Settings) -> list[str]:
    """Warnings for what others than the server's user can read: the keys file (keys, or their digests), the data
    folder (keys' usage, stored conversations, batch files)."""
    warnings = []
    for path, what, mask in ((settings.API_KEYS_FILE, "the keys file", 0o044), (str(settings.data_dir),
                             "the data folder", 0o055)):
        try:
            mode = os.stat(os.path.expanduser(path)).st_mode & 0o777 if path else 0
        except OSError:
            continue
        if mode & mask:
            warnings.append(f"{what} {path} can be read by other users (mode {mode:o}): chmod "
                            f"{'600' if mask == 0o044 else '700'} it")
    return warnings


def run(environ: Mapping[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(errors, warnings, notes) for the configuration ``environ`` gives."""
    warnings = unknown_names(environ)
    try:
        settings = load_settings(environ)
    except ConfigError as error:
        return [str(error)], warnings, []
    errors, notes = model_errors(settings)
    return errors, warnings + exposure(settings), notes + facts(settings)


def main(args: argparse.Namespace) -> int:
    errors, warnings, notes = run(os.environ)
    for line in errors:
        print(f"error: {line}")
    for line in warnings:
        print(f"warning: {line}")
    for line in notes:
        print(line)
    print("configuration: " + ("NOT usable" if errors else "ok" + (" (with warnings)" if warnings else "")))
    return 1 if errors else 0
