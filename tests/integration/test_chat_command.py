"""``phi-api chat`` in a pseudo-terminal against real gunicorn: the streamed answer is the server's answer, the
conversation goes on, and end of input ends it."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server
from tests.support.terminal import read_until

PROMPT = b"\r\n> "


@pytest.fixture(scope="module")
def exact_server(model_path, logs_dir):
    """PREFIX_CACHE=exact: the second turn answers bit for bit as cold, whatever either client sent before (with
    reuse of an earlier answer's keys, a greedy near-tie may flip: docs/identical-answers.md)."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE="exact") as running:
        yield running


def test_phi_api_chat_streams_the_server_s_answer_in_a_terminal(exact_server):
    server = exact_server
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    questions = ["What is the capital of France?", "And of Italy?"]
    expected, history = [], []
    for question in questions:  # greedy: the answers the chat must print, asked with the SDK
        history.append({"role": "user", "content": question})
        answer = client.chat.completions.create(model=MODEL_ID, messages=history, max_tokens=24, temperature=0)
        expected.append(answer.choices[0].message.content)
        history.append({"role": "assistant", "content": expected[-1]})
    main, terminal = pty.openpty()
    chat = subprocess.Popen([sys.executable, "-m", "phi_api", "chat", "--url", server.url, "--temperature", "0",
                             "--max-tokens", "24"], stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    try:
        assert f"Chatting with {MODEL_ID}".encode() in read_until(main, b"> ")
        for question, answer in zip(questions, expected, strict=True):
            os.write(main, question.encode() + b"\n")
            shown = read_until(main, PROMPT).decode().replace("\r\n", "\n")
            echoed, _, printed = shown.partition("\n")
            assert echoed == question, shown
            assert printed[:-len("\n> ")].strip() == answer.strip() and answer.strip(), (printed, answer)
        os.write(main, b"\x04")  # end of input
        assert chat.wait(timeout=30) == 0
    finally:
        chat.kill()
        os.close(main)
