"""Ollama's embedding routes: ``/api/embed`` (texts in, unit vectors out, inputs past the model's length cut unless
``truncate`` is false, ``dimensions`` for any model) and the older ``/api/embeddings`` (one prompt, one vector)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from phi_api.errors import InvalidParameterError
from phi_api.protocols.contract import given
from phi_api.protocols.ollama import model_id
from phi_api.service.requests import EmbedRequest


def texts_of(body: dict[str, Any], legacy: bool) -> tuple[str, ...]:
    """The texts to embed: none for an empty input (Ollama answers it with no embeddings); an empty text in a
    list is a 400."""
    if legacy:
        prompt = given(body, "prompt", "")
        return (prompt,) if prompt else ()
    value = given(body, "input", [])
    texts = ((value,) if value else ()) if isinstance(value, str) else tuple(value)
    if not all(texts):
        raise InvalidParameterError("input may not hold an empty text.", param="input")
    return texts


def embed_request(body: dict[str, Any], legacy: bool = False) -> EmbedRequest:
    """A schema-valid ``/api/embed`` (or, ``legacy``, ``/api/embeddings``) body with at least one text."""
    return EmbedRequest(model=model_id(body["model"]), texts=texts_of(body, legacy),
                        input_param="prompt" if legacy else "input",
                        dimensions=None if legacy else given(body, "dimensions"), any_dimensions=True,
                        truncate=None if given(body, "truncate", True) is False else -1)


def embed_answer(model: str, vectors: np.ndarray, tokens: int, started: float) -> dict[str, Any]:
    """``/api/embed``'s answer."""
    return {"model": model, "embeddings": vectors.astype(np.float32).tolist(),
            "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": tokens}


def embeddings_answer(vectors: np.ndarray) -> dict[str, Any]:
    """``/api/embeddings``' answer (its one vector)."""
    return {"embedding": vectors[0].astype(np.float32).tolist()}
