"""``phi-api chat``: a small terminal chat with a running server, its answers streamed as they come.

It speaks OpenAI's chat API over HTTP with the standard library only (the
installed package has no HTTP client of its own): each line typed is a user
message, the conversation so far goes with it, the answer is printed while its
server-sent events arrive. An empty line is skipped; ``/exit`` or end of input
(Ctrl-D) ends the chat.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

PROMPT = "> "


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    port = os.environ.get("SERVER_PORT", "8000")  # the port `make serve` and `phi-api serve` listen on here
    parser.add_argument("--url", default=f"http://127.0.0.1:{port}",
                        help=f"the server (default http://127.0.0.1:{port}, from SERVER_PORT)")
    parser.add_argument("--model", help="the model to talk to (default: the server's first)")
    parser.add_argument("--api-key", default=os.environ.get("PHI_API_KEY", ""),
                        help="a key of the server's API_KEYS (default: $PHI_API_KEY)")
    parser.add_argument("--system", help="a system message to start the conversation with")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: the server's)")
    parser.add_argument("--max-tokens", type=int, help="the longest answer (default: the server's)")


class Client:
    """What the chat needs of the server: its first model and a streamed chat answer."""

    def __init__(self, url: str, api_key: str) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key
                                                                 else {})}

    def first_model(self) -> str:
        with urllib.request.urlopen(urllib.request.Request(self.url + "/v1/models", headers=self.headers),
                                    timeout=30) as answer:
            return json.load(answer)["data"][0]["id"]

    def stream(self, body: dict[str, Any]) -> Iterator[str]:
        """The answer's text, piece by piece, from the server-sent events of ``body`` streamed."""
        request = urllib.request.Request(self.url + "/v1/chat/completions", data=json.dumps({**body, "stream": True})
                                         .encode(), headers=self.headers, method="POST")
        with urllib.request.urlopen(request, timeout=600) as answer:
            for raw in answer:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                for choice in event.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        yield piece


def error_text(error: urllib.error.HTTPError) -> str:
    """The server's error message (its body is the protocol's error object), else the status line."""
    try:
        return json.loads(error.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {error.code} {error.reason}"


def main(args: argparse.Namespace) -> int:
    client = Client(args.url, args.api_key)
    try:
        model = args.model or client.first_model()
    except (urllib.error.URLError, OSError, ValueError, LookupError) as error:
        print(f"phi-api chat: cannot reach a server at {args.url}: {error}", file=sys.stderr)
        return 1
    options = {name: value for name, value in (("temperature", args.temperature), ("max_tokens", args.max_tokens))
               if value is not None}
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(f"Chatting with {model} at {args.url} (/exit or Ctrl-D to end).")
    while True:
        try:
            line = input(PROMPT).strip()
        except EOFError:
            print()
            return 0
        if line == "/exit":
            return 0
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        answer = []
        try:
            for piece in client.stream({"model": model, "messages": messages, **options}):
                answer.append(piece)
                print(piece, end="", flush=True)
        except urllib.error.HTTPError as error:
            print(f"error: {error_text(error)}", file=sys.stderr)
            messages.pop()
            continue
        except (urllib.error.URLError, OSError) as error:
            print(f"\nerror: the server went away: {error}", file=sys.stderr)
            return 1
        print()
        messages.append({"role": "assistant", "content": "".join(answer)})
