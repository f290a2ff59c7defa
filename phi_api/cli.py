"""Command-line interface: ``python -m phi_api <command>``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m phi_api", description="phi-api command-line tools")
    commands = parser.add_subparsers(dest="command", required=True)

    prepare = commands.add_parser(
        "prepare-model",
        help="convert the default model (SmolLM2-135M-Instruct) and print its folder as the last line",
    )
    prepare.add_argument("--output", type=Path, help="model folder to create (default: the phi-api cache)")
    prepare.set_defaults(run=_prepare_model)

    args = parser.parse_args(argv)
    return args.run(args)


def _prepare_model(args: argparse.Namespace) -> int:
    from phi_api.prepare import PreparationError, prepare_default_model

    try:
        folder = prepare_default_model(args.output)
    except PreparationError as exc:
        print(f"prepare-model failed: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0
