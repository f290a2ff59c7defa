"""``bench attention --baseline``: another build of the operator timed against this tree's, call by call."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phi_api.bench.attention import Layer
from phi_api.engine.kernels import native, op
from phi_api.engine.kernels.attention_graph import SMOLLM2
from phi_api.errors import KernelError
from phi_api.settings import cache_root


def test_a_baseline_build_is_timed_against_ours_in_one_process():
    if native.unsupported() is not None:  # no operator here: nothing to time it against
        with pytest.raises(KernelError):
            op.build_library(cache_root() / "runtime")
        return
    library = str(op.build_library(cache_root() / "runtime"))
    layer = Layer(SMOLLM2, 256, threads=1, baseline=library)
    assert set(layer.sessions) == {"ours", "int8", "float32", "ours_float32", "ours_int4", "versus", "baseline"}
    for rows, new, past in ((2, 1, 100), (1, 16, 64)):
        figures = layer.against_baseline(rows, new, past, reps=3)
        assert figures["baseline_ms"] > 0 and figures["versus_ours_ms"] > 0
        assert math.isfinite(figures["ours_over_baseline"])
    # The baseline here is this very build, so its session must compute what ours does, bit for bit (a decode step
    # and a prompt chunk over the same caches and the same new tokens).
    for rows, new, past in ((2, 1, 100), (1, 16, 64)):
        results = []
        for kind in ("versus", "baseline"):
            layer.rng = np.random.default_rng(7)
            caches = layer.caches(rows, "ours")
            results.append(layer.bound(kind, rows, new, past, caches)().copy_outputs_to_cpu())
        ours, theirs = results  # the present keys, the present values, the output
        assert ours[-1].shape == (rows, new, SMOLLM2.heads * SMOLLM2.head_size)
        assert len(ours) == len(theirs) == 3
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_without_a_baseline_there_is_no_baseline_session():
    if native.unsupported() is not None:
        with pytest.raises(KernelError):
            Layer(SMOLLM2, 64, threads=1)
        return
    assert set(Layer(SMOLLM2, 64, threads=1).sessions) == {"ours", "int8", "float32", "ours_float32", "ours_int4"}
