"""Open WebUI (0.12.4, in a virtual environment of its own: requirements-openwebui.txt) in front of a real server
over its Ollama connection, as its users set it up: the model is listed, and a chat with the "Context Length"
setting (``num_ctx``, which Open WebUI forwards among Ollama's ``options``) goes through, streamed and not.

Open WebUI runs with no network (``HF_HUB_OFFLINE``, ``OFFLINE_MODE``: it skips its embedding model), no login
(``WEBUI_AUTH=False``) and a data folder of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import MODEL_ID
from tests.support.server import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
OPEN_WEBUI = REPO / ".venv-openwebui" / "bin" / "open-webui"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def open_webui(server, tmp_path_factory):
    """Open WebUI pointed at the server's Ollama API; its URL and a session token."""
    assert OPEN_WEBUI.exists(), "Open WebUI's environment is missing: `make test` builds .venv-openwebui"
    data = tmp_path_factory.mktemp("open-webui")
    port = free_port()
    env = {**os.environ, "DATA_DIR": str(data), "WEBUI_AUTH": "False", "OLLAMA_BASE_URL": server.url,
           "ENABLE_OPENAI_API": "False", "HF_HUB_OFFLINE": "1", "OFFLINE_MODE": "True",
           "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "False", "ENABLE_VERSION_UPDATE_CHECK": "False",
           "ANONYMIZED_TELEMETRY": "False", "DO_NOT_TRACK": "True", "SCARF_NO_ANALYTICS": "True"}
    with open(data / "open-webui.log", "wb") as log:
        process = subprocess.Popen([str(OPEN_WEBUI), "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=data)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert process.poll() is None, (data / "open-webui.log").read_text(errors="replace")[-3000:]
        try:
            return requests.get(url + "/health", timeout=2).ok
        except requests.RequestException:
            return False

    try:
        wait_until(up, 180, interval=0.5, message="Open WebUI")
        token = requests.post(url + "/api/v1/auths/signin", json={"email": "", "password": ""}, timeout=30).json()
        yield url, {"Authorization": f"Bearer {token['token']}"}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def chat(open_webui, stream: bool, num_ctx: int) -> requests.Response:
    url, headers = open_webui
    return requests.post(url + "/api/chat/completions", headers=headers, timeout=120, stream=stream, json={
        "model": MODEL_ID, "messages": QUESTION, "stream": stream,
        "params": {"num_ctx": num_ctx, "temperature": 0, "num_predict": 24}})


def test_open_webui_lists_the_model_over_its_ollama_connection(open_webui):
    url, headers = open_webui
    models = requests.get(url + "/api/models", headers=headers, timeout=30).json()["data"]
    assert MODEL_ID in [model["id"] for model in models]


def test_a_chat_with_a_context_length_goes_through(open_webui):
    answer = chat(open_webui, stream=False, num_ctx=2048)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]


def test_a_streamed_chat_with_a_context_length_goes_through(open_webui):
    answer = chat(open_webui, stream=True, num_ctx=2048)
    assert answer.status_code == 200
    events = [line.removeprefix("data: ") for line in answer.iter_lines(decode_unicode=True)
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(event)["choices"][0]["delta"].get("content") or "" for event in events[:-1]
                   if json.loads(event).get("choices"))
    assert text


def test_the_context_length_reaches_the_server(open_webui):
    """A context too small for the prompt: the server refuses it, so Open WebUI did forward num_ctx."""
    answer = chat(open_webui, stream=False, num_ctx=8)
    assert answer.status_code >= 400 or "error" in answer.json()
    assert "context" in answer.text.lower() or "num_ctx" in answer.text
