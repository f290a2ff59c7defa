"""Reading an encoder folder's facts, and refusing what is not one."""

from __future__ import annotations

import json

import pytest

from phi_api.engine.encoder.folder import EncoderInfo, is_encoder_folder
from phi_api.errors import FolderError

CONFIG = {"task": "embed", "model_type": "bert", "pooling": "mean", "normalize": True, "max_length": 256,
          "dimensions": 384, "matryoshka_dimensions": [64, 256, 128], "activation": None,
          "inputs": ["input_ids", "attention_mask"], "output": "last_hidden_state"}


def folder(tmp_path, **changes):
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / name).write_text("x")
    (tmp_path / "encoder_config.json").write_text(json.dumps({**CONFIG, **changes}))
    return tmp_path


def test_a_folder_s_facts(tmp_path):
    info = EncoderInfo.read(folder(tmp_path))
    assert (info.task, info.pooling, info.normalize, info.context_length, info.dimensions) == (
        "embed", "mean", True, 256, 384)
    assert info.matryoshka_dimensions == (256, 128, 64) and info.matryoshka
    assert info.inputs == ("input_ids", "attention_mask") and info.fingerprint.startswith("fp_")
    assert is_encoder_folder(tmp_path)


@pytest.mark.parametrize("changes,named", [({"task": "chat"}, "task"), ({"pooling": "weighted"}, "pooling"),
                                           ({"task": "rerank", "activation": "tanh"}, "activation"),
                                           ({"max_length": "long"}, "max_length")])
def test_what_is_wrong_is_named(tmp_path, changes, named):
    with pytest.raises(FolderError, match=named):
        EncoderInfo.read(folder(tmp_path, **changes))


def test_a_folder_without_its_files_is_refused(tmp_path):
    (tmp_path / "encoder_config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(FolderError, match=r"model\.onnx"):
        EncoderInfo.read(tmp_path)
