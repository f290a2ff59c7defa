"""Streaming requests against any OpenAI-compatible server, timed from the client's side."""

from __future__ import annotations

import bisect
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import requests


@dataclass(frozen=True)
class StreamResult:
    """One streamed completion, seen from the client."""

    ttft: float  # request sent -> first text received (seconds)
    tokens: int  # completion tokens (the server's usage when it reports one, else text chunks)
    decode_seconds: float  # first text -> last text
    text: str = ""
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    arrivals: tuple[float, ...] = ()  # when each piece of text arrived (``time.perf_counter()``)

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first one."""
        return (self.tokens - 1) / self.decode_seconds if self.tokens > 1 and self.decode_seconds > 0 else None


def stream_completion(base_url: str, body: dict[str, Any], session: requests.Session | None = None,
                      path: str = "/v1/completions") -> StreamResult:
    """POST ``body`` to ``path`` (completions or chat completions) with streaming, and time it."""
    http = session or requests
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    arrivals: list[float] = []
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    with http.post(base_url + path, json=payload, stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                if text:
                    arrivals.append(time.perf_counter())
                    pieces.append(text)
    if not arrivals:
        raise RuntimeError(f"{base_url} streamed no text")
    return StreamResult(ttft=arrivals[0] - started, tokens=usage.get("completion_tokens") or len(pieces),
                        decode_seconds=arrivals[-1] - arrivals[0], text="".join(pieces),
                        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                        prompt_tokens=usage.get("prompt_tokens"), arrivals=tuple(arrivals))


@dataclass(frozen=True)
class LoadResult:
    """A batch of concurrent streams."""

    concurrency: int
    streams: list[StreamResult]
    wall_seconds: float

    @property
    def aggregate_rate(self) -> float:
        """All completion tokens over the wall time of the whole batch (prompt processing included)."""
        return sum(stream.tokens for stream in self.streams) / self.wall_seconds

    @property
    def decode_rate(self) -> float:
        """The streams' decode rates summed: what the server decodes per second while they all run, to set
        against a single stream's decode rate."""
        return sum(stream.decode_rate or 0.0 for stream in self.streams)

    @property
    def steady_rate(self) -> float | None:
        """Tokens per second while every stream decodes: from the last stream's first text to the first
        stream's last text (``None`` when the streams never all decode at once).

        A stream's decode rate counts the time the server spends on the prompts of the streams that started
        after it; in this window every prompt is done, so it is the rate to set against an engine's static
        batch of as many rows. Each stream's pieces in the window count as its tokens per piece.
        """
        if not self.streams or not all(stream.arrivals for stream in self.streams):
            return None
        start = max(stream.arrivals[0] for stream in self.streams)
        end = min(stream.arrivals[-1] for stream in self.streams)
        if end <= start:
            return None
        tokens = sum((bisect.bisect_right(stream.arrivals, end) - bisect.bisect_right(stream.arrivals, start))
                     * stream.tokens / len(stream.arrivals) for stream in self.streams)
        return tokens / (end - start)


def unique(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a prompt no earlier request shares, so no server answers it from a prompt cache."""
    tag = f"[{uuid.uuid4().hex[:8]}] "
    if "prompt" in body:
        return {**body, "prompt": tag + body["prompt"]}
    return {**body, "messages": [{**body["messages"][0], "content": tag + body["messages"][0]["content"]},
                                 *body["messages"][1:]]}


def concurrent_streams(base_url: str, body: dict[str, Any], concurrency: int,
                       path: str = "/v1/completions") -> LoadResult:
    """Start ``concurrency`` streams at once (each with a prompt of its own) to ``path`` and wait for all of them."""
    results: list[StreamResult | BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(concurrency)

    def one() -> None:
        session = requests.Session()
        barrier.wait()
        try:
            result: StreamResult | BaseException = stream_completion(base_url, unique(body), session, path)
        except BaseException as exc:  # reported after the batch
            result = exc
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        raise RuntimeError(f"{len(failures)} of {concurrency} streams failed: {failures[0]}")
    return LoadResult(concurrency, results, wall)  # type: ignore[arg-type]


class LatencyProbe:
    """Polls ``GET /v1/models`` in the background and records each latency."""

    def __init__(self, base_url: str) -> None:
        self._url = base_url + "/v1/models"
        self._stop = threading.Event()
        self.latencies: list[float] = []
        self.failures = 0  # polls that timed out or failed (their time still counts as a latency)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                session.get(self._url, timeout=60).raise_for_status()
            except requests.RequestException:  # a server that cannot answer under load: that is the finding
                self.failures += 1
            self.latencies.append(time.perf_counter() - started)
            self._stop.wait(0.02)
