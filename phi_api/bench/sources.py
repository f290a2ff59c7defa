"""``python -m phi_api bench sources``: where drafts come from, on workloads one key repeats, in one run.

Three servers of one worker each, at the server's defaults (``BATCH_INVARIANT`` on: a key's history drafts there
where a check gives one-token steps' bits, as with phi-api's attention on a CPU with AVX-512 VNNI; elsewhere only
with ``--no-invariant``): ``off``
(no speculation), ``prompt`` (drafts from the request's own tokens; ``SPECULATIVE_HISTORY_TOKENS=0``) and
``history`` (also from the key's earlier answers). Each workload runs as one key's requests, one at a time, on the
three servers in turn (the order rotating each run); its time is the sum of its requests' times, and a server's
ratio is ``off``'s time over its own (above 1: faster). Workloads:

- ``json``: fields extracted as JSON from 12 short records of the same form (the answers share their shape);
- ``agent``: a 10-step tool loop replayed: each step's request holds the conversation so far (the earlier calls
  and their results) and asks for the next call;
- ``predicted``: the ``code`` edit of ``bench spec`` with its unedited text as OpenAI's ``prediction``.

Acceptance by source comes from each server's ``phi_api_draft_source_tokens``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from phi_api.bench.common import emit, median, say
from phi_api.bench.server import Server
from phi_api.bench.speculative import COPYING, by_source

MODEL_ID = "bench-model"
SERVERS: dict[str, dict[str, Any]] = {"off": {"SPECULATIVE_DRAFT_MAX": 0}, "prompt": {"SPECULATIVE_HISTORY_TOKENS": 0},
                                      "history": {}}
NAMES = ["Ada Moreno", "Bilal Khan", "Chloe Dubois", "Dmitri Ivanov", "Emma Schulz", "Farah Haddad",
         "Goro Tanaka", "Hana Novak", "Ivan Petrov", "Julia Rossi", "Kofi Mensah", "Lena Berg"]
CITIES = ["Lisbon", "Lahore", "Lyon", "Kazan", "Bremen", "Beirut", "Osaka", "Brno", "Minsk", "Turin", "Accra", "Oslo"]
JOBS = ["nurse", "pilot", "baker", "chemist", "teacher", "architect", "chef", "lawyer", "welder", "dentist",
        "farmer", "librarian"]
TOOL_CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Warsaw", "Dublin", "Athens", "Lisbon"]


def json_requests() -> list[dict[str, Any]]:
    """Twelve extractions of the same form."""
    bodies = []
    for index, (name, city, job) in enumerate(zip(NAMES, CITIES, JOBS, strict=True)):
        record = (f"{name} is {24 + 3 * index} years old and works as a {job} in {city}. "
                  f"{name.split()[0]} joined in {2001 + index} and can be reached at extension {410 + 7 * index}.")
        bodies.append({"messages": [{"role": "user", "content": (
            "Extract the person's name, age, city, occupation, year joined and extension from this record. Reply "
            "with one JSON object with the keys name, age, city, occupation, joined and extension, and nothing "
            f"else.\n\n{record}")}], "max_tokens": 96})
    return bodies


def agent_requests() -> list[dict[str, Any]]:
    """A tool loop's ten steps, each holding the earlier calls and their results."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": (
        "Check the weather in each of these cities, one call at a time, in this order: "
        + ", ".join(TOOL_CITIES) + ".")}]
    bodies = []
    for step, city in enumerate(TOOL_CITIES):
        bodies.append({"messages": list(messages), "tools": [tool], "max_tokens": 64})
        call = {"id": f"call_{step}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{step}",
                      "content": json.dumps({"city": city, "celsius": 11 + step, "sky": "cloudy"})}]
    return bodies


def predicted_requests() -> list[dict[str, Any]]:
    """The code edit with its unedited function as the prediction, three times."""
    prompt = COPYING["code"]
    function = prompt[prompt.index("def order_summary"):]
    return [{"messages": [{"role": "user", "content": prompt}], "max_tokens": 256,
             "prediction": {"type": "content", "content": function}}] * 3


WORKLOADS = {"json": json_requests, "agent": agent_requests, "predicted": predicted_requests}


def run_workload(server: Server, bodies: list[dict[str, Any]], key: str) -> tuple[float, int]:
    """Seconds for the workload's requests one after another, and the tokens they generated; ``key``: their
    ``cache_salt``, which makes them a key of their own (a history, and kept prompts, of their own)."""
    seconds, tokens = 0.0, 0
    for body in bodies:
        started = time.perf_counter()
        reply = requests.post(server.url + "/v1/chat/completions", timeout=600,
                              json={"model": MODEL_ID, "temperature": 0, "cache_salt": key, **body})
        reply.raise_for_status()
        seconds += time.perf_counter() - started
        tokens += reply.json()["usage"]["completion_tokens"]
    return seconds, tokens


def measure(model_path: str, runs: int, invariant: bool = True) -> dict[str, Any]:
    workloads: dict[str, Any] = {}
    report: dict[str, Any] = {"batch_invariant": invariant, "workloads": workloads}
    with tempfile.TemporaryDirectory() as logs:
        common: dict[str, Any] = {"MODEL_PATH": model_path, "MODEL_ID": MODEL_ID, "WEB_CONCURRENCY": 1,
                                  "BATCH_INVARIANT": str(invariant).lower()}
        servers = {name: Server(Path(logs), **common, **env).start() for name, env in SERVERS.items()}
        try:
            for server in servers.values():  # the first request of a worker pays for warm-up
                run_workload(server, json_requests()[:1], "warm-up")
            for workload, make in WORKLOADS.items():
                times: dict[str, list[float]] = {name: [] for name in servers}
                before = {name: by_source(server) for name, server in servers.items()}
                for run in range(runs):
                    names = list(servers)[run % len(servers):] + list(servers)[:run % len(servers)]
                    for name in names:  # a key of its own each run: its history starts empty
                        seconds, _ = run_workload(servers[name], make(), f"{workload}-{run}")
                        times[name].append(seconds)
                    say(f"{workload}, run {run + 1}/{runs}: " + ", ".join(f"{name} {times[name][-1]:.1f} s"
                                                                         for name in servers))
                after = {name: by_source(server) for name, server in servers.items()}
                workloads[workload] = {name: {"seconds": median(times[name]),
                                              "speedup": median([off / own for off, own in
                                                                 zip(times["off"], times[name], strict=True)]),
                                              "drafts": {key: after[name].get(key, 0.0) - before[name].get(key, 0.0)
                                                         for key in after[name]}}
                                       for name in servers}
        finally:
            for server in servers.values():
                server.stop()
    return report


def table(report: dict[str, Any]) -> str:
    rows = ["| Workload | prompt / off | history / off | Kept of checked (history server), by source |",
            "|---|---|---|---|"]
    for workload, result in report["workloads"].items():
        drafts = result["history"]["drafts"]
        kept = ", ".join(f"{source} {drafts.get(source + '_kept', 0):.0f}/{drafts.get(source + '_checked', 0):.0f}"
                         for source in ("prompt", "prediction", "history") if drafts.get(source + "_checked"))
        rows.append(f"| {workload} | {result['prompt']['speedup']:.2f}x | {result['history']['speedup']:.2f}x | "
                    f"{kept or 'none'} |")
    return "\n".join(rows)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder the three servers serve")
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians are reported)")
    parser.add_argument("--no-invariant", action="store_true", help="serve with BATCH_INVARIANT=false")
    parser.add_argument("--out", default="bench/results/bench-sources.json", help="the JSON report")


def main(args: argparse.Namespace) -> int:
    say(f"servers on {args.model_path}: speculation off, from the prompt, and from the key's history too")
    report = measure(args.model_path, args.runs, invariant=not args.no_invariant)
    emit(report, args.out)
    print(table(report))
    return 0
