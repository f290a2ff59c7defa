"""phi-api's attention operator in ONNX Runtime: against the numpy reference and GroupQueryAttention at several
lengths, heads and row mixes (prompt chunks, decode rows, drafts: several new tokens for each of several rows), a
row's bits whatever else is in the step, the graph rewrite, and the fallback where the operator cannot run.

Where the CPU lacks AVX-512 VNNI (or g++ is missing) the operator cannot run: there the tests check that phi-api
says why and keeps GroupQueryAttention, instead of comparing results."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest

from phi_api.engine.kernels import attention_reference as reference
from phi_api.engine.kernels import native, op
from phi_api.engine.kernels.attention_graph import PHI35, SMOLLM2, Shape, gqa_model
from phi_api.engine.runtime import attention
from phi_api.engine.runtime.quant import QUANT_FILE
from phi_api.errors import KernelError
from phi_api.settings import cache_root

SUPPORTED = native.unsupported() is None
POSITIONS = 2048


@pytest.fixture(scope="module")
def library() -> str | None:
    """The operator's library as `make install` built it (None where it cannot run)."""
    return str(op.build_library(cache_root() / "runtime")) if SUPPORTED else None


def session(model: onnx.ModelProto, library: str | None, threads: int = 2):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class Case:
    """One step: ``past[b]`` tokens in each row's cache (random int8 or int4, or float32 ones), ``new`` tokens for each
    row. An int4 cache is its values in [-7, 7] (``keys``, ``values``) and their token scales (``token_scales``)."""

    def __init__(self, shape: Shape, past: list[int], new: int, seed: int, tokens: int | None = None,
                 cache_type: str = "int8") -> None:
        rng = np.random.default_rng(seed)
        self.shape, self.new, self.int8, self.int4 = shape, new, cache_type != "float32", cache_type == "int4"
        self.lengths = np.array(past) + new
        self.tokens = tokens or -(-int(self.lengths.max()) // 16) * 16 + 16
        rows, size = len(past), shape.head_size
        cache = (rows, shape.kv_heads, self.tokens, size)
        self.token_scales: tuple[np.ndarray, np.ndarray] | None = None
        if self.int4:  # a channel-normalized vector's largest magnitude is up to ~127: scales of up to ~18
            self.keys = rng.integers(-7, 8, cache, dtype=np.int8)
            self.values = rng.integers(-7, 8, cache, dtype=np.int8)
            self.token_scales = (rng.uniform(4, 18, cache[:3]).astype(np.float32),
                                 rng.uniform(4, 18, cache[:3]).astype(np.float32))
        elif self.int8:
            self.keys = rng.integers(-127, 128, cache, dtype=np.int8)
            self.values = rng.integers(-127, 128, cache, dtype=np.int8)
        else:
            self.keys = rng.standard_normal(cache, dtype=np.float32)
            self.values = rng.standard_normal(cache, dtype=np.float32)
        self.qkv = rng.standard_normal((rows, new, shape.width), dtype=np.float32)
        # keys whose channels differ in size, as a model's do
        self.key_scale = (rng.uniform(0.005, 0.04, (shape.kv_heads, size)) * np.exp(rng.normal(0, 1, size))).astype(
            np.float32)
        self.value_scale = rng.uniform(0.005, 0.04, (shape.kv_heads, size)).astype(np.float32)
        angles = np.arange(POSITIONS)[:, None] / 10000 ** (np.arange(shape.rot_half) / shape.rot_half)
        self.cos, self.sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def feeds(self, keys: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
        scales = (1, self.shape.kv_heads, 1, self.shape.head_size)
        feeds = {"qkv": self.qkv, "past_key": keys, "past_value": values,
                 "seqlens_k": (self.lengths - 1).astype(np.int32),
                 "total_sequence_length": np.array(self.lengths.max(), dtype=np.int32), "cos": self.cos,
                 "sin": self.sin}
        if keys.dtype == np.int8:
            feeds.update(key_scale=self.key_scale.reshape(scales), value_scale=self.value_scale.reshape(scales))
        return feeds

    def expected(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reference's output and cache (plain layout; int4: its token scales in ``expected_scales``)."""
        keys, values = self.keys.copy(), self.values.copy()
        self.expected_scales = None if self.token_scales is None else (self.token_scales[0].copy(),
                                                                       self.token_scales[1].copy())
        out = reference.attention(self.qkv, keys, values, self.lengths, self.cos, self.sin,
                                  heads=self.shape.heads, kv_heads=self.shape.kv_heads,
                                  scale=self.shape.head_size ** -0.5, window=self.shape.window,
                                  interleaved=self.shape.interleaved,
                                  key_scale=self.key_scale if self.int8 else None,
                                  value_scale=self.value_scale if self.int8 else None,
                                  token_scales=self.expected_scales)
        return out, keys, values

    def ours(self, library: str | None, threads: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The operator's output and cache (back in the plain layout; int4: its token scales in
        ``present_scales``)."""
        model = gqa_model(self.shape, self.tokens, POSITIONS, int8=self.int8)
        assert attention.swap(model, int4=self.int4) == 1
        if self.token_scales is not None:
            keys, values = reference.packed4(self.keys, self.values, *self.token_scales)
        else:
            keys, values = reference.tiled(self.keys, self.values)
        out, present_key, present_value = session(model, library, threads).run(None, self.feeds(keys, values))
        if self.token_scales is None:
            return out, *reference.untiled(present_key, present_value)
        present_key, present_value, *scales = reference.unpacked4(present_key, present_value)
        self.present_scales = (scales[0], scales[1])
        return out, present_key, present_value

    def only(self, rows: slice) -> None:
        """Keep ``rows`` of the step alone."""
        self.keys, self.values, self.qkv, self.lengths = (self.keys[rows], self.values[rows], self.qkv[rows],
                                                          self.lengths[rows])
        if self.token_scales is not None:
            self.token_scales = (self.token_scales[0][rows], self.token_scales[1][rows])


def group_query_attention(case: Case, float_keys: np.ndarray, float_values: np.ndarray) -> tuple[np.ndarray,
                                                                                               np.ndarray]:
    """ONNX Runtime's outputs for the case: over float32 keys and values, and over the case's int8 cache."""
    exact = session(gqa_model(case.shape, case.tokens, POSITIONS, int8=False), None).run(
        None, case.feeds(float_keys, float_values))[0]
    theirs = session(gqa_model(case.shape, case.tokens, POSITIONS), None).run(
        None, case.feeds(case.keys.copy(), case.values.copy()))[0]
    return exact, theirs


def close(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


CASES = {
    # shape, past per row, new tokens per row
    "prompt chunk": (SMOLLM2, [0], 64),
    "prompt chunk on a past": (PHI35, [700], 37),
    "decode rows of different lengths": (SMOLLM2, [3, 16, 15, 600, 1200], 1),
    "decode, keys split in parts": (PHI35, [1500, 40], 1),
    "drafts: several new tokens for each row": (SMOLLM2, [30, 517, 4], 5),
    "a head of 128, one kv head": (Shape(heads=4, kv_heads=1, head_size=128, rot_half=64), [99, 0], 17),
    "rotary on pairs": (replace(SMOLLM2, interleaved=True), [50, 250], 3),
    "a sliding window": (replace(SMOLLM2, window=100), [300, 20], 9),
    "heads of 256": (Shape(heads=2, kv_heads=2, head_size=256, rot_half=128), [160], 2),
}


CACHE_TYPES = ["int8", "float32", "int4"]


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
@pytest.mark.parametrize("name", CASES)
def test_the_operator_computes_what_the_reference_does(library, name, cache_type):
    shape, past, new = CASES[name]
    case = Case(shape, past, new, seed=len(name), cache_type=cache_type)
    if not SUPPORTED:
        with pytest.raises(KernelError, match="cannot run here"):
            op.build_library(cache_root() / "runtime")
        return
    want, want_keys, want_values = case.expected()
    got, keys, values = case.ours(library)
    for b, length in enumerate(case.lengths):  # the new keys and values: the same bytes (float32 keys: rotated
        # with fused multiply-adds, the reference without: the last bit may differ)
        assert np.allclose(keys[b, :, :length], want_keys[b, :, :length], rtol=0, atol=0 if case.int8 else 1e-6)
        assert np.array_equal(values[b, :, :length], want_values[b, :, :length])
        if case.int4:  # and their token scales (of the rotated keys: the last bit may differ, as for float32)
            (got_key, got_value), (want_key, want_value) = case.present_scales, case.expected_scales
            assert np.allclose(got_key[b, :, :length], want_key[b, :, :length], rtol=1e-6, atol=0)
            assert np.array_equal(got_value[b, :, :length], want_value[b, :, :length])
    # int8 and int4: queries in 16 bits and probabilities in 15, a few 1e-5 of the largest output; float32: rounding
    assert close(got, want) < (1e-3 if case.int8 else 1e-5)


@pytest.mark.parametrize("name", ["prompt chunk on a past", "decode rows of different lengths"])
def test_the_operator_is_as_close_to_float32_keys_and_values_as_group_query_attention_is(library, name):
    """The cost of int8 keys and values is the cache's: the operator adds nothing measurable to it."""
    shape, past, new = CASES[name]
    case = Case(shape, past, new, seed=7)
    if not SUPPORTED:
        return
    # float32 keys and values whose int8 copies the cache holds
    float_keys = case.keys.astype(np.float32) * case.key_scale[None, :, None, :]
    float_values = case.values.astype(np.float32) * case.value_scale[None, :, None, :]
    exact, theirs = group_query_attention(case, float_keys, float_values)
    ours = case.ours(library)[0]
    assert close(ours, theirs) < 1e-3  # GroupQueryAttention over the same int8 cache: rounding apart
    assert close(ours, exact) < 1.5 * close(theirs, exact) + 1e-4


@pytest.mark.parametrize("outlier", [1.0, 30.0, 300.0])
@pytest.mark.parametrize("past, new", [([1500], 16), ([1500, 700], 1)], ids=["prompt chunk", "decode rows"])
def test_with_keys_rounded_from_float_the_operator_adds_nothing_to_the_int8_cache_s_error(library, past, new,
                                                                                          outlier):
    """Keys and values held in int8 as a model's are (rounded from float32, one scale per channel: a few channels
    of the keys far larger than the rest), sharp softmaxes: the operator's 16-bit queries and 15-bit probabilities
    keep its output as close to float32 keys and values as GroupQueryAttention's over the same cache."""
    if not SUPPORTED:
        return
    case = Case(PHI35, past, new, seed=int(outlier))
    rng = np.random.default_rng(5)
    channels = np.ones(PHI35.head_size)
    channels[rng.choice(PHI35.head_size, 4, replace=False)] = outlier
    float_keys = (rng.standard_normal(case.keys.shape) * channels).astype(np.float32)
    float_values = rng.standard_normal(case.values.shape).astype(np.float32)
    case.key_scale = (np.abs(float_keys).max(axis=(0, 2)) / 127).astype(np.float32)
    case.value_scale = (np.abs(float_values).max(axis=(0, 2)) / 127).astype(np.float32)
    case.keys = reference.quantize(float_keys, case.key_scale[None, :, None, :])
    case.values = reference.quantize(float_values, case.value_scale[None, :, None, :])
    case.qkv[..., :PHI35.heads * PHI35.head_size] *= 4  # queries whose softmax picks a few keys
    exact, theirs = group_query_attention(case, float_keys, float_values)
    ours = case.ours(library)[0]
    cache_error = close(theirs, exact)
    assert cache_error > 1e-3  # the cache's own rounding is there to be compared with
    assert close(ours, exact) < 1.1 * cache_error
    assert np.abs(ours - exact).mean() < 1.05 * np.abs(theirs - exact).mean()


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_a_row_s_bits_do_not_depend_on_the_other_rows_nor_on_the_threads(library, cache_type):
    shape = PHI35
    if not SUPPORTED:
        return
    together = Case(shape, [900, 5, 2000, 64], 1, seed=3, tokens=2064, cache_type=cache_type)
    out, _, _ = together.ours(library)
    for row in (0, 2):
        alone = Case(shape, [900, 5, 2000, 64], 1, seed=3, tokens=2064, cache_type=cache_type)
        alone.only(slice(row, row + 1))
        for threads in (1, 2):
            assert np.array_equal(alone.ours(library, threads)[0][0], out[row])


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_drafts_checked_in_one_step_give_each_row_what_it_gets_alone(library, cache_type):
    if not SUPPORTED:
        return
    together = Case(SMOLLM2, [40, 300], 4, seed=11, cache_type=cache_type)
    out = together.ours(library)[0]
    first = Case(SMOLLM2, [40, 300], 4, seed=11, cache_type=cache_type)
    first.only(slice(0, 1))
    assert np.array_equal(first.ours(library)[0][0], out[0])


CHECKS = {
    # shape, past, new tokens checked in one step: a draft's check and the one-token steps it stands for
    "the default model's heads, past parts of 512 keys": (SMOLLM2, 1100, 5),
    "Phi-3.5's heads, a check of 8 drafts across a part's end": (PHI35, 1020, 9),
    "a sliding window": (replace(SMOLLM2, window=700), 1300, 4),
}


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
@pytest.mark.parametrize("name", CHECKS)
def test_a_check_s_tokens_get_the_bits_of_one_token_steps(library, name, cache_type):
    """A draft's check (several new tokens of a row in one step) gives each token the bits the one-token decode steps
    give it: a greedy answer is then the same with drafts and without, as far as the attention goes."""
    shape, past, new = CHECKS[name]
    if not SUPPORTED:
        return
    check = Case(shape, [past], new, seed=5, cache_type=cache_type)
    together, keys, values = check.ours(library)
    one = Case(shape, [past], 1, seed=5, tokens=check.tokens, cache_type=cache_type)
    one.keys, one.values = check.keys.copy(), check.values.copy()
    one.key_scale, one.value_scale = check.key_scale, check.value_scale
    one.token_scales = check.token_scales
    for s in range(new):
        one.qkv, one.lengths = check.qkv[:, s:s + 1], np.array([past + s + 1])
        out, one.keys, one.values = one.ours(library)
        if one.int4:  # the cache the next step starts from: its token scales too
            one.token_scales = one.present_scales
        assert np.array_equal(out[0, 0], together[0, s]), f"token {s}"
    assert np.array_equal(one.keys, keys) and np.array_equal(one.values, values)
    if check.int4:
        assert all(np.array_equal(a, b) for a, b in zip(one.present_scales, check.present_scales, strict=True))


def test_only_graphs_whose_every_attention_it_computes_exactly_are_rewritten():
    for cache_type, int8 in (("int8", True), ("float32", False)):
        model = gqa_model(SMOLLM2, 64, POSITIONS, int8=int8)
        assert attention.swap(model) == 1
        (node,) = model.graph.node
        assert (node.op_type, node.domain) == (attention.OP_TYPES[cache_type], "phi_api")
    float16 = gqa_model(SMOLLM2, 64, POSITIONS, int8=False)
    for value in float16.graph.input[1:3]:
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    refused = {
        "float16 keys and values": float16,
        "a softcap": gqa_model(SMOLLM2, 64, POSITIONS),
        "a head size it does not take": gqa_model(Shape(heads=2, kv_heads=2, head_size=40, rot_half=16), 64,
                                                  POSITIONS),
    }
    refused["a softcap"].graph.node[0].attribute.append(onnx.helper.make_attribute("softcap", 30.0))
    for reason, graph in refused.items():
        before = graph.SerializeToString()
        with pytest.raises(KernelError, match="cannot stand in"):
            attention.swap(graph)
        assert graph.SerializeToString() == before, reason  # nothing changed


def test_without_avx512_vnni_int8_keys_and_values_stay_on_group_query_attention(model_path, tmp_path, monkeypatch,
                                                                                 caplog):
    from phi_api.engine.runtime.model import LanguageModel

    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    with caplog.at_level("INFO"):
        model = LanguageModel(model_path, cache_dir=tmp_path, kv_dtype="int8", attention_kernel="auto")
    assert model.spec.kv_layout == "" and "attention" not in model.decoder_file.name
    with pytest.raises(KernelError, match=r"ATTENTION_KERNEL is phi-api.*lacks avx512bw"):
        LanguageModel(model_path, cache_dir=tmp_path, kv_dtype="int8", attention_kernel="phi-api")


def test_int4_keys_and_values_are_the_operator_s_and_refused_where_it_cannot_serve(model_path, tmp_path, monkeypatch):
    from phi_api.engine.runtime.model import LanguageModel

    if SUPPORTED:
        model = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="int4")
        spec = model.spec
        assert (spec.kv_kind, spec.kv_token_width) == ("int4", spec.head_size // 2 + 4)
        assert spec.kv_layout == attention.LAYOUT
        int8 = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="int8").spec
        assert spec.kv_bytes_per_token * (2 * spec.head_size) == int8.kv_bytes_per_token * (spec.head_size + 8)
        graph = onnx.load(str(model.decoder_file), load_external_data=False).graph
        nodes = [node for node in graph.node if node.op_type == attention.INT4_OP]
        assert len(nodes) == spec.layers and all(node.input[12].startswith("kv_int4.key_scale.") for node in nodes)
        assert not [tensor.name for tensor in graph.initializer if tensor.name.startswith("kv_int8.key_scale.")]
        with pytest.raises(KernelError, match=r"KV_CACHE_DTYPE is int4.*ATTENTION_KERNEL is onnxruntime"):
            LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="int4",
                          attention_kernel="onnxruntime")
    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    with pytest.raises(KernelError, match=r"KV_CACHE_DTYPE is int4.*lacks avx512bw"):
        LanguageModel(model_path, cache_dir=tmp_path, kv_dtype="int4")


def test_int8_keys_and_values_use_the_operator_where_it_runs(model_path, library):
    from phi_api.engine.runtime.model import LanguageModel

    model = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="int8", attention_kernel="auto")
    if not SUPPORTED:
        assert model.spec.kv_layout == ""
        return
    assert model.spec.kv_layout == attention.LAYOUT
    assert model.decoder_file.name == attention.attention_file(model.decoder_file.parent / QUANT_FILE, "int8")
    graph = onnx.load(str(model.decoder_file), load_external_data=False).graph
    kinds = {node.op_type for node in graph.node}
    assert attention.OP_TYPES["int8"] in kinds and "GroupQueryAttention" not in kinds
    kept = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype="int8",
                         attention_kernel="onnxruntime")
    assert kept.spec.kv_layout == "" and "GroupQueryAttention" in {
        node.op_type for node in onnx.load(str(kept.decoder_file), load_external_data=False).graph.node}
