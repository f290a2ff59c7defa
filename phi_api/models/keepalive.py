"""Keep-alive: how long each model loaded at run time stays loaded without use, the same in every worker.

A model's keep-until time is a file's modification time in the server's state folder, so every worker sees a use
noted by any other (Ollama's ``keep_alive``, ``MODEL_IDLE_SECONDS``). No file: the model has no keep-until time, and
stays until it is unloaded.

A model's life is the operator's: a use only ever moves its keep-until time later, and an ordinary key's use
(:meth:`KeepAlive.note_use` with ``by_admin`` false) neither gives a time to a model kept until it is unloaded nor
keeps one longer than ``KEEP_ALIVE_MAX_SECONDS`` past its request.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


class KeepAlive:
    """Each model's keep-until time, as a file in ``folder``; ``idle_seconds`` when a use asks for nothing."""

    def __init__(self, folder: Path, idle_seconds: float, most_asked: float = float("inf")) -> None:
        """``most_asked``: the longest an ordinary key may ask a model to be kept (``KEEP_ALIVE_MAX_SECONDS``)."""
        self._folder = folder
        self._idle_seconds = idle_seconds
        self._most_asked = most_asked
        self._until: dict[str, float] = {}  # what this process last wrote of each model's keep-until time

    def note_use(self, model_id: str, seconds: float | None = None, *, by_admin: bool = True) -> None:
        """``model_id`` is used now: keep it at least ``seconds`` more (default ``MODEL_IDLE_SECONDS``; 0 and
        nothing asked: no limit). A use never shortens a model's life; one asked by an ordinary key (not
        ``by_admin``) never gives a time to a model that has none, and keeps it ``KEEP_ALIVE_MAX_SECONDS`` at
        most."""
        seconds = self._idle_seconds if seconds is None else seconds
        if not seconds:
            return
        if not by_admin:
            if not self.path(model_id).exists():  # kept until unloaded: longer than anything asked
                return
            seconds = min(seconds, self._most_asked)
        until = time.time() + seconds
        if self._until.get(model_id, 0.0) >= until - 1.0:  # written within the last second: enough
            return
        self._until[model_id] = until
        path = self.path(model_id)
        try:
            if path.exists() and path.stat().st_mtime >= until:
                return
            path.touch()
            os.utime(path, (until, until))
        except (OSError, OverflowError, ValueError):  # refused, or past the platform's clock: kept as with no limit
            log.warning("could not note the use of model %s", model_id)

    def expired(self, model_id: str, now: float) -> bool:
        """Whether ``model_id``'s keep-until time has passed (never, when no use set one)."""
        try:
            return self.path(model_id).stat().st_mtime < now
        except FileNotFoundError:
            return False

    def forget(self, model_id: str) -> None:
        self.path(model_id).unlink(missing_ok=True)

    def path(self, model_id: str) -> Path:
        """The file whose modification time is ``model_id``'s keep-until time."""
        return self._folder / f"keep-{hashlib.sha256(model_id.encode('utf-8')).hexdigest()[:16]}"
