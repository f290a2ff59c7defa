"""schemathesis hooks for the contract test (loaded through ``SCHEMATHESIS_HOOKS``): every generated request is
pointed, half the time, at the served model (unless it would unload it), and its generation is kept short, so a
valid request costs a fraction of a second."""

from __future__ import annotations

import os
import zlib
from typing import Any

import schemathesis

MODEL_ID = os.environ.get("PHI_API_FUZZ_MODEL", "smollm2-135m-instruct")
CAPS = {"max_tokens": 8, "max_completion_tokens": 8, "max_output_tokens": 8, "num_predict": 8, "n": 2,
        "top_logprobs": 3, "logprobs": 3}
# Fuzzed like the rest, but never aimed at the served model: the fuzzing would unload it.
UNLOADS = {"/v1/models/unload", "/openarc/unload", "/api/delete"}


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    bound(case.path, case.body)


def bound(path: str, body: Any) -> None:
    """Point a valid-looking body at the served model (unless it would unload it) and keep its generation short."""
    if not isinstance(body, dict):
        return
    if path not in UNLOADS and isinstance(body.get("model"), str) and zlib.crc32(body["model"].encode()) % 2 == 0:
        body["model"] = MODEL_ID
    if body.get("model") == MODEL_ID:
        body.pop("keep_alive", None)  # 0 unloads the model after the answer (as `ollama stop` does)
    for key, cap in CAPS.items():
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > cap:
            body[key] = cap
    options = body.get("options")
    if isinstance(options, dict) and isinstance(options.get("num_predict"), int) and options["num_predict"] > 8:
        options["num_predict"] = 8
    if body.get("ignore_eos") is True or isinstance(body.get("min_tokens"), int):
        body.pop("ignore_eos", None)
        body.pop("min_tokens", None)
