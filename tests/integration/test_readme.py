"""The curl examples of the README and of docs/, run as written with curl against the real server.

The examples that load, unload or delete models name a folder that exists only on the reader's machine; the
model-management tests cover those routes. Every other example must answer as its page says.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.readme import page_commands
from tests.support.server import Server

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_HOST = re.compile(r"^(http://)?localhost:8000")
CHANGES_MODELS = re.compile(r"/(load|unload|delete)$")


def _url(arguments: list[str]) -> str | None:
    return next((word for word in arguments if EXAMPLE_HOST.match(word)), None)


def curl_examples() -> list[tuple[str, list[str]]]:
    """Each ``curl`` command against the example server in the pages' ``sh`` blocks, with its page's name."""
    found = []
    for page in PAGES:
        for words in page_commands(page):
            url = _url(words[1:]) if words[0] == "curl" else None
            if url and not CHANGES_MODELS.search(url):
                found.append((page.name, words[1:]))
    return found


EXAMPLES = curl_examples()
ENCODER_PATHS = ("/v1/embeddings",)  # examples that need the default embedding model served beside the chat model


@pytest.fixture(scope="module")
def encoders_server(model_path, embedding_model_path, logs_dir, tmp_path_factory):
    """The README's models file: the default chat model and the default embedding model, under their ids."""
    listing = tmp_path_factory.mktemp("readme-encoders") / "models.json"
    listing.write_text(json.dumps({"models": [{"id": "smollm2-135m-instruct", "path": model_path},
                                              {"id": "all-minilm-l6-v2", "path": embedding_model_path}]}))
    with Server(logs_dir, MODELS_FILE=str(listing), WEB_CONCURRENCY=1) as running:
        yield running


def test_the_pages_show_curl_examples_of_each_protocol():
    paths = {EXAMPLE_HOST.sub("", _url(command) or "") for _, command in EXAMPLES}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/api/generate",
            "/metrics", "/v1/embeddings"} <= paths
    assert "README.md" in {page for page, _ in EXAMPLES}


@pytest.mark.parametrize("arguments", [command for _, command in EXAMPLES],
                         ids=[f"{page}:{EXAMPLE_HOST.sub('', _url(command) or '')}" for page, command in EXAMPLES])
def test_a_curl_example_answers(request, arguments):
    url = _url(arguments)
    encoder = any(url.endswith(path) for path in ENCODER_PATHS)
    server = request.getfixturevalue("encoders_server" if encoder else "server")
    command = ["curl", "--silent", "--show-error", "--fail-with-body", "--max-time", "300",
               *[EXAMPLE_HOST.sub(server.url, word) if word == url else word for word in arguments]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=330)
    assert done.returncode == 0, done.stderr + done.stdout
    body = done.stdout
    if "-N" in arguments:  # a streamed answer: server-sent events, ended by "data: [DONE]"
        events = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) > 2
        assert all(json.loads(event)["object"] == "chat.completion.chunk" for event in events[:-1])
    elif encoder:
        assert all(len(item["embedding"]) == 384 for item in json.loads(body)["data"])
    elif not url.endswith("/metrics"):
        assert json.loads(body)  # a JSON answer, not an error page
    else:
        assert "vllm:num_requests_running" in body
