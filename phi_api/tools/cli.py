"""Command-line interface: ``python -m phi_api <command>``, a thin adapter over the commands' own modules.

Each command's module declares its arguments (``add_cli_args``) and runs it (``main``), as vLLM's benchmarks do;
only the chosen command's module is imported.
"""

from __future__ import annotations

import argparse
import importlib

# command -> (its module, what it does)
COMMANDS = {
    "prepare-model": ("phi_api.tools.prepare_command", "convert the default model (SmolLM2-135M-Instruct), or build a "
                      "random-weight benchmark model of a production shape, and print its folder as the last line"),
    "pull": ("phi_api.tools.pull", "download a model by name (an alias, or REPO[/SUBFOLDER][@REVISION] on the "
             "Hugging Face Hub), check it, and print its folder"),
    "serve": ("phi_api.tools.serve", "serve with gunicorn and phi-api's configuration (flags for the common "
              "settings; the environment for all); without a model, the default one, prepared first"),
    "chat": ("phi_api.tools.chat", "a terminal chat with a running server, answers streamed"),
    "settings": ("phi_api.tools.settings_command", "every setting: its default, its value here, what it means"),
    "check": ("phi_api.tools.check", "check the configuration and the model folders without starting: misspelt "
              "settings, bad values, missing folders; print the workers, threads and memory it gives"),
    "bench": ("phi_api.tools.bench.serving", "measure a server against the raw engine (and other servers)"),
    "bench-replicas": ("phi_api.tools.bench.replicas", "two replicas behind nginx (the shipped site) against one, "
                       "and cache affinity"),
    "bench-cpu": ("phi_api.tools.bench.cpu", "where the CPU goes while concurrent streams run (Linux)"),
    "bench-kv": ("phi_api.tools.bench.kv", "int8 keys and values against float32: accuracy and memory"),
    "bench-quality": ("phi_api.tools.bench.quality", "a build's perplexity and top-1 agreement against the float32 "
                      "build of the same source, and its decode speed"),
    "bench-structured": ("phi_api.tools.bench.structured", "forced tool calls and json_schema answers: the share "
                         "that comes out whole and valid (greedy)"),
    "bench-spec": ("phi_api.tools.bench.speculative", "speculative decoding on against off: copying, chat, 8 "
                   "streams, step costs and the projected speed-up"),
    "bench-disk": ("phi_api.tools.bench.prefixdisk", "prompts read from disk against computed: across a restart, "
                   "across workers, and decoding while the disk tier writes"),
    "bench-batch": ("phi_api.tools.bench.batches", "a live request's first token while a batch runs, against idle "
                    "and against the same load sent live"),
    "bench-tenants": ("phi_api.tools.bench.tenants", "the gevent hub's longest stall while several keys stream, chain "
                      "stored responses and run a batch"),
    "load": ("phi_api.tools.bench.load", "bursts far beyond the concurrency limit, or a soak (--minutes)"),
}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="phi-api", description="phi-api: serve models and the tools around it")
    commands = parser.add_subparsers(dest="command", required=True)
    chosen = next((word for word in argv if not word.startswith("-")), None)
    for name, (module_name, description) in COMMANDS.items():
        command = commands.add_parser(name, help=description, description=description)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_cli_args(command)
            command.set_defaults(run=module.main)
    args = parser.parse_args(argv)
    return args.run(args)
