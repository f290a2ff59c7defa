"""The prepared default model keeps its source's quality: measured against a float32 build of the same GGUF
(``make bench-quality`` (``phi-api bench quality``) prints the same figures, with decode speeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phi_api.bench import quality
from phi_api.tools.prepare import DEFAULT_RECIPE, check_quantization, default_model_dir, prepare_default_model

TOKENS = 1024


@pytest.fixture(scope="module")
def float32_build(user_cache: Path) -> str:
    """The float32 reference build (prepared into the user's cache once, like the default model)."""
    return str(prepare_default_model(default_model_dir(user_cache, reference=True), reference=True))


@pytest.fixture(scope="module")
def logprobs(model_path: str, float32_build: str, tmp_path_factory: pytest.TempPathFactory):
    from phi_api.engine.runtime.model import LanguageModel

    cache = tmp_path_factory.mktemp("runtime")
    served = LanguageModel(model_path, cache_dir=cache, kv_dtype="float32")
    reference = LanguageModel(float32_build, cache_dir=cache, kv_dtype="float32")
    ids = quality.read_ids(reference, quality.DEFAULT_TEXT, TOKENS)
    return ids, quality.position_logprobs(reference, ids, 2), quality.position_logprobs(served, ids, 2)


def test_the_default_model_is_built_with_the_default_recipe(model_path):
    check_quantization(Path(model_path) / "model.onnx", DEFAULT_RECIPE)  # raises otherwise


def test_the_reference_has_no_quantized_matmul(float32_build):
    check_quantization(Path(float32_build) / "model.onnx", {"precision": "fp32", "block_size": 0,
                                                            "accuracy_level": 0})


def test_perplexity_within_1_10x_of_float32_and_top1_agreement_at_least_0_85(logprobs):
    ids, reference, served = logprobs
    assert len(ids) == TOKENS and reference.shape == served.shape == (TOKENS - 1, reference.shape[1])
    measured = quality.compare(reference, served, ids)
    assert measured.within(1.10, 0.85), measured


def test_the_figures_tell_a_worse_build_apart(logprobs):
    """The yardstick is not blind: the same logits with noise added fall outside both bounds."""
    ids, reference, served = logprobs
    noisy = quality._log_softmax(served + np.random.default_rng(0).normal(0, 2.0, served.shape))
    measured = quality.compare(reference, noisy, ids)
    assert not measured.within(1.10, 0.85), measured
