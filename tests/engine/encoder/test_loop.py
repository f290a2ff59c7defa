"""The encoder thread on the tiny embedder: requests' inputs encoded together as each alone, cancelled and timed-out
requests dropped, a session that cannot be made failing requests at once rather than leaving them waiting, and the
tokenizer parsed off the hub."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from phi_api.engine import EncoderEngine, EncoderInfo, EngineConfig
from phi_api.engine.encoder.job import Encoding
from phi_api.engine.encoder.loop import EncoderLoop
from phi_api.engine.encoder.tokens import EncoderTokenizer
from tests.support.server import wait_until

TEXTS = ["one", "a somewhat longer second text", "third", "the fourth and longest text of all, with more words"]


@pytest.fixture
def loop(tiny_embedder):
    info = EncoderInfo.read(tiny_embedder)
    running = EncoderLoop(info, EngineConfig(threads=1, max_rows=2), Path(info.path) / "model.onnx")
    running.start()
    yield running, EncoderTokenizer(tiny_embedder)
    running.stop()


def encoded(loop: EncoderLoop, job: Encoding) -> Encoding:
    loop.submit(job)
    return wait_until(lambda: job if job.ended else None, timeout=60, message="the job to end")


def test_inputs_encoded_together_are_the_same_bits_as_each_alone(loop):
    running, tokenizer = loop
    together = encoded(running, Encoding(tokenizer.texts(TEXTS)))  # two rows a call: three calls
    assert together.reason == "stop" and together.results is not None and together.results.shape == (4, 32)
    for index, text in enumerate(TEXTS):
        alone = encoded(running, Encoding(tokenizer.texts([text])))
        assert alone.results is not None and np.array_equal(alone.results[0], together.results[index])
    assert together.done_tokens == sum(len(one) for one in tokenizer.texts(TEXTS))
    assert np.allclose(np.linalg.norm(together.results, axis=1), 1.0, atol=1e-5)


def test_a_cancelled_or_expired_request_is_dropped_with_its_reason(loop):
    running, tokenizer = loop
    cancelled = Encoding(tokenizer.texts(TEXTS))
    cancelled.cancel()
    assert encoded(running, cancelled).reason == "cancelled"
    assert encoded(running, Encoding(tokenizer.texts(TEXTS), timeout=-1.0)).reason == "timeout"


def test_a_session_that_cannot_be_made_fails_requests_at_once(tiny_embedder, tmp_path):
    info = EncoderInfo.read(tiny_embedder)
    broken = EncoderLoop(info, EngineConfig(threads=1), tmp_path / "missing.onnx")
    broken.start()
    try:
        first = encoded(broken, Encoding(EncoderTokenizer(tiny_embedder).texts(["x"])))
        later = encoded(broken, Encoding(EncoderTokenizer(tiny_embedder).texts(["y"])))
    finally:
        broken.stop()
    assert first.reason == later.reason == "error" and later.error and "missing.onnx" in later.error


def test_an_engine_s_memory_in_a_worker_counts_its_weights_unless_they_are_shared(tiny_embedder, tmp_path):
    info = EncoderInfo.read(tiny_embedder)
    own = EncoderEngine(info, EngineConfig()).worker_bytes
    shared = EncoderEngine(info, EngineConfig(), tmp_path / "prepacked.onnx").worker_bytes
    assert own - shared == info.size_bytes and shared > 0


def test_the_tokenizer_is_parsed_off_the_hub_once(tiny_embedder, monkeypatch):
    made_on = []

    class Counted(EncoderTokenizer):
        def __init__(self, folder):
            made_on.append(threading.get_ident())
            super().__init__(folder)

    monkeypatch.setattr("phi_api.engine.encoder.engine.EncoderTokenizer", Counted)
    engine = EncoderEngine(EncoderInfo.read(tiny_embedder), EngineConfig())
    assert engine.vocab_size > 0 and len(engine.texts(["one", "two"])) == 2 and len(engine.token_ids([1, 2])) == 2
    assert len(made_on) == 1 and made_on[0] != threading.get_ident()
