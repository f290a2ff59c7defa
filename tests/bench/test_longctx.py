"""``bench long``'s server: one token a step unless told otherwise (its decode figures are shares of the bandwidth
one token a step can use; the raw engine beside it drafts nothing)."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.bench.longctx import Costs, server_settings


def test_the_server_drafts_nothing_unless_a_setting_says_so():
    assert server_settings([]) == {"SPECULATIVE_DRAFT_MAX": "0"}
    assert server_settings(["KV_CACHE_DTYPE=int4"]) == {"SPECULATIVE_DRAFT_MAX": "0", "KV_CACHE_DTYPE": "int4"}
    assert server_settings(["SPECULATIVE_DRAFT_MAX=8"])["SPECULATIVE_DRAFT_MAX"] == "8"


def test_the_default_model_s_costs_count_its_float32_matrices_as_each_engine_keeps_them(model_path):
    """Its down projections: bfloat16 on phi-api's kernel (where it runs), float32 on MLAS and in the raw engine;
    the multiply-adds the int8 peak bounds are the 8-bit matrices' alone."""
    import onnx

    from phi_api.bench.longctx import model_costs
    from phi_api.engine.kernels.native import unsupported

    graph = onnx.load(f"{model_path}/model.onnx", load_external_data=False).graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    floats = sum(int(np.prod(initializers[node.input[1]].dims)) for node in graph.node if node.op_type == "MatMul")
    ours, mlas = model_costs(model_path), model_costs(model_path, int4_kernel="mlas")
    assert floats > 20_000_000 and ours.weight_macs == mlas.weight_macs
    assert mlas.weight_bytes == mlas.raw_weight_bytes == ours.raw_weight_bytes
    assert mlas.weight_bytes - ours.weight_bytes == (2 * floats if unsupported() is None else 0)
    assert ours.step_bytes(8, 100, raw=True) - ours.step_bytes(8, 100) == mlas.weight_bytes - ours.weight_bytes


def test_a_decode_step_is_bound_by_the_larger_of_its_compute_and_its_reads():
    # Phi-3.5-mini's shape, roughly: 3.77 GMAC and 2.0 GB a token, 196 KB of keys and values a token of context
    costs = Costs(3.77e9, 2.0e9, 2 * 32 * 96 * 32, 196e3, 2.0e9)
    one, one_by = costs.step_bound(1, 256, int8_gmacs=450.0, read_gbs=29.0)
    assert one_by == "memory" and one == pytest.approx(costs.step_bytes(1, 256) / 29e9)
    eight, eight_by = costs.step_bound(8, 256, int8_gmacs=450.0, read_gbs=29.0)  # 2.4 GB: 83 ms; computing, 67
    assert eight_by == "memory" and eight == pytest.approx(costs.step_bytes(8, 256) / 29e9)
    fast, fast_by = costs.step_bound(8, 256, int8_gmacs=450.0, read_gbs=60.0)
    assert fast_by == "compute" and fast == pytest.approx(8 * (3.77e9 + 256 * 2 * 32 * 96 * 32) / 450e9)
