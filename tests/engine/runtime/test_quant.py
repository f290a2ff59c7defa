"""int8 keys and values: when they are wanted, how the scales are calibrated, and the rewritten graph (on the real
default model's decoder graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phi_api.engine.runtime import quant as kvquant


@pytest.mark.parametrize("setting,bytes_per_token,wanted", [
    ("auto", 786_432, True), ("auto", kvquant.AUTO_THRESHOLD_BYTES, True), ("auto", 46_080, False),
    ("int8", 46_080, True), ("float32", 786_432, False),
])
def test_auto_picks_int8_from_256_kb_a_token(setting, bytes_per_token, wanted):
    assert kvquant.wants_int8(setting, bytes_per_token) is wanted


@pytest.fixture(scope="module")
def graph(model_path, tmp_path_factory):
    """The default model's float32-cache decoder graph, prepacked in a folder of the test's own."""
    from phi_api.engine.runtime.model import ModelInfo
    from phi_api.engine.runtime.prepack import prepacked_model
    from phi_api.engine.runtime.session import Decoder
    from phi_api.engine.runtime.spec import DecoderSpec

    info = ModelInfo.read(model_path)
    model_file = prepacked_model(Path(model_path), info.decoder_file, tmp_path_factory.mktemp("prepacked"))
    spec = Decoder(model_file, DecoderSpec.read(Path(model_path)), threads=1).spec
    return model_file, spec


def test_key_scales_hold_each_rotary_pair_s_length_and_value_scales_the_largest_value(graph):
    model_file, spec = graph
    ids = np.arange(1, 97, dtype=np.int64) * 37 % spec.vocab_size
    keys, values, plain = kvquant.calibrate(model_file, spec, ids, threads=2)
    assert keys.shape == values.shape == plain.shape == (spec.layers, spec.kv_heads, spec.head_size)
    half = spec.head_size // 2
    assert np.array_equal(keys[..., :half], keys[..., half:2 * half])  # a pair shares its scale: rotation-proof
    assert (keys > 0).all() and (values > 0).all()
    # int4's key scales: each channel's own largest magnitude, within its pair's length
    assert (plain <= keys * (1 + 1e-9)).all() and not np.array_equal(plain[..., :half], plain[..., half:2 * half])


def test_the_int8_graph_keeps_its_cache_in_int8_and_is_made_once(graph, tmp_path):
    import onnx

    model_file, spec = graph
    ids = np.arange(1, 65, dtype=np.int64)
    made = kvquant.int8_model(model_file, spec, ids, threads=2)
    assert made.name == kvquant.QUANT_FILE and made.parent == model_file.parent
    stamp = made.stat().st_mtime_ns
    assert kvquant.int8_model(model_file, spec, ids, threads=2).stat().st_mtime_ns == stamp  # not made again
    loaded = onnx.load(str(made), load_external_data=False).graph
    past = [value for value in loaded.input if value.name.startswith("past_key_values.")]
    assert past and all(value.type.tensor_type.elem_type == onnx.TensorProto.INT8 for value in past)
    attention = [node for node in loaded.node if node.op_type == "GroupQueryAttention"]
    assert len(attention) == spec.layers
    assert all(node.input[12].startswith("kv_int8.key_scale.") for node in attention)
