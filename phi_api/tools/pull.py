"""``python -m phi_api pull NAME``: download a model by name, check it, and print its folder."""

from __future__ import annotations

import argparse
import json
import sys

from phi_api.errors import PullError
from phi_api.models.pull import catalog_lines, pull


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="the model (without it: the catalog)")
    parser.add_argument("--json", action="store_true", help="progress as JSON lines on stdout (Ollama's pull events), "
                                                            "the last one {\"status\": \"success\", \"path\": ...}")


def main(args: argparse.Namespace) -> int:
    if not args.name:
        print("\n".join(catalog_lines()))
        return 0
    if args.json or not sys.stderr.isatty():  # progress bars only on a terminal; quiet lines otherwise
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    def event(item: dict) -> None:
        print(json.dumps(item), flush=True)

    try:
        folder = pull(args.name, say=lambda line: print(line, file=sys.stderr, flush=True),
                      report=event if args.json else lambda item: None)
    except PullError as error:
        if args.json:
            event({"error": str(error)})
        print(f"phi-api pull: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"status": "success", "path": str(folder)}) if args.json else folder, flush=True)
    return 0
