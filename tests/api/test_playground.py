"""GET /: the playground's page and files, served from the package; off with PLAYGROUND=false."""

from __future__ import annotations

import pytest

from tests.api.test_request_errors import assert_error


def test_the_page_is_served_with_a_strict_content_security_policy(client):
    response = client.get("/")
    assert response.status_code == 200 and response.mimetype == "text/html"
    page = response.get_data(as_text=True)
    assert '<script src="/playground/app.js"></script>' in page and "<script>" not in page  # no inline script
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy


@pytest.mark.parametrize("name,mimetype", [("app.js", "text/javascript"), ("app.css", "text/css"),
                                           ("vendor/markdown-it.min.js", "text/javascript"),
                                           ("vendor/LICENSE-markdown-it", "application/octet-stream")])
def test_its_files_come_from_the_package(client, name, mimetype):
    response = client.get("/playground/" + name)
    assert response.status_code == 200 and response.mimetype == mimetype
    assert response.headers["Content-Security-Policy"]


@pytest.mark.parametrize("path", ["/playground/nothing.js", "/playground/../config.py",
                                  "/playground/%2e%2e/config.py", "/playground/"])
def test_nothing_else_is_served(client, path):
    assert client.get(path).status_code == 404


def test_playground_false_turns_it_off(make_app):
    client = make_app(PLAYGROUND=False).test_client()
    assert_error(client.get("/"), 404, "invalid_request_error", "not_found", None)
    assert client.get("/playground/app.js").status_code == 404


def test_the_page_needs_no_key_but_the_api_does(make_app):
    client = make_app(API_KEYS="secret").test_client()
    assert client.get("/").status_code == 200
    assert client.get("/playground/app.js").status_code == 200
    assert client.get("/v1/models").status_code == 401
