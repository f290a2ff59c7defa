"""OpenAI's ``/v1/embeddings``: its body read into an :class:`EmbedRequest`, and its answer (a list of embedding
objects, each a list of floats or, with ``encoding_format: "base64"``, the little-endian float32 bytes in base64,
as the openai SDK asks by default and decodes)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from phi_api.protocols.contract import given
from phi_api.service.requests import EmbedRequest


def embed_request(body: dict[str, Any]) -> EmbedRequest:
    """A schema-valid ``/v1/embeddings`` body."""
    given_input = body["input"]
    texts: tuple[str, ...] = ()
    ids: tuple[tuple[int, ...], ...] = ()
    if isinstance(given_input, str):
        texts = (given_input,)
    elif isinstance(given_input[0], str):
        texts = tuple(given_input)
    elif isinstance(given_input[0], int):
        ids = (tuple(given_input),)
    else:
        ids = tuple(tuple(one) for one in given_input)
    return EmbedRequest(model=body["model"], texts=texts, token_ids=ids, input_param="input",
                        dimensions=given(body, "dimensions"), truncate=given(body, "truncate_prompt_tokens"),
                        priority=given(body, "priority"))


def embeddings_answer(model: str, vectors: np.ndarray, tokens: int, encoding_format: str) -> dict[str, Any]:
    """OpenAI's answer: each input's vector, in order, with the tokens read."""
    data = [{"object": "embedding", "index": index, "embedding": _encoded(vector, encoding_format)}
            for index, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _encoded(vector: np.ndarray, encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()
