"""The README's curl examples, run as written with curl against the real server.

The examples that load, unload or delete models name a folder that exists only on the reader's machine; the
model-management tests cover those routes. Every other example must answer as the README says.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
README_HOST = re.compile(r"^(http://)?localhost:8000")
CHANGES_MODELS = re.compile(r"/(load|unload|delete)$")


def curl_examples() -> list[list[str]]:
    """Each ``curl`` command of the README's ``sh`` blocks, as its argument list (comments dropped)."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    commands = [words[1:] for block in blocks for words in _shell_commands(block) if words[0] == "curl"]
    return [command for command in commands if not CHANGES_MODELS.search(_url(command))]


def _shell_commands(block: str) -> list[list[str]]:
    """A block's commands: lines joined while a quote is open (a JSON body over several lines) or end in ``\\``."""
    commands, pending = [], ""
    for line in block.replace("\\\n", " ").splitlines(keepends=True):
        pending += line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an unclosed quote: the command goes on
            continue
        if words:
            commands.append(words)
        pending = ""
    return commands


def _url(arguments: list[str]) -> str:
    return next(word for word in arguments if README_HOST.match(word))


EXAMPLES = curl_examples()


def test_the_readme_shows_curl_examples_of_each_protocol():
    paths = {README_HOST.sub("", _url(command)) for command in EXAMPLES}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/api/generate",
            "/metrics"} <= paths


@pytest.mark.parametrize("arguments", EXAMPLES, ids=[README_HOST.sub("", _url(command)) for command in EXAMPLES])
def test_a_readme_curl_example_answers(server, arguments):
    url = _url(arguments)
    command = ["curl", "--silent", "--show-error", "--fail-with-body", "--max-time", "300",
               *[README_HOST.sub(server.url, word) if word == url else word for word in arguments]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=330)
    assert done.returncode == 0, done.stderr + done.stdout
    body = done.stdout
    if "-N" in arguments:  # a streamed answer: server-sent events, ended by "data: [DONE]"
        events = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) > 2
        assert all(json.loads(event)["object"] == "chat.completion.chunk" for event in events[:-1])
    elif not url.endswith("/metrics"):
        assert json.loads(body)  # a JSON answer, not an error page
    else:
        assert "vllm:num_requests_running" in body
