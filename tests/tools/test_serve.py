"""``phi-api serve --embedding``: the default embedding model served beside the chat model, through a models file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phi_api.errors import PreparationError
from phi_api.tools import serve


@pytest.fixture
def prepared(monkeypatch, tmp_path) -> Path:
    folder = tmp_path / "minilm"
    monkeypatch.setattr(serve, "prepare_default_embedding", lambda: folder)
    return folder


def test_the_chat_model_and_the_embedding_model_are_listed_together(prepared):
    env = serve.with_embedding_model({"MODEL_PATH": "/models/chat", "MODEL_ID": "chat", "SERVER_PORT": "9000"})
    assert set(env) == {"MODELS_FILE", "SERVER_PORT"}
    listing = json.loads(Path(env["MODELS_FILE"]).read_text(encoding="utf-8"))
    assert listing == {"models": [{"id": "chat", "path": "/models/chat"},
                                  {"id": "all-minilm-l6-v2", "path": str(prepared), "task": "embed"}]}


def test_a_model_by_name_stays_one_and_a_models_file_is_refused(prepared):
    env = serve.with_embedding_model({"MODEL": "phi-3.5-mini", "MODEL_PATH": ""})
    assert json.loads(Path(env["MODELS_FILE"]).read_text(encoding="utf-8"))["models"][0] == {
        "id": "phi-3.5-mini", "model": "phi-3.5-mini"}
    with pytest.raises(PreparationError, match="MODELS_FILE"):
        serve.with_embedding_model({"MODELS_FILE": "/etc/models.json"})
