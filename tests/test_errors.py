"""The error tree and its one shape."""

from __future__ import annotations

import pytest

from phi_api import errors


@pytest.mark.parametrize(
    ("error", "status", "type_", "code", "param"),
    [
        (errors.ModelNotFoundError("x"), 404, "invalid_request_error", "model_not_found", "model"),
        (errors.InvalidParameterError("x", param="temperature"), 400, "invalid_request_error", "invalid_parameter",
         "temperature"),
        (errors.InvalidMessagesError("x"), 400, "invalid_request_error", "invalid_messages", "messages"),
        (errors.ContextLengthExceededError("x", param="messages"), 400, "invalid_request_error",
         "context_length_exceeded", "messages"),
        (errors.MissingParameterError("x", param="model"), 400, "invalid_request_error", "missing_parameter", "model"),
        (errors.RateLimitError("x"), 429, "rate_limit_error", "rate_limit_exceeded", None),
        (errors.InternalError(), 500, "server_error", "internal_error", None),
        (errors.ModelLoadingError("/m", "boom"), 500, "server_error", "model_loading_failed", None),
    ],
)
def test_every_row_of_the_specification_s_table(error, status, type_, code, param):
    assert error.status == status
    assert errors.openai_body(error) == {"error": {"message": error.message, "type": type_, "param": param,
                                                   "code": code}}
    assert errors.ollama_body(error) == {"error": error.message}


def test_error_fields_are_in_openai_s_order():
    assert list(errors.openai_body(errors.InvalidParameterError("m"))["error"]) == ["message", "type", "param",
                                                                                      "code"]


def test_model_loading_message_names_the_model_the_path_and_the_cause():
    assert errors.ModelLoadingError("/models/phi", "no such directory").message == (
        "Failed to load model from /models/phi: no such directory")
    assert errors.ModelLoadingError("/models/phi", "no such directory", "phi").message == (
        "Failed to load model 'phi' from /models/phi: no such directory")


def test_internal_errors_carry_a_generic_message_only():
    assert errors.InternalError().message == errors.GENERIC_SERVER_ERROR
