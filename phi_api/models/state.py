"""The state folder the server's processes share (``PHI_API_STATE_DIR``), the file lock they change it under,
and the model registry's file in it."""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

STATE_DIR_VARIABLE = "PHI_API_STATE_DIR"


def state_dir() -> Path:
    """The folder the server's processes share state in: the gunicorn master's (``PHI_API_STATE_DIR``), or
    a fresh one for an app of its own (Flask's test client, a script), removed when the process exits."""
    folder = os.environ.get(STATE_DIR_VARIABLE)
    if folder:
        return Path(folder)
    own = tempfile.mkdtemp(prefix="phi-api-state-")
    atexit.register(shutil.rmtree, own, True)  # (a test run makes thousands of apps)
    return Path(own)


class FileLock:
    """An exclusive lock on a file, shared by the server's processes (taken off the hub: it may wait)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._handle: Any = None

    def __enter__(self) -> None:
        from phi_api.engine.threads.native import off_hub

        self._handle = open(self._path, "a+")
        try:
            off_hub(fcntl.flock, self._handle, fcntl.LOCK_EX)
        except RuntimeError:  # no gevent hub in this process (a plain script): take it here
            fcntl.flock(self._handle, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: Any) -> None:
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()


class RegistryFile:
    """The model registry's JSON file in the state ``folder``: the models, and a version every change bumps."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "models.json"
        self._lock_path = folder / "models.lock"

    def locked(self) -> FileLock:
        """The lock every change of the registry is made under."""
        return FileLock(self._lock_path)

    def stamp(self) -> tuple[int, int, int] | None:
        """What tells one version of the file from another (None when there is no file yet)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def read(self) -> dict[str, Any] | None:
        """The registry, and the stamp of the file it was read from; None when there is none yet."""
        stamp = self.stamp()
        try:
            registry = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        registry["stamp"] = stamp
        return registry

    def write(self, models: list[dict[str, Any]], version: int | None = None) -> tuple[int, int, int] | None:
        """Replace the registry's models (under :meth:`locked`); returns the new file's stamp."""
        current = self.read()
        registry = {"version": version or (current or {"version": 0})["version"] + 1, "models": models}
        staging = self.path.with_name(f".models.{os.getpid()}.json")
        staging.write_text(json.dumps(registry, indent=1), encoding="utf-8")
        os.replace(staging, self.path)
        return self.stamp()
