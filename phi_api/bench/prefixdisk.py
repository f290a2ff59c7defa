"""``python -m phi_api bench disk``: prompts on disk (``PREFIX_CACHE_DIR``) against computing them, in one run.

A document of about ``--prompt-tokens`` tokens is the system prompt of a chat; each run uses a document of its own,
so that nothing but the disk tier knows it. Greedy, 8 tokens, streamed; first-token times are medians over the runs.

- Across a restart: a server of two workers answers a question about each document (cold), then stops; a new
  server on the same folder answers another question about the same document (its prefix read from disk). With
  ``--drop-caches`` (root), the page cache is dropped before, so the chunks come from the device, not memory.
- Across workers: on one server, worker A answers a question about a document (cold), then worker B another
  (read from disk: B never saw the document).
- What storing costs a prompt: a ~300-token prompt's first token, the tier on against off (the servers asked in
  turn), each prompt its own.
- Decoding while the disk tier writes: a long answer streams while another request's document is prefilled
  (and written, when the tier is on); its decode rate with the tier on against ``PREFIX_CACHE_DISK_MB=0``, the
  two servers used alternately, one idle while the other works.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.client import StreamResult, stream_completion
from phi_api.bench.common import median, say
from phi_api.bench.server import Server

MODEL_ID = "bench-model"
CHAT = "/v1/chat/completions"
CHUNK = 64  # PREFILL_CHUNK_TOKENS, the default


def document(seed: int, tokens: int) -> str:
    """A ledger of about ``tokens`` tokens (a line is about 29 with the default model's tokenizer), unique to
    ``seed``."""
    lines = max(1, tokens // 29)
    return "You keep the harbour's ledger. " + " ".join(
        f"Entry {seed}.{i}: ship {i * 7 + seed} left pier {i % 9} with {i * 3 + seed % 11} crates of salt." for i in
        range(lines))


def ask(url: str, text: str, question: str, session: requests.Session | None = None) -> StreamResult:
    body = {"model": MODEL_ID, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": question}]}
    return stream_completion(url, body, session, CHAT)


def stored(folder: Path) -> int:
    return len(list(folder.rglob("*.kv")))


def wait_written(folder: Path, chunks: int, timeout: float = 120) -> None:
    """Until the folder holds ``chunks`` chunks (the writer works after the answer is sent)."""
    deadline = time.monotonic() + timeout
    while stored(folder) < chunks:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the disk tier wrote {stored(folder)} of {chunks} chunks in {timeout}s")
        time.sleep(0.05)


def across_restart(model_path: str, log_dir: Path, runs: int, tokens: int, drop_caches: bool) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="phi-api-disk-"))
    settings: dict[str, Any] = dict(MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2,
                                    PREFIX_CACHE_DIR=folder)
    docs = [document(int(time.time()) % 10_000 * 10 + run, tokens) for run in range(runs)]
    cold: list[StreamResult] = []
    with Server(log_dir, **settings) as server:
        for text in docs:
            before = stored(folder)
            cold.append(ask(server.url, text, "Which ship left pier 3 first?"))
            wait_written(folder, before + (cold[-1].prompt_tokens or 0) // CHUNK)
    if drop_caches:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    with Server(log_dir, **settings) as server:
        warm = [ask(server.url, text, "How many crates did the last ship carry?") for text in docs]
    return _pair(cold, warm)


def across_workers(model_path: str, log_dir: Path, runs: int, tokens: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="phi-api-disk-"))
    cold: list[StreamResult] = []
    warm: list[StreamResult] = []
    with Server(log_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2,
                PREFIX_CACHE_DIR=folder) as server:
        first, second = (server.session_to(pid) for pid in server.worker_pids()[:2])
        for run in range(runs):
            text = document(int(time.time()) % 10_000 * 10 + 5 + run, tokens)
            before = stored(folder)
            cold.append(ask(server.url, text, "Which ship left pier 3 first?", first))
            wait_written(folder, before + (cold[-1].prompt_tokens or 0) // CHUNK)
            warm.append(ask(server.url, text, "How many crates did the last ship carry?", second))
            first, second = second, first  # each worker computes as often as it reads
            first.get(server.url + "/health", timeout=10)  # keep both connections alive
            second.get(server.url + "/health", timeout=10)
    return _pair(cold, warm)


def _pair(cold: list[StreamResult], warm: list[StreamResult]) -> dict[str, Any]:
    return {"prompt_tokens": median([float(r.prompt_tokens or 0) for r in warm]),
            "cached_tokens": median([float(r.cached_tokens or 0) for r in warm]),
            "cold_ttft_s": median([r.ttft for r in cold]), "read_ttft_s": median([r.ttft for r in warm]),
            "ratio": median([r.ttft for r in warm]) / median([r.ttft for r in cold])}


def decoding_while_writing(model_path: str, log_dir: Path, runs: int, tokens: int, answer: int) -> dict[str, Any]:
    """The decode rate of a stream while another prompt is prefilled (and written), the tier on and off."""
    rates: dict[str, list[float]] = {"on": [], "off": []}
    folder = Path(tempfile.mkdtemp(prefix="phi-api-disk-"))
    base: dict[str, Any] = dict(MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE_DIR=folder)
    with Server(log_dir, **base) as on, Server(log_dir, PREFIX_CACHE_DISK_MB=0, **base) as off:
        for run in range(runs):
            for name, server in (("on", on), ("off", off)) if run % 2 == 0 else (("off", off), ("on", on)):
                seed = int(time.time()) % 10_000 * 10 + run
                rates[name].append(_decode_beside_prefill(server.url, document(seed, tokens), answer))
    return {"decode_tokens_per_s_on": median(rates["on"]), "decode_tokens_per_s_off": median(rates["off"]),
            "ratio": median(rates["on"]) / median(rates["off"]), "written_chunks": stored(folder)}


def first_token_on_off(model_path: str, log_dir: Path, runs: int) -> dict[str, Any]:
    """A ~300-token prompt's first token (each run a prompt of its own: nothing to read), the tier on against off,
    the two servers asked in turn: what storing costs a prompt."""
    from phi_api.bench.common import LONG_PROMPT

    times: dict[str, list[float]] = {"on": [], "off": []}
    folder = Path(tempfile.mkdtemp(prefix="phi-api-disk-"))
    base: dict[str, Any] = dict(MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, PREFIX_CACHE_DIR=folder)
    with Server(log_dir, **base) as on, Server(log_dir, PREFIX_CACHE_DISK_MB=0, **base) as off:
        for run in range(runs + 2):  # the first two warm the servers up
            for name, server in (("on", on), ("off", off)):
                body = {"model": MODEL_ID, "max_tokens": 1, "temperature": 0,
                        "prompt": f"{time.time_ns()} {run} {LONG_PROMPT}"}
                ttft = stream_completion(server.url, body).ttft
                if run >= 2:
                    times[name].append(ttft)
    return {"first_token_s_on": median(times["on"]), "first_token_s_off": median(times["off"]),
            "ratio": median(times["on"]) / median(times["off"])}


def _decode_beside_prefill(url: str, text: str, answer: int) -> float:
    body = {"model": MODEL_ID, "max_tokens": answer, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}
    result: list[StreamResult] = []
    stream = threading.Thread(target=lambda: result.append(stream_completion(url, body, path=CHAT)))
    stream.start()
    ask(url, text, "Which ship left pier 3 first?")
    stream.join()
    return result[0].decode_rate or 0.0


def run(options: Any) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="phi-api-bench-disk-"))
    report: dict[str, Any] = {"settings": {"runs": options.runs, "prompt_tokens": options.prompt_tokens},
                              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    parts = options.parts.split(",")
    if "restart" in parts:
        say(f"across a restart: {options.runs} documents cold, a restart, then read")
        report["across_restart"] = across_restart(options.model_path, log_dir, options.runs, options.prompt_tokens,
                                                  options.drop_caches)
    if "workers" in parts:
        say(f"across workers: {options.runs} documents cold on one worker, read on the other")
        report["across_workers"] = across_workers(options.model_path, log_dir, options.runs, options.prompt_tokens)
    if "first-token" in parts:
        say("a prompt's first token, the tier on against off")
        report["first_token"] = first_token_on_off(options.model_path, log_dir, max(options.runs, 10))
    if "decoding" in parts:
        say("decoding while the disk tier writes, on against off")
        report["decoding_while_writing"] = decoding_while_writing(options.model_path, log_dir, options.runs,
                                                                  options.prompt_tokens, options.answer_tokens)
    report["goals"] = goals(report)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-disk.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    for line in report["goals"]:
        print(line)
    return report


GOALS = (("across_restart", "after a restart: first token <= 0.10x cold", lambda ratio: ratio <= 0.10),
         ("across_workers", "another worker's prompt: first token <= 0.10x cold", lambda ratio: ratio <= 0.10),
         ("decoding_while_writing", "decoding while the tier writes >= 0.97x without it", lambda ratio: ratio >= 0.97))


def goals(report: dict[str, Any]) -> list[str]:
    """The issue's goals, met or not, for the measurements this run made."""
    return [f"[{'    met' if met(report[key]['ratio']) else 'NOT met'}] {text}: {report[key]['ratio']:.3f}x"
            for key, text, met in GOALS if key in report]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder the servers serve")
    parser.add_argument("--runs", type=int, default=3, help="documents per measurement (medians are reported)")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="about how long each document is")
    parser.add_argument("--answer-tokens", type=int, default=64, help="the streamed answer's length while writing")
    parser.add_argument("--parts", default="restart,workers,first-token,decoding",
                        help="which measurements (comma-separated)")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before reading (root)")
    parser.add_argument("--out", default="bench/results", help="folder for bench-disk.json")


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
