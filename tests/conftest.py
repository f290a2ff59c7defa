"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from phi_api.app import create_app
from phi_api.engine import Engine
from phi_api.web.resources import teardown
from tests.support.fakes import fake_engine, text_pieces

HELLO_PIECES = text_pieces(b"Hello", b",", b" world", b"!", b" How", b" are", b" you", b"?")


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user's phi-api cache, where `make model` prepares the default model.

    For the run, ``PHI_API_CACHE_DIR`` (and with it the host's files that the
    tests' servers and engines make, such as prepacked models) is a temporary
    folder: the tests build models of their own in temporary folders, and
    every run left their prepacked copies in the user's cache (66 MB each
    for the tiny Phi-3). What `make install` built there (phi-api's 4-bit
    kernel) is copied in.
    """
    import shutil

    from phi_api.settings import cache_root

    real = cache_root()
    temporary = tmp_path_factory.mktemp("cache")
    if (real / "runtime" / "kernels").is_dir():
        shutil.copytree(real / "runtime" / "kernels", temporary / "runtime" / "kernels")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PHI_API_CACHE_DIR", str(temporary))
        yield real


@pytest.fixture(scope="session")
def model_path(user_cache: Path) -> str:
    """The prepared default model (SmolLM2-135M-Instruct, int4); prepared here if `make` did not."""
    explicit = os.environ.get("PHI_API_TEST_MODEL_PATH")
    if explicit:
        return explicit
    from phi_api.tools.prepare import default_model_dir, prepare_default_model

    return str(prepare_default_model(default_model_dir(user_cache)))


@pytest.fixture(scope="session")
def tiny_phi3(model_path, tmp_path_factory) -> Path:
    """A tiny random-weight Phi-3 with LongRoPE (see tests/support/tiny_phi3.py), built once per run."""
    from tests.support.tiny_phi3 import build_tiny_phi3

    work = tmp_path_factory.mktemp("tiny-phi3")
    return build_tiny_phi3(Path(model_path), work / "model", work)


@pytest.fixture(scope="session")
def embedding_model_path(user_cache: Path) -> str:
    """The prepared default embedding model (all-MiniLM-L6-v2, float32 ONNX); prepared here if `make` did not."""
    explicit = os.environ.get("PHI_API_TEST_EMBEDDING_PATH")
    if explicit:
        return explicit
    from phi_api.tools.prepare_encoder import default_embedding_dir, prepare_default_embedding

    return str(prepare_default_embedding(default_embedding_dir(user_cache)))


@pytest.fixture(scope="session")
def tiny_cross_encoder(embedding_model_path, tmp_path_factory) -> Path:
    """A tiny random-weight BERT cross-encoder (task rerank; see tests/support/tiny_encoders.py), built once per
    run: the ONNX folder, its Hugging Face source beside it at ``<folder>/../hf``."""
    from tests.support.tiny_encoders import build_tiny_cross_encoder

    work = tmp_path_factory.mktemp("tiny-cross-encoder")
    return build_tiny_cross_encoder(Path(embedding_model_path), work / "model", work)


@pytest.fixture(scope="session")
def tiny_embedder(embedding_model_path, tmp_path_factory) -> Path:
    """A tiny random-weight BERT embedder (CLS pooling, normalized, Matryoshka 32/16/8; see
    tests/support/tiny_encoders.py), built once per run: the ONNX folder, its Hugging Face source beside it at
    ``<folder>/../hf``."""
    from tests.support.tiny_encoders import build_tiny_embedder

    work = tmp_path_factory.mktemp("tiny-embedder")
    return build_tiny_embedder(Path(embedding_model_path), work / "model", work)


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., Flask]:
    """Build an app from the factory around a given engine (default: a fake saying "Hello, world!")."""
    built: list[Flask] = []

    def build(engine: Engine | None = None, loader: Any = None, **config: Any) -> Flask:
        settings = {"MODEL_ID": "test-model", "MODEL_PATH": str(tmp_path), "DATA_DIR": str(tmp_path / "data"),
                    **config}
        if loader is None and engine is None:
            engine = fake_engine([1, 2, 3, 4, 0], HELLO_PIECES)
        app = create_app({"TESTING": True, **settings}, engine=engine, loader=loader)
        built.append(app)
        return app

    yield build
    for app in built:
        teardown(app)


@pytest.fixture
def client(make_app: Callable[..., Flask]):
    """A test client of an app with the default fake engine."""
    return make_app().test_client()
