"""A throwaway PostgreSQL cluster on loopback, from Debian's ``postgresql`` package: for the tests of replicas that
share a database, and the benchmark of what the database adds to a request.

``initdb`` into a temporary folder, ``pg_ctl start`` on a free port (trust authentication, loopback only, no
fsync: the data is thrown away), one database; stopped and removed at the end. PostgreSQL refuses to run as root:
as root, it runs as the package's ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from phi_api.bench.server import free_port
from phi_api.errors import ServerError

SYSTEM_USER = "postgres"


def binaries() -> Path:
    """The folder of PostgreSQL's server programs (``initdb``, ``pg_ctl``), the newest installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[-3]))
    if not folders:
        raise ServerError("PostgreSQL's server is not installed: apt-get install postgresql")
    return Path(folders[-1]).parent


class Postgres:
    """A cluster of its own; :attr:`url` is its database's ``postgresql://`` URL once started."""

    def __init__(self, database: str = "phi_api") -> None:
        self.database = database
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/{database}"
        self.folder: Path | None = None

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", SYSTEM_USER, "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise ServerError(f"{Path(command[0]).name} failed: {done.stdout}{done.stderr}")

    def start(self) -> Postgres:
        """Start the server (made at the first start, with its database)."""
        bin_dir = binaries()
        made = self.folder is None
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="phi-api-postgres-"))
            self.folder.chmod(0o755)
            if os.geteuid() == 0:
                shutil.chown(self.folder, SYSTEM_USER, SYSTEM_USER)
            self._run(str(bin_dir / "initdb"), "-D", str(self.folder / "data"), "-A", "trust", "-U", "postgres",
                      "--no-sync", "-E", "UTF8")
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        self._run(str(bin_dir / "pg_ctl"), "-D", str(self.folder / "data"), "-o", options, "-l",
                  str(self.folder / "server.log"), "-w", "-t", "60", "start")
        if made:
            self._run(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                      self.database)
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: pg_ctl's ``fast`` or ``immediate``); the cluster stays, to start again."""
        if self.folder is not None and (self.folder / "data" / "postmaster.pid").exists():
            self._run(str(binaries() / "pg_ctl"), "-D", str(self.folder / "data"), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        self.stop("immediate")
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()
