"""``python -m phi_api settings``: every setting with its default, its value here and what it means, read from the
settings' one declaration (:mod:`phi_api.settings`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from phi_api.settings import Settings

SECRET = ("API_KEYS",)  # shown as set or not, never as its value


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per setting instead of a table")


def table(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each setting's name, default, value in ``environ`` (None when unset: the default applies) and description."""
    rows = []
    for field in dataclasses.fields(Settings):
        value = environ.get(field.name, "").strip() or None
        if value is not None and field.name in SECRET:
            value = "(set)"
        rows.append({"name": field.name, "default": field.default, "value": value,
                     "description": field.metadata["description"]})
    return rows


def main(args: argparse.Namespace) -> int:
    rows = table(os.environ)
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
        return 0
    for row in rows:
        shown = f"{row['value']} (default {row['default']!r})" if row["value"] is not None else repr(row["default"])
        print(f"{row['name']} = {shown}\n    {row['description']}")
    return 0
