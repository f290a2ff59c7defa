"""``python -m phi_api bench load --mixed --minutes M``: a mixed load that reports memory against the budget and waits.

Clients send, in turn: long prompts (a RAG-like ~1,000-token document and a
question), conversations (~300 tokens, each its own), short questions, three
choices at once (``n`` 3), streams abandoned after their first token, answers
shaped by a JSON schema, hostile bodies (each must get a 4xx), and bursts of
short questions sent at once (past the concurrency limit: 429s are expected
and counted); each
prompt is new, so prefix reuse helps no client but a conversation's own next
turn. Measured: every answer's status, the first token's wait by kind (the
longest), generations ended by ``GENERATION_TIMEOUT`` (a 504, or an error event
in a stream), and the server's PSS (master and workers) every second, against
``phi_api_memory_limit_bytes``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import requests

from phi_api.bench.common import emit
from phi_api.bench.server import children, pss_bytes

KINDS = ("long", "conversation", "short", "n3", "abandoned", "schema", "hostile", "burst")
# Bodies no client should send: each must be refused with a 4xx, and leave the server whole.
HOSTILE = (b'{"model": "M", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
           b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
           b'{"model": "M", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
           b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "guided_json": "'
           + b'{\\"type\\":\\"object\\",\\"properties\\":{\\"a\\":' * 2000 + b'{}' + b"}}" * 2000 + b'"}')
BURST = 6  # short questions a "burst" sends at once
_DOCUMENT = ("The committee met on {day} to review the budget of district {n}. It noted that transport costs rose by "
             "{a} percent, that schools asked for {b} new teachers, and that the library's roof needs repair. ")


def body(kind: str, index: int, model: str) -> dict[str, Any]:
    """The chat request of ``kind`` for client round ``index``."""
    if kind == "long":
        text = "".join(_DOCUMENT.format(day=f"day {index}-{n}", n=n, a=(index + n) % 17, b=(3 * n + index) % 11)
                       for n in range(24))
        messages = [{"role": "user", "content": f"{text}\nWhich district asked for the most teachers?"}]
        return {"model": model, "messages": messages, "max_tokens": 32, "stream": True}
    if kind == "conversation":
        turns = " ".join(f"Note {index}.{n}: the parcel {n} left depot {(index * 7 + n) % 13}." for n in range(18))
        messages = [{"role": "system", "content": f"You help courier {index}."}, {"role": "user", "content": turns}]
        return {"model": model, "messages": messages, "max_tokens": 48, "stream": True}
    if kind == "burst":
        return body("short", index, model)
    if kind == "schema":
        schema = {"type": "object", "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
                  "required": ["city", "year"], "additionalProperties": False}
        return {"model": model, "max_tokens": 48, "stream": True,
                "messages": [{"role": "user", "content": f"Name a city and a year ({index}), as JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}}
    if kind == "n3":
        return {"model": model, "messages": [{"role": "user", "content": f"Name a color ({index})."}],
                "max_tokens": 16, "n": 3, "stream": True}
    question = f"What is {index} plus {index * 3}?"
    return {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 24, "stream": True}


def one(url: str, kind: str, index: int, model: str) -> tuple[str, float | None, bool]:
    """(status, seconds to the first token, ended by timeout) of one request."""
    started = time.monotonic()
    first = None
    if kind == "hostile":
        return hostile(url, index, model), None, False
    try:
        with requests.post(url + "/v1/chat/completions", json=body(kind, index, model), stream=True,
                           timeout=900) as response:
            if response.status_code != 200:
                return str(response.status_code), None, response.status_code == 504
            for line in response.iter_lines():
                event = _event(line)
                if event is None:
                    continue
                if "error" in event:  # a stream that failed after it began: its error event
                    return "error-event", first, event["error"].get("code") == "timeout"
                if first is None and any(choice.get("delta", {}).get("content") for choice in event["choices"]):
                    first = time.monotonic() - started
                    if kind == "abandoned":
                        return "abandoned", first, False
        return "200", first, False
    except requests.RequestException as exc:
        return f"error:{type(exc).__name__}", first, False


def hostile(url: str, index: int, model: str) -> str:
    """The status a hostile body gets ("hostile-4xx" when refused as it should be)."""
    raw = HOSTILE[index % len(HOSTILE)].replace(b'"M"', json.dumps(model).encode())
    try:
        status = requests.post(url + "/v1/chat/completions", data=raw, timeout=120,
                               headers={"Content-Type": "application/json"}).status_code
    except requests.RequestException as exc:
        return f"error:{type(exc).__name__}"
    return "hostile-4xx" if 400 <= status < 500 else str(status)


def _event(line: bytes) -> dict[str, Any] | None:
    """A server-sent event's JSON object (None for ``[DONE]``, keep-alives and blank lines)."""
    if not line.startswith(b"data: {"):
        return None
    parsed = json.loads(line[len(b"data: "):])
    return parsed if isinstance(parsed, dict) else None


def tree_pss(pid: int) -> int:
    """PSS of a process and its children (gunicorn's master and workers)."""
    return pss_bytes([pid, *children(pid)])


def run_mixed(url: str, model: str, minutes: float, concurrency: int, pid: int) -> dict[str, Any]:
    """Drive the mixed load for ``minutes``; the report."""
    deadline = time.monotonic() + minutes * 60
    statuses: Counter[str] = Counter()
    waits: dict[str, list[float]] = defaultdict(list)
    timeouts, peak = [0], [0]
    lock = threading.Lock()

    def client(number: int) -> None:
        index = number
        def send(kind: str, number: int) -> None:
            status, first, timed_out = one(url, kind, number, model)
            with lock:
                statuses[status] += 1
                timeouts[0] += timed_out
                if first is not None:
                    waits[kind].append(first)

        while time.monotonic() < deadline:
            kind = KINDS[index % len(KINDS)]
            if kind == "burst":
                burst = [threading.Thread(target=send, args=(kind, index * BURST + n)) for n in range(BURST)]
                for thread in burst:
                    thread.start()
                for thread in burst:
                    thread.join()
            else:
                send(kind, index)
            index += concurrency

    def sample() -> None:
        while time.monotonic() < deadline:
            peak[0] = max(peak[0], tree_pss(pid))
            time.sleep(1.0)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(concurrency)]
    threads.append(threading.Thread(target=sample))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    metrics = requests.get(url + "/metrics", timeout=60).text
    limit = re.search(r"^phi_api_memory_limit_bytes (\S+)$", metrics, flags=re.M)
    return {"requests": dict(statuses), "generations_ended_by_timeout": timeouts[0],
            "longest_first_token_seconds": {kind: round(max(values), 1) for kind, values in waits.items()},
            "peak_pss_mb": round(peak[0] / 2**20), "memory_limit_mb": round(float(limit.group(1)) / 2**20) if limit
            else None}


def report(result: dict[str, Any], out: str = "") -> bool:
    """Print the report (and write it to ``out`` when given); whether the server held: no 5xx, no timeout, PSS within
    the budget."""
    emit(result, out)
    failed = [status for status in result["requests"] if status.startswith(("5", "error"))]  # 429 is no failure
    within = result["memory_limit_mb"] is None or result["peak_pss_mb"] <= result["memory_limit_mb"]
    return not failed and not result["generations_ended_by_timeout"] and within
