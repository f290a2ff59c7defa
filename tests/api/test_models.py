"""GET /v1/models."""


def test_lists_exactly_the_served_model(client):
    response = client.get("/v1/models")
    assert response.status_code == 200
    body = response.get_json()
    assert body["object"] == "list"
    assert len(body["data"]) == 1
    model = body["data"][0]
    assert (model["id"], model["object"], model["owned_by"]) == ("test-model", "model", "system")
    assert isinstance(model["created"], int) and model["created"] > 1_600_000_000
