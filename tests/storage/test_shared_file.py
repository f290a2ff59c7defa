"""Stores sharing one SQLite file in one process (stored responses, conversations and background responses share
``responses.sqlite3``): a store opening the file must leave the others' locks in place, or another process's
connection, believing itself the last one, checkpoints and deletes the WAL under them and later writes are lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from phi_api.storage.conversations import ConversationStore
from phi_api.storage.database import sqlite_url
from phi_api.storage.responses import ResponseStore

_READ_AND_CLOSE = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM sqlite_master'); "
                   "c.close()")


def locks_held(path: Path) -> int:
    """How many POSIX locks this process holds on ``path`` (Linux's /proc/locks)."""
    inode, me = os.stat(path).st_ino, str(os.getpid())
    with open("/proc/locks") as table:
        return sum(1 for line in table if line.split()[4] == me and line.split()[5].endswith(f":{inode}"))


def test_a_second_store_on_the_file_keeps_the_first_s_locks_and_the_wal_stays_shared(tmp_path):
    path = tmp_path / "responses.sqlite3"
    responses = ResponseStore(sqlite_url(path), max_items=10, max_age=3600)
    responses.put({"id": "resp_1", "object": "response"}, [], "team-a")
    held = locks_held(path)
    assert held > 0  # the pooled connection's read lock, as SQLite's WAL mode keeps it
    conversations = ConversationStore(sqlite_url(path), 10, 1 << 20)
    conversations.create("conv_1", {}, [], "team-a")
    assert locks_held(path) == held
    subprocess.run([sys.executable, "-c", _READ_AND_CLOSE, str(path)], check=True)  # an operator's query
    assert Path(f"{path}-wal").exists()
    responses.put({"id": "resp_2", "object": "response"}, [], "team-a")
    fresh = ResponseStore(sqlite_url(path), max_items=10, max_age=3600)  # as another replica reads the file
    assert fresh.response("resp_2", "team-a") is not None
