"""The API's error tree: every failure a client can see, its HTTP status and OpenAI's ``type`` and ``code`` (see
:mod:`phi_api.errors` for the tree)."""

from __future__ import annotations

from typing import ClassVar

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


class ModelTaskError(InvalidRequestError):
    """The model serves another task (an embedding model asked to chat, a generator asked for embeddings)."""

    code = "unsupported_model_task"
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


class KeyRequestTooLargeError(KeyRateLimitError):
    """The request's worst case in tokens exceeds one of its key's token limits whole (429, as OpenAI answers a
    request too large for a rate limit): it can never run as it is."""

    code = "request_too_large"


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


class StorageQuotaError(InvalidRequestError):
    """A file a key may not store: past its count or bytes of stored files (400; nothing is kept)."""

    code = "storage_quota_exceeded"
    default_param = "file"


class ModelLimitError(InvalidRequestError):
    """A load beyond ``MAX_MODELS`` (400): nothing is loaded."""

    code = "model_limit_reached"


class InsufficientMemoryError(InvalidRequestError):
    """A model that does not fit the memory budget (400; at start-up it stops the server): the message says how much
    it needs and how much is free."""

    code = "insufficient_memory"
