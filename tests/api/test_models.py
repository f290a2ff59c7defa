"""GET /v1/models and GET /v1/models/{model}."""

import pytest

from tests.api.test_request_errors import assert_error


def test_lists_exactly_the_served_model(client):
    response = client.get("/v1/models")
    assert response.status_code == 200
    body = response.get_json()
    assert body["object"] == "list"
    assert len(body["data"]) == 1
    model = body["data"][0]
    assert (model["id"], model["object"], model["owned_by"]) == ("test-model", "model", "system")
    assert isinstance(model["created"], int) and model["created"] > 1_600_000_000


def test_retrieves_the_served_model_as_listed(client):
    listed = client.get("/v1/models").get_json()["data"][0]
    response = client.get("/v1/models/test-model")
    assert response.status_code == 200
    assert response.get_json() == listed


@pytest.mark.parametrize("model", ["gpt-4o", "test-model-2", "org/test-model", "TEST-MODEL"])
def test_any_other_model_is_not_found(client, model):
    assert_error(client.get(f"/v1/models/{model}"), 404, "invalid_request_error", "model_not_found", "model")


def test_only_get_is_allowed(client):
    assert_error(client.post("/v1/models/test-model", json={}), 405, "invalid_request_error",
                 "method_not_allowed", None)
