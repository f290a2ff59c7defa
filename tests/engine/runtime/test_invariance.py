"""Batch invariance on the real model: with an even row count, a row's logits are the same bits whatever rows share
its step (their number, tokens and lengths), through the whole graph: the 4-bit matrices, attention, the norms and
the last projection (engine.sched.padding pads odd steps to an even count)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.session import Decoder
from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.errors import KernelError

ROWS = 8
TARGET = [5, 8, 17, 29, 101, 7, 64, 12, 300, 41, 9, 77]  # the row under test: its prompt, then its next token


def target_logits(decoder: Decoder, steps: list[tuple[int, int, int]], seed: int, vocab: int) -> list[np.ndarray]:
    """The target row's logits in each of ``steps`` (first row, row count, the target's index in the step): the
    target's prompt sits in rows 0 and 3, the other rows hold prompts of other lengths and feed other tokens."""
    pool = KVPool(decoder.spec, ROWS, 256)
    rng = np.random.default_rng(seed)
    try:
        prompt, token = np.array(TARGET[:-1]), TARGET[-1]
        lengths = {}
        for row in range(ROWS):
            tokens = prompt if row in (0, 3) else rng.integers(10, vocab - 10, size=4 + 13 * row)
            decoder.step(pool, row, tokens[None, :].astype(np.int64), np.array([0]), True)
            lengths[row] = len(tokens)
        seen = []
        for first, count, at in steps:
            ids = rng.integers(10, vocab - 10, size=(count, 1))
            ids[at, 0] = token
            past = np.array([lengths[first + index] for index in range(count)])
            seen.append(decoder.step(pool, first, ids, past, False)[at].copy())
        assert np.isfinite(seen[0]).all() and seen[0].std() > 0
        return seen
    finally:
        decoder.unbind()
        pool.close()


def test_a_row_s_logits_do_not_depend_on_its_neighbours_in_even_steps(model_path):
    folder = Path(model_path)
    spec = DecoderSpec.read(folder)
    decoder = Decoder(folder / "model.onnx", spec, threads=2)
    # two to eight rows, the target first or inside, each twice (the neighbours feed other tokens each time)
    steps = [step for step in ((0, 2, 0), (0, 4, 0), (0, 8, 0), (2, 2, 1), (2, 6, 1), (0, 6, 3)) for _ in range(2)]
    seen = target_logits(decoder, steps, seed=3, vocab=spec.vocab_size)
    assert all(np.array_equal(seen[0], logits) for logits in seen[1:])


@pytest.mark.parametrize("kv_dtype", ["int8", "int4", "float32"])
def test_a_graph_of_row_wise_operators_gives_a_row_the_same_bits_at_any_row_count(model_path, tiny_phi3, tmp_path,
                                                                                 kv_dtype):
    """Phi-3.5's recipe (4-bit weights; int8, int4 or float32 keys and values) on phi-api's operators: a row's logits
    are the same bits alone, in odd steps and in even ones, so BATCH_INVARIANT needs no padding row there; the default
    model (ONNX Runtime's 8-bit matrices and float32 ones) keeps it."""
    from phi_api.engine.kernels import op
    from phi_api.engine.kernels.native import unsupported
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.rowwise import row_wise
    from phi_api.settings import cache_root

    assert not row_wise(Path(model_path) / "model.onnx")
    if unsupported() is None:  # the library `make install` built, where this model's cache looks for it
        op.library_path(tmp_path).parent.mkdir(parents=True)
        shutil.copy(op.build_library(cache_root() / "runtime"), op.library_path(tmp_path))
    if kv_dtype == "int4" and unsupported() is not None:
        with pytest.raises(KernelError, match="KV_CACHE_DTYPE is int4"):  # only phi-api's attention computes it
            LanguageModel(str(tiny_phi3), cache_dir=tmp_path, kv_dtype=kv_dtype)
        return
    model = LanguageModel(str(tiny_phi3), cache_dir=tmp_path, kv_dtype=kv_dtype)
    assert model.spec.row_wise == (unsupported() is None) and model.spec.kv_kind == kv_dtype
    if not model.spec.row_wise:
        return  # no AVX-512 VNNI: ONNX Runtime's operators serve, and the padding row with them
    steps = [(0, 1, 0), (3, 1, 0), (0, 3, 0), (2, 3, 1), (0, 5, 3), (0, 2, 0), (3, 5, 0)]
    seen = target_logits(model.new_decoder(2), steps, seed=5, vocab=1000)
    assert all(np.array_equal(seen[0], logits) for logits in seen[1:])


def test_the_default_model_on_phi_api_s_operators_needs_no_padding_row(model_path):
    """Its 8-bit matrices on phi-api's kernel, its float32 ones with bfloat16 weights, phi-api's attention: a row's
    logits are the same bits alone and in steps of any row count. Without AVX-512 VNNI ONNX Runtime's operators
    serve, and the padding row with them."""
    from phi_api.engine.kernels.native import unsupported
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.settings import cache_root

    model = LanguageModel(model_path, cache_dir=cache_root() / "runtime")
    assert model.spec.row_wise == (unsupported() is None)
    if not model.spec.row_wise:
        return
    steps = [(0, 1, 0), (3, 1, 0), (0, 3, 0), (2, 3, 1), (0, 5, 3), (0, 2, 0), (3, 5, 0), (0, 7, 3)]
    seen = target_logits(model.new_decoder(2), steps, seed=7, vocab=model.spec.vocab_size)
    assert all(np.array_equal(seen[0], logits) for logits in seen[1:])


def test_with_phi_api_s_attention_a_check_in_an_even_step_gives_each_token_one_token_steps_bits(model_path):
    """The default model (ONNX Runtime's 8-bit and float32 matrices) with phi-api's attention over its float32 keys
    and values: drafts of several rows checked in one step of an even number of token-rows give each token the bits
    of one-token steps of two rows (what BATCH_INVARIANT's padding makes every step), whatever the rows and tokens a
    row (odd ones included, with an even count of rows). The scheduler never takes an odd number of token-rows there
    (engine.sched.verify), whose last one ONNX Runtime computes alone, in another order."""
    from phi_api.engine.kernels.native import unsupported
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.settings import cache_root

    model = LanguageModel(model_path, cache_dir=cache_root() / "runtime")
    assert model.spec.multi_token_rows == (unsupported() is None)
    if not model.spec.multi_token_rows:
        return  # no AVX-512 VNNI: GroupQueryAttention serves, and checks stay steps of their own
    decoder = model.new_decoder(2)
    pool = KVPool(decoder.spec, 10, 512)
    prompt, tokens = np.arange(1000, 1150, dtype=np.int64), [5, 77, 901, 33, 42, 7, 100, 2000, 15]
    try:
        def prefill(rows: range) -> None:
            for row in rows:
                for start in range(0, len(prompt), 64):
                    decoder.step(pool, row, prompt[None, start:start + 64], np.array([start]), True)

        prefill(range(2))
        one = [decoder.step(pool, 0, np.array([[token], [0]]), np.array([len(prompt) + index, 9]), False)[0].copy()
               for index, token in enumerate(tokens)]
        for rows, new in ((1, 6), (2, 9), (3, 4), (8, 9), (9, 2)):
            prefill(range(rows))
            checked = decoder.step(pool, 0, np.array([tokens[:new]] * rows), np.full(rows, len(prompt)), False,
                                   every_position=True)
            assert all(np.array_equal(checked[row, index], one[index]) for row in range(rows)
                       for index in range(new)), (rows, new)
    finally:
        decoder.unbind()
        pool.close()


CUTS = [(64, 128), (1, 2, 77), (149,), (10, 20, 30, 40, 50, 60, 70, 100, 140), (130, 131, 132)]


def cut_logits(decoder, prompt: np.ndarray, cuts: tuple[int, ...], fed_alone: int, token: int) -> list[np.ndarray]:
    """The logits after a prompt computed in chunks ending at ``cuts`` (then at its end), its last ``fed_alone``
    tokens fed one decode step each (an answer's tokens are), and after one token more."""
    pool = KVPool(decoder.spec, 2, 256)
    try:
        start, logits = 0, None
        for end in [*(cut for cut in cuts if cut < len(prompt) - fed_alone), len(prompt) - fed_alone]:
            logits = decoder.step(pool, 0, prompt[None, start:end], np.array([start]), True).copy()
            start = end
        for position in range(start, len(prompt)):
            logits = decoder.step(pool, 0, prompt[None, position:position + 1], np.array([position]), False).copy()
        after = decoder.step(pool, 0, np.array([[token]]), np.array([len(prompt)]), False).copy()
        return [logits, after]
    finally:
        decoder.unbind()
        pool.close()


@pytest.mark.parametrize(("model", "kv_dtype"), [("default", "float32"), ("default", "int8"), ("phi3", "int8"),
                                                ("phi3", "int4")])
def test_on_a_row_wise_graph_a_prompt_s_bits_do_not_depend_on_how_it_is_cut(model_path, tiny_phi3, tmp_path, model,
                                                                            kv_dtype):
    """What free cuts rest on (engine.kv.reuse.ReusePolicy.free_cuts): the default model and Phi-3.5's recipe on
    phi-api's operators give a prompt's last token, and the token after it, the same logits however the prompt was
    cut into chunks, and whether its last tokens came in a chunk or one decode step each (as an answer's do: a
    conversation's next turn resumes after them)."""
    from phi_api.engine.kernels import op
    from phi_api.engine.kernels.native import unsupported
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.settings import cache_root

    if model == "phi3" and unsupported() is None:  # the library `make install` built, where this cache looks for it
        op.library_path(tmp_path).parent.mkdir(parents=True)
        shutil.copy(op.build_library(cache_root() / "runtime"), op.library_path(tmp_path))
    folder, cache = (model_path, cache_root() / "runtime") if model == "default" else (str(tiny_phi3), tmp_path)
    if kv_dtype == "int4" and unsupported() is not None:
        return  # only phi-api's attention computes int4 keys and values (the model refuses to load: test above)
    served = LanguageModel(folder, cache_dir=cache, kv_dtype=kv_dtype)
    assert served.spec.row_wise == (unsupported() is None)
    if not served.spec.row_wise:
        return  # no AVX-512 VNNI: ONNX Runtime's operators serve, and prompts keep their grid
    decoder = served.new_decoder(2)
    prompt = np.arange(100, 250, dtype=np.int64)
    seen = [cut_logits(decoder, prompt, cuts, fed_alone, token=77) for cuts in CUTS for fed_alone in (0, 3)]
    assert np.isfinite(seen[0][0]).all() and seen[0][0].std() > 0
    assert all(np.array_equal(seen[0][0], logits) and np.array_equal(seen[0][1], after) for logits, after in seen)
