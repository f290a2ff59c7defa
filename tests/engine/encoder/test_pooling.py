"""Pooling token vectors, normalizing, shortening, and a reranker's scores."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine.encoder.pooling import normalized, pool, scores, shortened

HIDDEN = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                   [[5.0, -1.0], [7.0, 9.0], [-2.0, 3.0]]], dtype=np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize("how,expected", [
    ("mean", [[2.0, 3.0], [10 / 3, 11 / 3]]),
    ("cls", [[1.0, 2.0], [5.0, -1.0]]),
    ("max", [[3.0, 4.0], [7.0, 9.0]]),
    ("lasttoken", [[3.0, 4.0], [-2.0, 3.0]]),
    ("mean_sqrt_len", [[4 / np.sqrt(2), 6 / np.sqrt(2)], [10 / np.sqrt(3), 11 / np.sqrt(3)]]),
])
def test_padding_never_counts(how, expected):
    assert np.allclose(pool(HIDDEN, MASK, how), expected, atol=1e-6)


def test_unit_vectors_and_shorter_ones():
    vectors = normalized(np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 0.0]], dtype=np.float32))
    assert np.allclose(vectors[0], [3 / 13, 4 / 13, 12 / 13]) and not vectors[1].any()
    short = shortened(vectors, 2, renormalize=True)
    assert short.shape == (2, 2) and np.allclose(short[0], [0.6, 0.8])
    assert np.allclose(shortened(vectors, 2, renormalize=False)[0], [3 / 13, 4 / 13])


def test_scores_take_the_first_logit_through_the_activation():
    logits = np.array([[0.0, 9.0], [2.0, -9.0]], dtype=np.float32)
    assert np.allclose(scores(logits, "sigmoid"), [0.5, 1 / (1 + np.exp(-2.0))])
    assert np.allclose(scores(logits, "identity"), [0.0, 2.0])
