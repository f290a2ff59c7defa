"""From an encoder's outputs to what a request gets: token vectors pooled into one (mean, CLS, max, last token,
mean over the square root of the length), scaled to length 1 where the model says so, cut to fewer dimensions
(Matryoshka models), and a reranker's logits made scores."""

from __future__ import annotations

import numpy as np


def pool(hidden: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """One vector per row of ``hidden`` (``[rows, length, dims]``), over the positions ``mask`` (``[rows, length]``,
    1 for tokens, 0 for padding) keeps."""
    weights = mask.astype(np.float32)[:, :, None]
    lengths = np.maximum(weights.sum(axis=1), 1e-9)
    if how == "cls":
        return hidden[:, 0, :]
    if how == "lasttoken":
        last = mask.astype(np.int64).sum(axis=1) - 1
        return hidden[np.arange(len(hidden)), np.maximum(last, 0), :]
    if how == "max":
        return np.where(weights > 0, hidden, np.float32(-1e9)).max(axis=1)
    summed = (hidden * weights).sum(axis=1)
    if how == "mean_sqrt_len":
        return summed / np.sqrt(lengths)
    return summed / lengths  # "mean"


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def shortened(vectors: np.ndarray, dimensions: int, renormalize: bool) -> np.ndarray:
    """The first ``dimensions`` of each vector (a Matryoshka model's shorter vector), scaled to length 1 again when
    the model's vectors are."""
    cut = np.ascontiguousarray(vectors[:, :dimensions])
    return normalized(cut) if renormalize else cut


def scores(logits: np.ndarray, activation: str | None) -> np.ndarray:
    """A reranker's score per row from its first logit (``sigmoid``: a relevance in 0..1)."""
    first = logits[:, 0].astype(np.float64)
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-first))
    return first
