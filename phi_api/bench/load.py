"""Bounded load and soak against a running server (``python -m phi_api bench load``).

- Bursts: many requests released at once, far beyond ``MAX_CONCURRENT_REQUESTS``.
  Each must end in 200 (a stream: with ``data: [DONE]``) or 429; anything else
  (a 5xx, a dropped connection, a hang past the timeout) is counted as a failure.
  Afterwards every concurrency slot must be free again.
- Soak: steady streaming traffic for minutes, sampling the server's memory (the
  resident set of the master and its workers) and the tokens/s it delivers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests

from phi_api.bench.common import emit, needs_server

OK_OUTCOMES = frozenset({"200", "429"})


def request_body(model: str, index: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The ``index``-th request of a burst: chat and completions, streaming and not, in turn."""
    stream = index % 2 == 1
    if index % 4 < 2:
        return "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": f"Say {index}."}],
                                        "max_tokens": max_tokens, "stream": stream}
    return "/v1/completions", {"model": model, "prompt": f"Number {index}:", "max_tokens": max_tokens,
                               "stream": stream}


def one_request(url: str, path: str, body: dict[str, Any], timeout: float) -> str:
    """The outcome of one request: its status, ``"200"`` only for a complete answer, or ``error:<kind>``."""
    try:
        with requests.post(url + path, json=body, stream=True, timeout=timeout) as response:
            if response.status_code != 200:
                has_error = isinstance(response.json().get("error"), dict)  # every refusal carries one
                return str(response.status_code) if has_error else "error:no-error-object"
            if not body.get("stream"):
                return "200" if response.json().get("choices") else "error:malformed-response"
            last = b""
            for line in response.iter_lines():
                last = line or last
            return "200" if last == b"data: [DONE]" else "error:truncated-stream"
    except requests.Timeout:
        return "error:hang"
    except requests.ConnectionError:
        return "error:dropped-connection"
    except (ValueError, AttributeError):
        return "error:malformed-response"


@dataclass
class BurstResult:
    """Outcomes of one burst, by kind."""

    outcomes: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def failures(self) -> int:
        """Requests that ended in anything but 200 or 429."""
        return sum(count for outcome, count in self.outcomes.items() if outcome not in OK_OUTCOMES)


def burst(url: str, model: str, count: int, max_tokens: int = 16, timeout: float = 120.0) -> BurstResult:
    """Release ``count`` requests at the same moment and collect their outcomes."""
    outcomes: list[str] = [""] * count
    gate = threading.Barrier(count)

    def worker(index: int) -> None:
        path, body = request_body(model, index, max_tokens)
        gate.wait()
        outcomes[index] = one_request(url, path, body, timeout)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return BurstResult(Counter(outcomes), time.monotonic() - started)


def free_slots(url: str, model: str, wanted: int, timeout: float = 30.0) -> bool:
    """True once ``wanted`` streams can run at the same time (every slot came back), within ``timeout``."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {"model": model, "prompt": "Count:", "max_tokens": 2000, "ignore_eos": True,
                            "stream": True}
    while time.monotonic() < deadline:
        held = []
        try:
            for _ in range(wanted):
                response = requests.post(url + "/v1/completions", json=body, stream=True, timeout=60)
                held.append(response)
                if response.status_code != 200:
                    break
                next(line for line in response.iter_lines() if line)  # the stream runs: it holds a slot
            if len(held) == wanted and all(response.status_code == 200 for response in held):
                return True
        finally:
            for response in held:
                response.close()
        time.sleep(0.2)
    return False


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its children (gunicorn's master and workers)."""
    from phi_api.bench.server import children

    total = 0
    for each in [pid, *children(pid)]:
        try:
            with open(f"/proc/{each}/status", encoding="ascii") as status:
                total += next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


@dataclass
class SoakSample:
    """One window of a soak."""

    at_seconds: float
    rss_bytes: int
    tokens_per_second: float
    failures: int


def soak(url: str, model: str, minutes: float, concurrency: int, pid: int | None, window: float = 30.0,
         max_tokens: int = 64) -> list[SoakSample]:
    """Stream steadily from ``concurrency`` clients for ``minutes``; one sample per ``window`` seconds."""
    from phi_api.bench.client import stream_completion

    lock = threading.Lock()
    tokens = [0]
    failures = [0]
    stop_at = time.monotonic() + minutes * 60

    def client(index: int) -> None:
        body = {"model": model, "prompt": f"Tell a story about the number {index}.", "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0.8}
        while time.monotonic() < stop_at:
            try:
                result = stream_completion(url, body)
                with lock:
                    tokens[0] += result.tokens
            except (requests.RequestException, RuntimeError):
                with lock:
                    failures[0] += 1

    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    samples: list[SoakSample] = []
    while time.monotonic() < stop_at:
        time.sleep(min(window, max(0.0, stop_at - time.monotonic())))
        with lock:
            done, failed = tokens[0], failures[0]
            tokens[0] = failures[0] = 0
        elapsed = time.monotonic() - started - (samples[-1].at_seconds if samples else 0.0)
        samples.append(SoakSample(time.monotonic() - started, tree_rss_bytes(pid) if pid else 0,
                                  done / elapsed if elapsed > 0 else 0.0, failed))
        print(f"  {samples[-1].at_seconds:7.0f}s  rss {samples[-1].rss_bytes / 2**20:8.1f} MiB  "
              f"{samples[-1].tokens_per_second:7.1f} tok/s  failures {failed}", flush=True)
    for thread in threads:
        thread.join()
    return samples


def soak_summary(samples: list[SoakSample], warmup: int = 2) -> dict[str, Any]:
    """Memory growth after warm-up and tokens/s of the last windows against the first ones."""
    steady = samples[warmup:] if len(samples) > warmup + 1 else samples
    thirds = max(1, len(steady) // 3)
    first_rate = statistics.median(s.tokens_per_second for s in steady[:thirds])
    last_rate = statistics.median(s.tokens_per_second for s in steady[-thirds:])
    return {
        "windows": len(samples),
        "rss_growth": (steady[-1].rss_bytes / steady[0].rss_bytes - 1) if steady[0].rss_bytes else None,
        "tokens_per_second_first": first_rate,
        "tokens_per_second_last": last_rate,
        "tokens_per_second_ratio": last_rate / first_rate if first_rate else None,
        "failures": sum(s.failures for s in samples),
    }


def run(args: Any) -> int:
    """The ``load`` command: bursts (default) or a soak (``--minutes``), against ``--url`` or a server it starts."""
    from phi_api.bench.server import Server

    server = None
    url, pid = args.url, args.pid
    if not url:
        import tempfile
        from pathlib import Path

        extra = {"MEMORY_LIMIT_MB": args.memory_limit_mb} if args.memory_limit_mb else {}
        server = Server(Path(tempfile.mkdtemp(prefix="phi-api-load-")), MODEL_PATH=args.model_path,
                        MODEL_ID=args.model, MAX_CONCURRENT_REQUESTS=args.limit,
                        WEB_CONCURRENCY=args.workers, **extra).start()
        url, pid = server.url, server.master.pid
    try:
        if args.mixed:
            from phi_api.bench.mixed import report, run_mixed

            if pid is None:
                print("load --mixed with --url needs --pid (the gunicorn master's)", flush=True)
                return 2
            return 0 if report(run_mixed(url, args.model, args.minutes or 5, args.concurrency, pid), args.out) else 1
        if args.minutes:
            samples = soak(url, args.model, args.minutes, args.concurrency, pid)
            summary = soak_summary(samples)
            emit(summary, args.out)
            ok = summary["failures"] == 0 and (summary["rss_growth"] is None or summary["rss_growth"] < 0.05) \
                and (summary["tokens_per_second_ratio"] or 0) > 0.9
            return 0 if ok else 1
        failed = 0
        for round_ in range(args.rounds):
            result = burst(url, args.model, args.burst, args.max_tokens)
            back = free_slots(url, args.model, args.limit)
            print(f"burst {round_ + 1}: {args.burst} requests in {result.seconds:.1f}s: "
                  f"{dict(sorted(result.outcomes.items()))}; all {args.limit} slots back: {back}", flush=True)
            failed += result.failures + (not back)
        return 0 if failed == 0 else 1
    finally:
        if server is not None:
            server.stop()


def default_model() -> str:
    """The served model id the load command assumes (``MODEL_ID``, or the default model's)."""
    return os.environ.get("MODEL_ID", "smollm2-135m-instruct")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a running server (default: start one on --model-path)")
    parser.add_argument("--model-path", help="model folder for the server it starts")
    parser.add_argument("--pid", type=int, help="with --url: the gunicorn master's pid, to sample memory in a soak")
    parser.add_argument("--model", default=None,
                        help="the served model id (default: MODEL_ID or smollm2-135m-instruct)")
    parser.add_argument("--limit", type=int, default=4, help="the server's MAX_CONCURRENT_REQUESTS (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the server it starts (default 2)")
    parser.add_argument("--burst", type=int, default=64, help="requests released at once (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="bursts (default 3)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per request in a burst (default 16)")
    parser.add_argument("--minutes", type=float, help="soak for this long instead of bursting")
    parser.add_argument("--concurrency", type=int, default=4, help="soak clients (default 4)")
    parser.add_argument("--mixed", action="store_true",
                        help="a mixed load (long prompts, conversations, short questions, n 3, abandoned streams) "
                             "for --minutes (default 5): peak PSS against MEMORY_LIMIT_MB, the longest first-token "
                             "wait by kind, generations ended by timeout")
    parser.add_argument("--memory-limit-mb", type=float, default=0, help="MEMORY_LIMIT_MB of the server it starts")
    parser.add_argument("--out", default="", help="with --minutes or --mixed: also write the report (JSON) here")


def main(args: argparse.Namespace) -> int:
    if not needs_server(args, "bench load"):
        return 2
    args.model = args.model or default_model()
    return run(args)
