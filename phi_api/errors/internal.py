"""The errors of the layers below the API (the engine's, the stores', the settings'): not shown to clients as they
are; :mod:`phi_api.web.foreign` maps them into the API's tree."""

from __future__ import annotations


class ChatTemplateError(ValueError):
    """The chat template refused the messages (for example, roles that do not alternate)."""


class GuidanceError(ValueError):
    """A grammar llguidance cannot compile (the message says why)."""


class PrepackError(RuntimeError):
    """The prepacked model could not be made (the message says why)."""


class CapacityError(ValueError):
    """A request that needs more key/value memory than the whole budget allows (it could never run)."""


class OgaError(RuntimeError):
    """An error reported by ONNX Runtime GenAI."""


class KernelError(RuntimeError):
    """phi-api's own 4-bit kernel cannot be built or run here, or not on these shapes (the message says why)."""


class RetiredError(RuntimeError):
    """The engine's model was unloaded: it takes nothing new."""


class RowsFull(RuntimeError):
    """No free row (only the spare one is left)."""


class PoolError(MemoryError):
    """The reservation could not be made (for example under strict overcommit, ``vm.overcommit_memory=2``)."""


class FolderError(ValueError):
    """Not a readable ONNX Runtime GenAI model folder; the message says what is wrong."""


class BatchError(ValueError):
    """A request about files or batches that cannot be done (the message says why; ``param`` names the field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class QuotaError(BatchError):
    """A file beyond its key's storage quota (the store's; the web layer answers StorageQuotaError)."""


class PreparationError(RuntimeError):
    """The default model could not be prepared; the message says why."""


class PullError(RuntimeError):
    """A model could not be pulled; the message, one line, says why."""


class ConfigError(ValueError):
    """A setting has a value the server cannot run with."""


class KeysFileError(ConfigError):
    """``API_KEYS_FILE`` cannot be read or is not as documented (the message says where; it never shows a key)."""


class ServerError(RuntimeError):
    """The server did not start, or did not stop, as asked (the message has its log)."""


class JSONNumberError(ValueError):
    """A number a request body may not hold: NaN, Infinity, or beyond a double's range."""
