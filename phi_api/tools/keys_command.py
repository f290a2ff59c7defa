"""``phi-api keys add NAME``: a new API key, printed once and kept in the keys file as its SHA-256 only.

The keys file is ``--file`` or ``API_KEYS_FILE``; it is made (readable by its owner alone) if it does not exist, and
rewritten through a temporary file renamed into place, keeping its mode. The server reads it at start-up: restart
it (or its workers) to accept the new key.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from pathlib import Path
from typing import Any

from phi_api.errors import ConfigError
from phi_api.limits.keys import LIMITS, digest, read_keys

KEY_PREFIX = "sk-phi-"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("add",), help="add: make a new key")
    parser.add_argument("name", help="the key's name (what logs, metrics and usage show)")
    parser.add_argument("--file", default=os.environ.get("API_KEYS_FILE", ""),
                        help="the keys file (default: API_KEYS_FILE)")
    parser.add_argument("--admin", action="store_true", help="the key manages models and sees every key's data")
    for limit in (*LIMITS, "max_concurrent_requests"):
        parser.add_argument(f"--{limit.replace('_', '-')}", type=int, dest=limit, metavar="N")


def add_key(path: Path, name: str, fields: dict[str, Any]) -> str:
    """Add a key called ``name`` (with ``fields``: limits, admin) to the keys file at ``path``; the key itself, which
    is kept nowhere."""
    entries: list[Any] = json.loads(path.read_text(encoding="utf-8"))["keys"] if path.exists() else []
    if any(isinstance(entry, dict) and entry.get("name") == name for entry in entries):
        raise ConfigError(f"{path} already has a key called {name}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    entries.append({"name": name, "key_sha256": digest(key).hex(), **fields})
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w", encoding="utf-8") as file:
        json.dump({"keys": entries}, file, indent=2)
        file.write("\n")
    os.chmod(temporary, mode)
    read_keys(str(temporary), ())  # the file as the server will read it
    os.replace(temporary, path)
    return key


def main(args: argparse.Namespace) -> int:
    if not args.file:
        print("phi-api keys: no keys file: give --file or set API_KEYS_FILE")
        return 2
    fields: dict[str, Any] = {limit: getattr(args, limit) for limit in (*LIMITS, "max_concurrent_requests")
                              if getattr(args, limit) is not None}
    if args.admin:
        fields["admin"] = True
    try:
        key = add_key(Path(args.file).expanduser(), args.name, fields)
    except (ConfigError, OSError, ValueError, KeyError) as error:
        print(f"phi-api keys: {error}")
        return 1
    print(f"Key {args.name} added to {args.file} (as its SHA-256; restart the server to accept it).")
    print("It is shown this once; keep it now:")
    print(key)
    return 0
