"""Command-line interface: ``phi-api <command>`` (or ``python -m phi_api``), a thin adapter over the commands'
own modules; the benchmarks are grouped under ``phi-api bench <name>``.

Each command's module declares its arguments (``add_cli_args``) and runs it (``main``), as vLLM's benchmarks do;
only the chosen command's module is imported.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

# command -> (its module, what it does)
COMMANDS = {
    "serve": ("phi_api.tools.serve", "serve with gunicorn and phi-api's configuration (flags for the common "
              "settings; the environment for all); without a model, the default one, prepared first"),
    "chat": ("phi_api.tools.chat", "a terminal chat with a running server, answers streamed"),
    "pull": ("phi_api.tools.pull", "download a model by name (an alias, or REPO[/SUBFOLDER][@REVISION] on the "
             "Hugging Face Hub), check it, and print its folder"),
    "prepare-model": ("phi_api.tools.prepare_command", "convert the default model (SmolLM2-135M-Instruct), build a "
                      "random-weight benchmark model of a production shape, or export an embedding or reranking "
                      "model (--embedding, --encoder), and print its folder as the last line"),
    "build-kernel": ("phi_api.tools.build_kernel", "build phi-api's own 4-bit kernel for ONNX Runtime (make install "
                     "runs it); where it cannot run, say why: ONNX Runtime's kernel serves instead"),
    "settings": ("phi_api.tools.settings_command", "every setting: its default, its value here, what it means"),
    "keys": ("phi_api.tools.keys_command", "add an API key to the keys file: printed once, kept as its SHA-256"),
    "check": ("phi_api.tools.check", "check the configuration and the model folders without starting: misspelt "
              "settings, bad values, missing folders; print the workers, threads and memory it gives"),
}

# phi-api bench <name> -> (its module, what it measures)
BENCHES = {
    "serving": ("phi_api.bench.serving", "a server against the raw engine (and other servers): first token, "
                "decode, concurrent streams, prompt reuse, static batches, memory"),
    "spec": ("phi_api.bench.speculative", "speculative decoding on against off: copying, chat, 8 streams, "
             "step costs and the projected speed-up"),
    "sources": ("phi_api.bench.sources", "where drafts come from (the prompt, a prediction, the key's earlier "
                "answers) on JSON extraction, a tool loop and a predicted edit, against speculation off"),
    "turns": ("phi_api.bench.turns", "a request resumed from a kept prefix (the same prompt again, the next "
              "turn): its first token, against another checkout's server"),
    "draft": ("phi_api.bench.draftmodel", "a draft model's own effect: speculation with it against without it, "
              "on chat and copying, with each source's kept draft tokens"),
    "disk": ("phi_api.bench.prefixdisk", "prompts read from disk against computed: across a restart, across "
             "workers, and decoding while the disk tier writes"),
    "batch": ("phi_api.bench.batches", "a live request's first token while a batch runs, against idle and "
              "against the same load sent live"),
    "tenants": ("phi_api.bench.tenants", "the gevent hub's longest stall while several keys stream, chain "
                "stored responses and run a batch"),
    "replicas": ("phi_api.bench.replicas", "two replicas behind nginx (the shipped site) against one, and "
                 "cache affinity"),
    "database": ("phi_api.bench.database", "what PostgreSQL (DATABASE_URL) adds to a request with a key, "
                 "against SQLite"),
    "cpu": ("phi_api.bench.cpu", "where the CPU goes while concurrent streams run (Linux)"),
    "kv": ("phi_api.bench.kv", "int8 keys and values against float32: accuracy and memory"),
    "quality": ("phi_api.bench.quality", "a build's perplexity and top-1 agreement against the float32 build "
                "of the same source, and its decode speed"),
    "loops": ("phi_api.bench.loops", "open prompts at the server's defaults: the share of answers that run to "
              "the token limit in a repeating loop, per sampling configuration"),
    "structured": ("phi_api.bench.structured", "forced tool calls and json_schema answers: the share that "
                   "comes out whole and valid (greedy)"),
    "kernels": ("phi_api.bench.kernels", "ONNX Runtime's 4-bit matrix kernel at 1 to 16 rows: alone at "
                "Phi-3.5-mini's weight shapes, and in a model's decode steps (4-bit or 8-bit weights)"),
    "profile": ("phi_api.bench.profile", "where a step's time goes, operator by operator (ONNX Runtime's "
                "profiler): decode steps of 1 to 8 rows and a prompt chunk, on the graph the server computes with"),
    "attention": ("phi_api.bench.attention", "one attention layer alone: phi-api's operator against ONNX Runtime's "
                  "(int8 and float32 keys and values), decode steps and prompt chunks at long contexts"),
    "long": ("phi_api.bench.longctx", "long prompts (1k to 16k tokens) and decode at long contexts (1 and 8 "
             "streams): the server beside the raw engine, as shares of the machine's limits"),
    "roofline": ("phi_api.bench.roofline", "this machine's limits: the int8 dot-product peak and the read bandwidth"),
    "embeddings": ("phi_api.bench.embeddings", "/v1/embeddings against a raw ONNX Runtime session on the same "
                   "folder (1 to 128 inputs, short and long), and an embedding's latency while chats stream"),
    "load": ("phi_api.bench.load", "bursts far beyond the concurrency limit, a soak (--minutes), or a mixed "
             "load (--mixed)"),
}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="phi-api", description="phi-api: serve models and the tools around it")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    words = [word for word in argv if not word.startswith("-")]
    _add_commands(commands, COMMANDS, words[0] if words else None)
    bench = commands.add_parser("bench", help="the benchmarks, by name (phi-api bench --help lists them)",
                                description="the benchmarks: each runs in one process and prints what it measured")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    _add_commands(benches, BENCHES, words[1] if words[:1] == ["bench"] and len(words) > 1 else None)
    args = parser.parse_args(argv)
    return args.run(args)


def _add_commands(group: Any, table: dict[str, tuple[str, str]], chosen: str | None) -> None:
    """One parser per entry of ``table``; only the chosen entry's module is imported, for its arguments."""
    for name, (module_name, description) in table.items():
        command = group.add_parser(name, help=description, description=description)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_cli_args(command)
            command.set_defaults(run=module.main)
