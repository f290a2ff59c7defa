"""The README's quickstart, run as written: three commands, ``make serve`` from the checkout (the environment
``make test`` made, and the default model it prepared), its ``curl`` against that server, and ``make chat`` in a
pseudo-terminal. Only the port differs: a free one, through ``SERVER_PORT``, which both make targets read."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from phi_api.bench.server import free_port
from tests.support.readme import section, sh_blocks, shell_commands
from tests.support.server import answers_health, wait_until
from tests.support.terminal import read_until

CHECKOUT = Path(__file__).resolve().parents[2]
BLOCKS = sh_blocks(section((CHECKOUT / "README.md").read_text(encoding="utf-8"), "Quickstart"))
QUICKSTART = shell_commands(BLOCKS[0])
WITH_EMBEDDING = shell_commands(BLOCKS[1])  # the second block: an embedding model beside the chat model


def test_the_quickstart_holds_three_commands():
    assert [words[:2] for words in QUICKSTART] == [["make", "serve"], ["curl", QUICKSTART[1][1]], ["make", "chat"]]
    assert QUICKSTART[1][1].startswith("http://localhost:8000/")


@contextlib.contextmanager
def make_serve(command: list[str], tmp_path: Path, user_cache: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """``command`` (``make serve`` as the README writes it), in the checkout; the server's port and folders are the
    test's, its cache one of the test's own that holds the models `make test` prepared in the user's cache (and the
    kernel the run's cache holds): the host's files it makes stay out of the user's cache."""
    port = free_port()
    cache = tmp_path / "cache"
    (cache / "runtime").mkdir(parents=True)
    if (user_cache / "models").is_dir():
        (cache / "models").symlink_to(user_cache / "models")
    kernels = Path(os.environ["PHI_API_CACHE_DIR"]) / "runtime" / "kernels"
    if kernels.is_dir():
        (cache / "runtime" / "kernels").symlink_to(kernels)
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "SERVER_PORT": str(port),
               "SERVER_HOST": "127.0.0.1", "DATA_DIR": str(tmp_path / "data"),
               "PREFIX_CACHE_DIR": str(tmp_path / "prefixes"), "PHI_API_CACHE_DIR": str(cache)}
    log_path = tmp_path / "make-serve.log"
    with log_path.open("w") as log:
        make = subprocess.Popen(command, cwd=CHECKOUT, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(answers_health(make, url, log_path), timeout=900, interval=0.5,
                       message="make serve to answer /health")
            yield url, environ
        finally:
            os.killpg(make.pid, signal.SIGTERM)
            make.wait(timeout=60)


@pytest.fixture
def quickstart_server(tmp_path, user_cache):
    with make_serve(QUICKSTART[0], tmp_path, user_cache) as served:
        yield served


def run_curl(url: str, words: list[str]) -> dict:
    """A README ``curl`` against the test's server; its JSON answer."""
    curl = [url + word.removeprefix("http://localhost:8000") if word.startswith("http://localhost:8000") else word
            for word in words]
    done = subprocess.run([*curl, "--silent", "--show-error", "--fail-with-body", "--max-time", "300"],
                          capture_output=True, text=True, timeout=330)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def test_the_second_block_serves_an_embedding_model_beside_the_chat_model(tmp_path, user_cache):
    assert [words[:2] for words in WITH_EMBEDDING] == [["make", "serve"], ["curl", WITH_EMBEDDING[1][1]]]
    with make_serve(WITH_EMBEDDING[0], tmp_path, user_cache) as (url, _):
        answer = run_curl(url, WITH_EMBEDDING[1])
        assert [len(item["embedding"]) for item in answer["data"]] == [384, 384]
        models = {model["id"]: model["task"] for model in requests.get(url + "/v1/models", timeout=30).json()["data"]}
        assert models == {"smollm2-135m-instruct": "generate", "all-minilm-l6-v2": "embed"}


def test_the_quickstart_s_commands_run_as_written(quickstart_server):
    url, environ = quickstart_server
    answer = run_curl(url, QUICKSTART[1])
    assert answer["object"] == "chat.completion" and answer["model"] == "smollm2-135m-instruct"
    assert answer["choices"][0]["message"]["content"].strip(), answer

    main, terminal = pty.openpty()
    chat = subprocess.Popen(QUICKSTART[2], cwd=CHECKOUT, env=environ, stdin=terminal, stdout=terminal,
                            stderr=terminal)
    os.close(terminal)
    try:
        assert b"Chatting with smollm2-135m-instruct" in read_until(main, b"> ")
        os.write(main, b"What is the capital of France?\n")
        shown = read_until(main, b"\r\n> ").decode().replace("\r\n", "\n")
        question, _, printed = shown.partition("\n")
        assert question == "What is the capital of France?" and printed[:-len("\n> ")].strip(), shown
        os.write(main, b"\x04")  # Ctrl-D, as the README says, ends it
        assert chat.wait(timeout=60) == 0
    finally:
        chat.kill()
        os.close(main)
