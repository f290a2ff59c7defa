"""A model's sampling defaults: what a request that omits a sampling field gets.

From the most to the least specific: the request's own field; the model's ``SAMPLING_DEFAULTS`` option (in
``MODELS_FILE``, or the server-wide setting: vLLM's ``--override-generation-config``); its folder's
``generation_config.json`` (``GENERATION_CONFIG=auto``, vLLM's ``--generation-config auto``); then the server's own
(``DEFAULT_TEMPERATURE``, no penalty). A folder's field that is out of bounds is left out with a warning: a model's
folder is data, and serving it without that default beats refusing it.
"""

from __future__ import annotations

import logging

from phi_api.engine.runtime.folder import GENERATION_CONFIG_FILE, ModelFolder
from phi_api.errors import ConfigError, FolderError
from phi_api.settings import Settings
from phi_api.settings.parsing import SAMPLING_FIELDS, sampling_values

log = logging.getLogger(__name__)


def sampling_defaults(settings: Settings, path: str) -> tuple[tuple[str, float], ...]:
    """The defaults of the model in folder ``path`` under ``settings`` (its own options applied), as sorted pairs."""
    folder = folder_defaults(path) if settings.GENERATION_CONFIG == "auto" else {}
    return tuple(sorted({**folder, **dict(settings.SAMPLING_DEFAULTS)}.items()))


def folder_defaults(path: str) -> dict[str, float]:
    """The sampling fields of the folder's ``generation_config.json`` that are within bounds."""
    try:
        config = ModelFolder.read(path).generation_config()
    except FolderError:
        return {}
    found: dict[str, float] = {}
    for field in SAMPLING_FIELDS:
        if config.get(field) is None:
            continue
        try:
            found.update(sampling_values(GENERATION_CONFIG_FILE, {field: config[field]}))
        except ConfigError as exc:
            log.warning("%s: %s; the server's default serves instead", path, exc)
    return found
