"""Each protocol's renderer of the API's error tree: OpenAI's error object, Ollama's, Anthropic's, and the rerank
routes' (Cohere's ``message`` beside OpenAI's ``error``, which vLLM's and llama.cpp's clients read)."""

from __future__ import annotations

from typing import Any

from phi_api.errors.api import APIError


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


def rerank_body(error: APIError) -> dict[str, Any]:
    """``error`` for the rerank and score routes: Cohere's clients read ``message``, vLLM's and llama.cpp's
    OpenAI's ``error`` object; both are there."""
    return {"message": error.message, **openai_body(error)}
