"""One error tree for the whole API, one renderer per protocol, one table for everyone else's exceptions.

Every failure a client can see is an :class:`APIError`. Its class says the
HTTP status and OpenAI's ``type`` and ``code``; the message and ``param``
say what exactly went wrong. How it is written depends on the protocol the
request speaks, and nothing else:

- :func:`openai_body`: OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``;
- :func:`ollama_body`: Ollama's, ``{"error": "message"}``;
- :func:`anthropic_body`: Anthropic's, ``{"type": "error", "error": {"type", "message"}}``.

This module imports nothing of the package, so every layer, the engine
included, raises from it. The errors of the layers below the API (the
engine's, the stores', the settings') are here too, outside the API tree;
they, and everyone else's exceptions (werkzeug's routing and body errors,
gunicorn's refusals of broken HTTP), become members of the tree in one
place: the table of :mod:`phi_api.web.foreign`.

The tree, with the rows of the specification's error table:

- ``APIError`` (500 ``server_error`` / ``internal_error``)
  - ``InvalidRequestError`` (400 ``invalid_request_error``)
    - ``InvalidParameterError`` (``invalid_parameter``, param: the parameter)
    - ``MissingParameterError`` (``missing_parameter``, param: the parameter)
    - ``InvalidMessagesError`` (``invalid_messages``, param: ``messages``)
    - ``ContextLengthExceededError`` (``context_length_exceeded``)
    - ``UnsupportedParameterError`` (``unsupported_parameter``: valid, but not something this server can do)
    - ``InvalidJSONSchemaError`` (``invalid_json_schema``) and ``InvalidFunctionParametersError``
      (``invalid_function_parameters``): a ``strict`` schema outside OpenAI's strict mode
    - ``InvalidJSONError`` (``invalid_json``)
    - ``ModelNotFoundError`` (404 ``model_not_found``, param ``model``)
    - ``PreviousResponseNotFoundError`` (``previous_response_not_found``) and ``ResponseNotFoundError`` (404
      ``not_found``): stored responses of the Responses API
    - ``RouteNotFoundError`` (404 ``not_found``)
    - ``MethodNotAllowedError`` (405 ``method_not_allowed``)
    - ``RequestTooLargeError`` (413 ``request_too_large``)
    - ``UnsupportedMediaTypeError`` (415 ``unsupported_media_type``)
    - ``RequestTimeoutError`` (408 ``request_timeout``: the body did not arrive in time)
    - ``URITooLongError`` (414 ``uri_too_long``) and ``HeadersTooLargeError``
      (431 ``headers_too_large``): answered by the gunicorn worker itself
    - ``AuthenticationError`` (401 ``invalid_api_key``)
    - ``HTTPStatusError`` (any other 4xx a library refuses a request with)
  - ``RateLimitError`` (429 ``rate_limit_error`` / ``rate_limit_exceeded``, with ``Retry-After``)
  - ``ClientClosedRequestError`` (499 ``client_closed_request``: the client left before
    its answer was ready; never seen by it, only logged)
  - ``InternalError`` (500 ``internal_error``, generic message only)
  - ``GenerationTimeoutError`` (504 ``timeout``)
  - ``ServiceUnavailableError`` (503 ``unavailable``: the worker is shutting down)
  - ``ModelLoadingError`` (500 ``model_loading_failed``; start-up only, logged)
"""

from __future__ import annotations

from typing import Any, ClassVar

GENERIC_SERVER_ERROR = "The server had an error while processing your request."


class APIError(Exception):
    """Base of the tree: an error with an HTTP status and OpenAI's error fields."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = "internal_error"
    default_param: ClassVar[str | None] = None
    headers: ClassVar[dict[str, str]] = {}  # sent with the error response (never changed: a class constant)

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param if param is not None else self.default_param


class InvalidRequestError(APIError):
    """The request cannot be served as it is (400): the client must change it."""

    status = 400
    type = "invalid_request_error"
    code: ClassVar[str | None] = None


class InvalidParameterError(InvalidRequestError):
    """A parameter has a value out of its range or of the wrong kind; ``param`` names it."""

    code = "invalid_parameter"


class MissingParameterError(InvalidRequestError):
    """A required parameter is missing; ``param`` names it."""

    code = "missing_parameter"


class InvalidMessagesError(InvalidRequestError):
    """The chat messages are malformed, or the chat template cannot render them."""

    code = "invalid_messages"
    default_param = "messages"


class ContextLengthExceededError(InvalidRequestError):
    """The prompt and ``max_tokens`` do not fit the model's context (or the server's key/value budget)."""

    code = "context_length_exceeded"


class UnsupportedParameterError(InvalidRequestError):
    """A valid parameter value this server cannot honour (images, ``suffix``, ...): refused, never ignored."""

    code = "unsupported_parameter"


class InvalidJSONSchemaError(InvalidRequestError):
    """A ``strict`` output schema that breaks OpenAI's strict-mode rules (OpenAI's code and words)."""

    code = "invalid_json_schema"


class InvalidFunctionParametersError(InvalidRequestError):
    """A ``strict`` function's parameters that break OpenAI's strict-mode rules (OpenAI's code and words)."""

    code = "invalid_function_parameters"


class InvalidJSONError(InvalidRequestError):
    """The body is not a JSON object of text and finite numbers."""

    code = "invalid_json"


class ModelNotFoundError(InvalidRequestError):
    """The request names a model this server does not serve (404)."""

    status = 404
    code = "model_not_found"
    default_param = "model"


class PreviousResponseNotFoundError(InvalidRequestError):
    """A Responses API follow-up names a predecessor that is not stored (any more), as OpenAI answers it (400)."""

    code = "previous_response_not_found"
    default_param = "previous_response_id"


class NotFoundError(InvalidRequestError):
    """No stored object (a response, a file, a batch) has that id (404)."""

    status = 404
    code = "not_found"


class ResponseNotFoundError(NotFoundError):
    """No stored response has that id (404)."""


class RouteNotFoundError(InvalidRequestError):
    """No such route (404)."""

    status = 404
    code = "not_found"


class MethodNotAllowedError(InvalidRequestError):
    """The route exists, but not for this method (405)."""

    status = 405
    code = "method_not_allowed"


class RequestTooLargeError(InvalidRequestError):
    """The body is larger than ``MAX_REQUEST_SIZE_MB`` (413)."""

    status = 413
    code = "request_too_large"


class UnsupportedMediaTypeError(InvalidRequestError):
    """The body is declared as something other than JSON (415)."""

    status = 415
    code = "unsupported_media_type"


class RequestTimeoutError(InvalidRequestError):
    """The body did not arrive within ``REQUEST_READ_TIMEOUT`` (408)."""

    status = 408
    code = "request_timeout"


class URITooLongError(InvalidRequestError):
    """The request line is longer than gunicorn accepts (414)."""

    status = 414
    code = "uri_too_long"


class HeadersTooLargeError(InvalidRequestError):
    """Too many, or too large, headers (431)."""

    status = 431
    code = "headers_too_large"


class AuthenticationError(InvalidRequestError):
    """No API key, or a wrong one, while ``API_KEYS`` is set (401)."""

    status = 401
    code = "invalid_api_key"


class HTTPStatusError(InvalidRequestError):
    """Another client error a library refused the request with, keeping its status (403, 417, 501, ...)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status  # type: ignore[misc]  # the one class whose status is the library's


class RateLimitError(APIError):
    """The server runs ``MAX_CONCURRENT_REQUESTS`` generations already (429); retry in a moment."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    headers: ClassVar[dict[str, str]] = {"Retry-After": "1"}  # slots free up as generations end: seconds


class KeyRateLimitError(RateLimitError):
    """The request's API key has used up one of its limits (429); its headers say when it resets."""


class PermissionDeniedError(InvalidRequestError):
    """The key is valid but may not do this (403)."""

    status = 403
    code = "permission_denied"


class ClientClosedRequestError(APIError):
    """The client closed the connection before its answer was ready (nginx's 499): only logged."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class InternalError(APIError):
    """Anything unexpected (500): a generic message; the cause goes to the log only."""

    def __init__(self, message: str = GENERIC_SERVER_ERROR) -> None:
        super().__init__(message)


class GenerationTimeoutError(APIError):
    """The generation ran longer than ``GENERATION_TIMEOUT`` (504)."""

    status = 504
    code = "timeout"


class ServiceUnavailableError(APIError):
    """This worker is shutting down (503); retry on another."""

    status = 503
    code = "unavailable"


class DatabaseUnavailableError(ServiceUnavailableError):
    """The database that holds keys' usage, stored responses, files and batches cannot be reached now (503)."""

    code = "database_unavailable"
    headers: ClassVar[dict[str, str]] = {"Retry-After": "1"}


class ModelLoadingError(APIError):
    """A model could not be loaded: at start-up, logged as one JSON line, then the server exits; at run time,
    the load's answer (500)."""

    code = "model_loading_failed"

    def __init__(self, path: str, cause: str, model_id: str | None = None) -> None:
        named = f"model '{model_id}'" if model_id is not None else "model"
        super().__init__(f"Failed to load {named} from {path}: {cause}")


class ModelExistsError(InvalidRequestError):
    """A load names a model id that is already loaded (400, as OpenArc answers)."""

    code = "model_exists"
    default_param = "model"


class ModelLimitError(InvalidRequestError):
    """A load beyond ``MAX_MODELS`` (400): nothing is loaded."""

    code = "model_limit_reached"


class InsufficientMemoryError(InvalidRequestError):
    """A model that does not fit the memory budget (400; at start-up it stops the server): the message says how much
    it needs and how much is free."""

    code = "insufficient_memory"


# Errors of the layers below the API: not shown to clients as they are; phi_api.web.foreign maps them --------


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


# Each protocol's renderer of the tree ------------------------------------------------------------


def openai_body(error: APIError) -> dict[str, Any]:
    """``error`` as OpenAI's error object, with its fields in OpenAI's order."""
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def ollama_body(error: APIError) -> dict[str, Any]:
    """``error`` as Ollama's API writes errors."""
    return {"error": error.message}


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_body(error: APIError) -> dict[str, Any]:
    """``error`` as Anthropic's API writes errors: ``{"type": "error", "error": {"type", "message"}}``, its type
    by the status."""
    kind = _ANTHROPIC_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}
