"""Integration fixtures: real gunicorn processes serving the real default model on loopback."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from tests.support.server import Server

MODEL_ID = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def server(model_path, logs_dir):
    """The server as `make serve` runs it: 2 gevent workers, preloaded model."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2,
                MAX_CONCURRENT_REQUESTS=16) as running:
        yield running


@pytest.fixture(scope="session")
def client(server):
    """The official openai client, pointed at the server."""
    return OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=120)



@pytest.fixture(scope="session")
def reference_model(model_path):
    """ONNX Runtime GenAI's own Python API on the same model (loaded once): the yardstick."""
    import onnxruntime_genai as og

    model = og.Model(model_path)
    return model, og.Tokenizer(model)


@pytest.fixture(scope="session")
def reference(reference_model):
    """Token counts by ONNX Runtime GenAI's own tokenizer: the yardstick for usage counts."""
    _, tokenizer = reference_model

    class Reference:
        def chat_tokens(self, messages) -> int:
            prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
            return len(tokenizer.encode(prompt))

        def tokens(self, text: str) -> int:
            return len(tokenizer.encode(text))

        def continued_tokens(self, messages, start: str) -> int:
            """The chat with the assistant's turn opened and ``start`` written in it."""
            prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
            return len(tokenizer.encode(prompt + start))

    return Reference()


@pytest.fixture(scope="session")
def limited_server(model_path, logs_dir):
    """Two workers sharing a limit of two concurrent generations."""
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2,
                MAX_CONCURRENT_REQUESTS=2) as running:
        yield running


@pytest.fixture(scope="session")
def reference_logprobs(reference_model):
    """Log-probability of the greedy first answer token, computed with ONNX Runtime GenAI's own Python API."""
    import numpy as np
    import onnxruntime_genai as og

    model, tokenizer = reference_model

    def first_token_logprob(messages):
        prompt = tokenizer.encode(tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 2, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        logits = generator.get_logits()[0, -1].astype(np.float64)
        logprobs = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        return [float(logprobs.max())]

    return first_token_logprob


@pytest.fixture(scope="session")
def reference_token(reference_model):
    """The token id of a piece of text (which must be a single token)."""
    _, tokenizer = reference_model

    def token(text):
        ids = tokenizer.encode(text)
        assert len(ids) == 1, ids
        return int(ids[0])

    return token
