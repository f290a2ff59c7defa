"""``python -m phi_api bench structured``: how often forced tool calls and ``json_schema`` answers come out whole.

A forced call (``tool_choice`` naming the function) and a ``json_schema``
answer are held to their schema by the grammar, so what can go wrong is a
model that never finishes: it loops inside a JSON string until
``max_tokens``. Over a fixed set of varied messages
(``tests/data/structured-cases.json``: 24 tools, 24 schemas), greedy, this
reports the share whose output parses and validates against its schema,
and the cases that did not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jsonschema
import requests

from phi_api.bench.common import needs_server

DEFAULT_CASES = Path(__file__).resolve().parents[2] / "tests" / "data" / "structured-cases.json"
MAX_TOKENS = 160


def read_cases(path: Path = DEFAULT_CASES) -> dict[str, list[dict[str, Any]]]:
    return json.loads(path.read_text(encoding="utf-8"))


def tool_body(model: str, case: dict[str, Any], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A chat request forcing a call of the case's tool, greedy."""
    tool = case["tool"]
    return {"model": model, "messages": [{"role": "user", "content": case["message"]}], "temperature": 0,
            "max_tokens": max_tokens, "tools": [{"type": "function", "function": tool}],
            "tool_choice": {"type": "function", "function": {"name": tool["name"]}}}


def schema_body(model: str, case: dict[str, Any], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A chat request whose answer must follow the case's JSON Schema, greedy."""
    return {"model": model, "messages": [{"role": "user", "content": case["message"]}], "temperature": 0,
            "max_tokens": max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": case["schema"]}}}


def tool_output(answer: dict[str, Any]) -> tuple[str | None, str]:
    """The forced call's arguments (None when it made none) and its function's name."""
    calls = answer["choices"][0]["message"].get("tool_calls") or []
    return (calls[0]["function"]["arguments"], calls[0]["function"]["name"]) if calls else (None, "")


def valid(text: str | None, schema: dict[str, Any]) -> bool:
    """Whether ``text`` is JSON that validates against ``schema``."""
    if text is None:
        return False
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def measure(url: str, model: str, cases: dict[str, list[dict[str, Any]]],
            session: requests.Session | None = None) -> dict[str, Any]:
    """Send every case once; the share of whole, valid outputs of each kind, and the failures' messages."""
    http = session or requests.Session()
    report: dict[str, Any] = {}
    failures: dict[str, list[str]] = {"tools": [], "schemas": []}
    for case in cases["tools"]:
        answer = http.post(f"{url}/v1/chat/completions", json=tool_body(model, case), timeout=300).json()
        arguments, name = tool_output(answer)
        if name != case["tool"]["name"] or not valid(arguments, case["tool"]["parameters"]):
            failures["tools"].append(case["message"])
    for case in cases["schemas"]:
        answer = http.post(f"{url}/v1/chat/completions", json=schema_body(model, case), timeout=300).json()
        if not valid(answer["choices"][0]["message"].get("content"), case["schema"]):
            failures["schemas"].append(case["message"])
    for kind in ("tools", "schemas"):
        report[kind] = {"cases": len(cases[kind]),
                        "valid_share": round(1 - len(failures[kind]) / len(cases[kind]), 3),
                        "failed": failures[kind]}
    return report


def run(args: Any) -> dict[str, Any]:
    import tempfile

    from phi_api.bench.server import Server

    cases = read_cases(Path(args.cases))
    if args.url:
        report = measure(args.url.rstrip("/"), args.model, cases)
    else:
        with tempfile.TemporaryDirectory() as logs, Server(Path(logs), MODEL_PATH=args.model_path,
                                                           MODEL_ID=args.model, WEB_CONCURRENCY=1) as server:
            report = measure(server.url, args.model, cases)
    print(json.dumps(report, indent=2))
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a running server (default: start one on --model-path)")
    parser.add_argument("--model-path", help="model folder for the server it starts")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the served model id")
    parser.add_argument("--cases", default=None, help="the cases (default: tests/data/structured-cases.json)")


def main(args: argparse.Namespace) -> int:
    if not needs_server(args, "bench structured"):
        return 2
    args.cases = args.cases or str(DEFAULT_CASES)
    run(args)
    return 0
