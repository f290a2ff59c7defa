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

    bench = commands.add_parser("bench", help="measure a server against the raw engine (and other servers)")
    bench.add_argument("--url", help="an already running phi-api (default: start one on --model-path)")
    bench.add_argument("--model-path", help="model folder for the raw-engine reference and the server it starts")
    bench.add_argument("--compare", action="append", metavar="NAME=URL",
                       help="another OpenAI-compatible server to measure side by side (repeatable)")
    bench.add_argument("--server", action="append", metavar="NAME:KEY=VALUE,...",
                       help="also start and measure phi-api with these settings, e.g. "
                            "per-worker:PRELOAD_MODEL=false,WEB_CONCURRENCY=1 (repeatable)")
    bench.add_argument("--runs", type=int, default=3, help="repetitions per measurement (medians are reported)")
    bench.add_argument("--max-tokens", type=int, default=128, help="tokens per streamed completion")
    bench.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated concurrency levels")
    bench.add_argument("--no-memory", dest="memory", action="store_false",
                       help="skip the 1-worker/2-worker memory measurement")
    bench.add_argument("--out", default="bench/results", help="folder for bench.json and bench.png")
    bench.set_defaults(run=_bench)

    args = parser.parse_args(argv)
    return args.run(args)


def _bench(args: argparse.Namespace) -> int:
    from phi_api.bench import run

    if not args.url and not args.model_path:
        print("bench needs --url or --model-path", file=sys.stderr)
        return 2
    run(args)
    return 0


def _prepare_model(args: argparse.Namespace) -> int:
    from phi_api.prepare import PreparationError, prepare_default_model

    try:
        folder = prepare_default_model(args.output)
    except PreparationError as exc:
        print(f"prepare-model failed: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0
