"""The logits computed only where a step reads them: the graph's slice of positions, and the session binding it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from phi_api.engine.runtime.logits import LOGITS_FROM, slice_positions, vocabulary_product

HIDDEN, VOCAB = 8, 12


def head_graph(between: str = "Mul") -> onnx.ModelProto:
    """hidden [B, S, 8] -> a norm-like Mul -> the vocabulary MatMul -> ``between`` (a softcap's Mul, or another
    operator) -> logits [B, S, 12]."""
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((HIDDEN, VOCAB)).astype(np.float32), "lm_head")
    scale = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "scale")
    nodes = [helper.make_node("Mul", ["hidden", "scale"], ["normed"]),
             helper.make_node("MatMul", ["normed", "lm_head"], ["product"]),
             helper.make_node(between, ["product", "scale"] if between == "Mul" else ["product"], ["logits"])]
    graph = helper.make_graph(nodes, "head",
                              [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", HIDDEN])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "S", VOCAB])],
                              [weights, scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(model: onnx.ModelProto, hidden: np.ndarray, **feeds: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"hidden": hidden, **feeds})[0]


def test_the_sliced_graph_computes_the_last_position_or_every_one_as_bound():
    hidden = np.random.default_rng(1).standard_normal((3, 5, HIDDEN)).astype(np.float32)
    model = head_graph()
    full = run(model, hidden)
    assert slice_positions(model)
    onnx.checker.check_model(model)
    last = run(model, hidden, **{LOGITS_FROM: np.array([-1], dtype=np.int64)})
    every = run(model, hidden, **{LOGITS_FROM: np.array([0], dtype=np.int64)})
    assert last.shape == (3, 1, VOCAB) and every.shape == full.shape
    np.testing.assert_allclose(last[:, 0], full[:, -1], rtol=1e-6)
    np.testing.assert_allclose(every, full, rtol=1e-6)
    assert not slice_positions(model)  # once is enough: the input exists


def test_a_graph_whose_logits_pass_through_another_operator_is_left_as_it_is():
    model = head_graph(between="Softmax")
    before = model.SerializeToString()
    assert vocabulary_product(model.graph, "logits") is None
    assert not slice_positions(model)
    assert model.SerializeToString() == before


def test_the_default_model_s_prompt_chunk_computes_its_last_logits_alone(model_path):
    """The default model with phi-api's attention (where the library runs): its graph takes the slice, a prompt
    chunk's logits are its last position's, the same as every position's last (to the 8-bit matrices' rounding: the
    vocabulary matrix then computes one row, not the chunk's), and a check's logits every position's."""
    from phi_api.engine.kernels.native import unsupported
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.pool import KVPool
    from phi_api.settings import cache_root

    model = LanguageModel(model_path, cache_dir=cache_root() / "runtime")
    graph = onnx.load(str(model.decoder_file), load_external_data=False).graph
    takes = any(value.name == LOGITS_FROM for value in graph.input)
    assert takes == (unsupported() is None)
    decoder = model.new_decoder(2)
    pool = KVPool(decoder.spec, 2, 64)
    prompt = np.arange(500, 517, dtype=np.int64)[None, :]
    try:
        last = decoder.step(pool, 0, prompt, np.array([0]), True).copy()
        every = decoder.step(pool, 1, prompt, np.array([0]), True, every_position=True).copy()
    finally:
        decoder.unbind()
        pool.close()
    assert last.shape == (1, model.spec.vocab_size) and every.shape == (1, prompt.shape[1], model.spec.vocab_size)
    assert np.isfinite(last).all() and every[0, :-1].std() > 0
    assert int(np.argmax(last)) == int(np.argmax(every[0, -1]))
    np.testing.assert_allclose(last[0], every[0, -1], atol=0.01 * float(np.abs(every[0, -1]).max()))
