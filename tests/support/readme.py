"""The shell commands of a Markdown page's ``sh`` blocks, as the tests that run them read them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path


def sh_blocks(text: str) -> list[str]:
    """The bodies of the page's ```sh blocks, in order."""
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def section(text: str, heading: str) -> str:
    """The text under ``## heading``, up to the next heading of that level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def shell_commands(block: str) -> list[list[str]]:
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


def page_commands(path: Path) -> list[list[str]]:
    """Every command of every ``sh`` block of the page at ``path``."""
    return [words for block in sh_blocks(path.read_text(encoding="utf-8")) for words in shell_commands(block)]
