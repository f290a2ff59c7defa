"""Command-line interface: ``python -m phi_api <command>``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m phi_api", description="phi-api command-line tools")
    commands = parser.add_subparsers(dest="command", required=True)

    prepare = commands.add_parser(
        "prepare-model",
        help="convert the default model (SmolLM2-135M-Instruct), or build a random-weight benchmark model of a "
             "production shape, and print its folder as the last line",
    )
    prepare.add_argument("--output", type=Path, help="model folder to create (default: the phi-api cache)")
    prepare.add_argument("--shape", choices=["phi-3.5-mini"],
                         help="build a random-weight model of this architecture instead (a benchmark model: its "
                              "answers are noise; ~8 GB of memory and a few minutes)")
    prepare.add_argument("--reference", action="store_true",
                         help="build the default model's float32 reference instead (what bench-quality compares "
                              "the served model with)")
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

    streams = argparse.ArgumentParser(add_help=False)  # what bench-replicas and bench-cpu both take
    streams.add_argument("--model-path", required=True, help="model folder the servers serve")
    streams.add_argument("--runs", type=int, default=3, help="measured runs (medians are reported)")
    streams.add_argument("--streams", type=int, default=8, help="concurrent streams")
    streams.add_argument("--max-tokens", type=int, default=128, help="tokens per streamed completion")
    commands.add_parser("bench-replicas", parents=[streams],
                        help="two replicas behind nginx (the shipped site) against one, and cache affinity",
                        ).set_defaults(run=_bench_replicas)
    commands.add_parser("bench-cpu", parents=[streams],
                        help="where the CPU goes while concurrent streams run (Linux)").set_defaults(run=_bench_cpu)

    kv = commands.add_parser("bench-kv", help="int8 keys and values against float32: accuracy and memory")
    kv.add_argument("--model-path", required=True, help="model folder")
    kv.add_argument("--tokens", type=int, default=1024, help="held-out tokens to teacher-force (at most)")
    kv.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    kv.add_argument("--out", help="also write the report to this JSON file")
    kv.set_defaults(run=_bench_kv)

    quality = commands.add_parser("bench-quality", help="a build's perplexity and top-1 agreement against the "
                                                        "float32 build of the same source, and its decode speed")
    quality.add_argument("--model-path", required=True, help="the served model folder")
    quality.add_argument("--reference-path", required=True, help="the float32 build (prepare-model --reference)")
    quality.add_argument("--compare", action="append", metavar="NAME=PATH", help="another build (repeatable)")
    quality.add_argument("--text", default=None, help="the fixed text (default: tests/data/quality-text.txt)")
    quality.add_argument("--tokens", type=int, default=1024, help="tokens of the text (default 1024)")
    quality.add_argument("--runs", type=int, default=5, help="alternating decode runs (medians are reported)")
    quality.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    quality.add_argument("--out", default="bench/results/bench-quality.json", help="the JSON report")
    quality.set_defaults(run=_bench_quality)

    structured = commands.add_parser("bench-structured", help="forced tool calls and json_schema answers: the share "
                                                              "that comes out whole and valid (greedy)")
    structured.add_argument("--url", help="a running server (default: start one on --model-path)")
    structured.add_argument("--model-path", help="model folder for the server it starts")
    structured.add_argument("--model", default="smollm2-135m-instruct", help="the served model id")
    structured.add_argument("--cases", default=None, help="the cases (default: tests/data/structured-cases.json)")
    structured.set_defaults(run=_bench_structured)

    spec = commands.add_parser("bench-spec", help="speculative decoding on against off: copying, chat, 8 streams, "
                                                  "step costs and the projected speed-up")
    spec.add_argument("--model-path", required=True, help="model folder the two servers serve")
    spec.add_argument("--shape-model-path", help="also measure step costs on this (production-shaped) model")
    spec.add_argument("--runs", type=int, default=3, help="repetitions (medians are reported)")
    spec.add_argument("--out", default="bench/results", help="folder for bench-spec.json")
    spec.set_defaults(run=_bench_spec)

    disk = commands.add_parser("bench-disk", help="prompts read from disk against computed: across a restart, "
                                                  "across workers, and decoding while the disk tier writes")
    disk.add_argument("--model-path", required=True, help="model folder the servers serve")
    disk.add_argument("--runs", type=int, default=3, help="documents per measurement (medians are reported)")
    disk.add_argument("--prompt-tokens", type=int, default=2000, help="about how long each document is")
    disk.add_argument("--answer-tokens", type=int, default=64, help="the streamed answer's length while writing")
    disk.add_argument("--parts", default="restart,workers,first-token,decoding",
                      help="which measurements (comma-separated)")
    disk.add_argument("--drop-caches", action="store_true", help="drop the page cache before reading (root)")
    disk.add_argument("--out", default="bench/results", help="folder for bench-disk.json")
    disk.set_defaults(run=_bench_disk)

    pull = commands.add_parser("pull", help="download a model by name (an alias, or REPO[/SUBFOLDER][@REVISION] on "
                                            "the Hugging Face Hub), check it, and print its folder")
    pull.add_argument("name", nargs="?", help="the model (without it: the catalog)")
    pull.add_argument("--json", action="store_true", help="progress as JSON lines on stdout (Ollama's pull events), "
                                                          "the last one {\"status\": \"success\", \"path\": ...}")
    pull.set_defaults(run=_pull)

    batch = commands.add_parser("bench-batch", help="a live request's first token while a batch runs, against "
                                                    "idle and against the same load sent live")
    batch.add_argument("--model-path", required=True, help="model folder the server serves")
    batch.add_argument("--runs", type=int, default=5, help="short requests per measurement (medians are reported)")
    batch.add_argument("--lines", type=int, default=40, help="lines of the batch")
    batch.add_argument("--answer-tokens", type=int, default=64, help="each line's answer length")
    batch.add_argument("--out", default="bench/results", help="folder for bench-batch.json")
    batch.set_defaults(run=_bench_batch)

    load = commands.add_parser("load", help="bursts far beyond the concurrency limit, or a soak (--minutes)")
    load.add_argument("--url", help="a running server (default: start one on --model-path)")
    load.add_argument("--model-path", help="model folder for the server it starts")
    load.add_argument("--pid", type=int, help="with --url: the gunicorn master's pid, to sample memory in a soak")
    load.add_argument("--model", default=None, help="the served model id (default: MODEL_ID or smollm2-135m-instruct)")
    load.add_argument("--limit", type=int, default=4, help="the server's MAX_CONCURRENT_REQUESTS (default 4)")
    load.add_argument("--workers", type=int, default=2, help="workers of the server it starts (default 2)")
    load.add_argument("--burst", type=int, default=64, help="requests released at once (default 64)")
    load.add_argument("--rounds", type=int, default=3, help="bursts (default 3)")
    load.add_argument("--max-tokens", type=int, default=16, help="tokens per request in a burst (default 16)")
    load.add_argument("--minutes", type=float, help="soak for this long instead of bursting")
    load.add_argument("--concurrency", type=int, default=4, help="soak clients (default 4)")
    load.add_argument("--mixed", action="store_true",
                      help="a mixed load (long prompts, conversations, short questions, n 3, abandoned streams) for "
                           "--minutes (default 5): peak PSS against MEMORY_LIMIT_MB, the longest first-token wait "
                           "by kind, generations ended by timeout")
    load.add_argument("--memory-limit-mb", type=float, default=0, help="MEMORY_LIMIT_MB of the server it starts")
    load.set_defaults(run=_load)

    args = parser.parse_args(argv)
    return args.run(args)


def _bench(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import run

    if not _has_server(args, "bench"):
        return 2
    run(args)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from phi_api.errors import PullError
    from phi_api.models.pull import catalog_lines, pull

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


def _bench_batch(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import batches

    batches.run(args)
    return 0


def _bench_disk(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import prefixdisk

    prefixdisk.run(args)
    return 0


def _bench_cpu(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import cpu

    cpu.run(args)
    return 0


def _bench_kv(args: argparse.Namespace) -> int:
    import os

    from phi_api.tools.bench import kv

    args.threads = args.threads or os.cpu_count() or 1
    kv.run(args)
    return 0


def _bench_quality(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import quality

    args.text = args.text or str(quality.DEFAULT_TEXT)
    quality.run(args)
    return 0


def _bench_structured(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import structured

    if not _has_server(args, "bench-structured"):
        return 2
    args.cases = args.cases or str(structured.DEFAULT_CASES)
    structured.run(args)
    return 0


def _bench_spec(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import speculative

    speculative.run(args)
    return 0


def _bench_replicas(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import replicas

    replicas.run(args)
    return 0


def _load(args: argparse.Namespace) -> int:
    from phi_api.tools.bench import load

    if not _has_server(args, "load"):
        return 2
    args.model = args.model or load.default_model()
    return load.run(args)


def _has_server(args: argparse.Namespace, command: str) -> bool:
    """Whether ``command`` was given a server to measure (``--url``) or a model folder to start one on."""
    if not args.url and not args.model_path:
        print(f"{command} needs --url or --model-path", file=sys.stderr)
        return False
    return True


def _prepare_model(args: argparse.Namespace) -> int:
    from phi_api.errors import PreparationError
    from phi_api.tools.prepare import prepare_default_model

    try:
        if args.shape:
            from phi_api.tools.random_models import SHAPES, prepare_shape_model

            # The tokenizer is the default model's (plus Phi-3's special tokens): prepare that first.
            folder = prepare_shape_model(SHAPES[args.shape], prepare_default_model(), args.output)
        else:
            folder = prepare_default_model(args.output, reference=args.reference)
    except PreparationError as exc:
        print(f"prepare-model failed: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0
