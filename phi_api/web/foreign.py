"""Everyone else's exceptions as members of the one error tree: the one table, :data:`FOREIGN`.

werkzeug's routing and body errors, gunicorn's refusals of broken HTTP, and the
errors of the layers below the API (the engine's, the Batch API store's) are
mapped here and nowhere else; the web layer's error handlers and the gunicorn
worker apply :func:`from_foreign`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gunicorn.http import errors as http
from sqlalchemy import exc as database
from werkzeug.exceptions import HTTPException

from phi_api.errors import (
    APIError,
    BatchError,
    CapacityError,
    ChatTemplateError,
    ContextLengthExceededError,
    DatabaseUnavailableError,
    GuidanceError,
    HeadersTooLargeError,
    HTTPStatusError,
    InternalError,
    InvalidJSONError,
    InvalidMessagesError,
    InvalidParameterError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelNotFoundError,
    QuotaError,
    RequestTooLargeError,
    RetiredError,
    RouteNotFoundError,
    StorageQuotaError,
    URITooLongError,
)


def _werkzeug(exc: Any) -> APIError:
    status = exc.code or 500
    if status == 404:
        return RouteNotFoundError("Unknown route; see GET /v1/models for the API's base path.")
    if status == 405:
        return MethodNotAllowedError(f"Method not allowed; allowed: {', '.join(sorted(exc.valid_methods or []))}.")
    if status == 413:
        return RequestTooLargeError("The request body is larger than the server accepts (MAX_REQUEST_SIZE_MB).")
    if status == 400:
        return InvalidJSONError("The request body could not be read as JSON.")
    if status < 500:
        return HTTPStatusError(exc.description or "Invalid request.", status)
    return InternalError()


def _gunicorn(status: int) -> Callable[[Any], APIError]:
    if status == 414:
        return lambda exc: URITooLongError("The request line is longer than the server accepts.")
    if status == 431:
        return lambda exc: HeadersTooLargeError("The request headers are larger or more numerous than the server "
                                                "accepts.")
    if status == 500:
        return lambda exc: InternalError()
    return lambda exc: HTTPStatusError("The request is not valid HTTP/1.1, or uses a part of it this server "
                                       "refuses.", status)


# exception class -> its member of the tree (the first match wins)
FOREIGN: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], Callable[[Any], APIError]], ...] = (
    (HTTPException, _werkzeug),
    (http.InvalidResponseHeader, _gunicorn(500)),  # the app's fault, not the client's
    (http.InvalidResponseHeaderName, _gunicorn(500)),
    (http.LimitRequestLine, _gunicorn(414)),
    (http.LimitRequestHeaders, _gunicorn(431)),
    (http.ForbiddenProxyRequest, _gunicorn(403)),
    (http.ExpectationFailed, _gunicorn(417)),
    (http.UnsupportedTransferCoding, _gunicorn(501)),
    (http.ConfigurationProblem, _gunicorn(500)),
    (http.ParseException, _gunicorn(400)),
    (RetiredError, lambda exc: ModelNotFoundError("The model was unloaded.")),
    (CapacityError, lambda exc: ContextLengthExceededError(f"This request is too large for this server: it {exc}.",
                                                           param="max_tokens")),
    # The template's own words name library internals: they go to the log, not to the client.
    (ChatTemplateError, lambda exc: InvalidMessagesError(
        "The model's chat template cannot render these messages (for example, roles in an order it does not "
        "accept).")),
    (GuidanceError, lambda exc: InvalidParameterError(f"The output format cannot be enforced: {exc}",
                                                      param="response_format")),
    (QuotaError, lambda exc: StorageQuotaError(str(exc), param=exc.param)),
    (BatchError, lambda exc: InvalidRequestError(str(exc), param=exc.param)),
    # JSON nested past what can be read (phi_api.jsontext), wherever a client's text is parsed.
    (RecursionError, lambda exc: InvalidRequestError("The request holds JSON nested too deeply.")),
    # The database is down, restarting or busy past its timeout: the routes that need it wait for it to be back.
    ((database.OperationalError, database.InterfaceError, database.TimeoutError),
     lambda exc: DatabaseUnavailableError("The server's database cannot be reached now; please retry.")),
)


def from_foreign(exc: BaseException) -> APIError:
    """``exc`` (werkzeug's, gunicorn's or the engine's) as a member of the tree; anything else is internal."""
    if isinstance(exc, APIError):
        return exc
    return next((convert(exc) for kind, convert in FOREIGN if isinstance(exc, kind)), InternalError())
