"""One error tree for the whole API, one renderer per protocol, one table for everyone else's exceptions.

Every failure a client can see is an :class:`APIError`. Its class says the
HTTP status and OpenAI's ``type`` and ``code``; the message and ``param``
say what exactly went wrong. How it is written depends on the protocol the
request speaks, and nothing else:

- :func:`openai_body`: OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``;
- :func:`ollama_body`: Ollama's, ``{"error": "message"}``;
- :func:`rerank_body`: the rerank routes', ``{"message": ..., "error": {OpenAI's}}``;
- :func:`anthropic_body`: Anthropic's, ``{"type": "error", "error": {"type", "message"}}``.

This package imports nothing else of phi-api, so every layer, the engine
included, raises from it: the tree in :mod:`phi_api.errors.api`, the
renderers in :mod:`phi_api.errors.render`. The errors of the layers below
the API (the engine's, the stores', the settings') are here too, outside
the API tree (:mod:`phi_api.errors.internal`);
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
    - ``ModelTaskError`` (400 ``unsupported_model_task``, param ``model``: an encoder asked to generate, or back)
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

from phi_api.errors.api import (
    GENERIC_SERVER_ERROR,
    APIError,
    AuthenticationError,
    ClientClosedRequestError,
    ContextLengthExceededError,
    DatabaseUnavailableError,
    GenerationTimeoutError,
    HeadersTooLargeError,
    HTTPStatusError,
    InsufficientMemoryError,
    InternalError,
    InvalidFunctionParametersError,
    InvalidJSONError,
    InvalidJSONSchemaError,
    InvalidMessagesError,
    InvalidParameterError,
    InvalidRequestError,
    KeyRateLimitError,
    KeyRequestTooLargeError,
    MethodNotAllowedError,
    MissingParameterError,
    ModelExistsError,
    ModelLimitError,
    ModelLoadingError,
    ModelNotFoundError,
    ModelTaskError,
    NotFoundError,
    PermissionDeniedError,
    PreviousResponseNotFoundError,
    RateLimitError,
    RequestTimeoutError,
    RequestTooLargeError,
    ResponseNotFoundError,
    RouteNotFoundError,
    ServiceUnavailableError,
    StorageQuotaError,
    UnsupportedMediaTypeError,
    UnsupportedParameterError,
    URITooLongError,
)
from phi_api.errors.internal import (
    BatchError,
    CapacityError,
    ChatTemplateError,
    ConfigError,
    FolderError,
    GuidanceError,
    JSONNumberError,
    KernelError,
    KeysFileError,
    OgaError,
    PoolError,
    PrepackError,
    PreparationError,
    PullError,
    QuotaError,
    RetiredError,
    RowsFull,
    ServerError,
)
from phi_api.errors.render import (
    anthropic_body,
    ollama_body,
    openai_body,
    rerank_body,
)

__all__ = [
    "GENERIC_SERVER_ERROR",
    "APIError",
    "AuthenticationError",
    "BatchError",
    "CapacityError",
    "ChatTemplateError",
    "ClientClosedRequestError",
    "ConfigError",
    "ContextLengthExceededError",
    "DatabaseUnavailableError",
    "FolderError",
    "GenerationTimeoutError",
    "GuidanceError",
    "HTTPStatusError",
    "HeadersTooLargeError",
    "InsufficientMemoryError",
    "InternalError",
    "InvalidFunctionParametersError",
    "InvalidJSONError",
    "InvalidJSONSchemaError",
    "InvalidMessagesError",
    "InvalidParameterError",
    "InvalidRequestError",
    "JSONNumberError",
    "KernelError",
    "KeyRateLimitError",
    "KeyRequestTooLargeError",
    "KeysFileError",
    "MethodNotAllowedError",
    "MissingParameterError",
    "ModelExistsError",
    "ModelLimitError",
    "ModelLoadingError",
    "ModelNotFoundError",
    "ModelTaskError",
    "NotFoundError",
    "OgaError",
    "PermissionDeniedError",
    "PoolError",
    "PrepackError",
    "PreparationError",
    "PreviousResponseNotFoundError",
    "PullError",
    "QuotaError",
    "RateLimitError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "ResponseNotFoundError",
    "RetiredError",
    "RouteNotFoundError",
    "RowsFull",
    "ServerError",
    "ServiceUnavailableError",
    "StorageQuotaError",
    "URITooLongError",
    "UnsupportedMediaTypeError",
    "UnsupportedParameterError",
    "anthropic_body",
    "ollama_body",
    "openai_body",
    "rerank_body",
]
