"""Loading a model: a folder that holds a model of another task than the one declared is refused before anything
loads, whichever the two tasks; a draft model whose vocabulary differs is refused."""

from __future__ import annotations

import pytest

from phi_api.errors import ModelLoadingError
from phi_api.models.loading import load_engine
from phi_api.models.specs import ModelSpec, task_mismatch
from phi_api.settings import Settings


@pytest.mark.parametrize(("folder", "declared", "holds"), [
    ("embedding", "rerank", "holds an encoder of the task embed, not rerank"),
    ("embedding", "generate", "holds an encoder of the task embed, not generate"),
    ("generator", "embed", "holds a generator (genai_config.json), not an encoder of the task embed"),
])
def test_a_folder_of_another_task_is_refused_at_load(folder, declared, holds, model_path, embedding_model_path):
    path = embedding_model_path if folder == "embedding" else model_path
    with pytest.raises(ModelLoadingError) as refused:
        load_engine(Settings(), ModelSpec(id="m", path=path, task=declared))
    assert holds in str(refused.value)


def test_a_folder_of_the_declared_task_or_of_none_declared_is_no_mismatch(model_path, embedding_model_path):
    assert [task_mismatch(embedding_model_path, "embed"), task_mismatch(embedding_model_path, None),
            task_mismatch(model_path, "generate"), task_mismatch(model_path, None)] == [None] * 4


def test_a_draft_model_of_another_vocabulary_is_refused_at_load(tiny_phi3, model_path, tmp_path):
    from tests.support.tiny_phi3 import with_renamed_tokens

    other = with_renamed_tokens(tiny_phi3, tmp_path / "renamed", {6: "<think>", 7: "</think>"}, special=False)
    with pytest.raises(ModelLoadingError) as refused:
        load_engine(Settings(), ModelSpec(id="m", path=str(tiny_phi3), options={"SPECULATIVE_DRAFT_MODEL": str(other)}))
    assert "the draft model cannot draft for m: its vocabulary differs from the model's: 2 of its 49156 token ids" in \
        str(refused.value)
    with pytest.raises(ModelLoadingError, match=r"draft model.*not an ONNX Runtime GenAI model folder"):
        load_engine(Settings(), ModelSpec(id="m", path=str(tiny_phi3),
                                          options={"SPECULATIVE_DRAFT_MODEL": str(tmp_path)}))
    # the default model's tokenizer without the tiny Phi-3's added tokens: its drafts mean the same there
    engine = load_engine(Settings(), ModelSpec(id="m", path=str(tiny_phi3),
                                               options={"SPECULATIVE_DRAFT_MODEL": model_path}))
    assert engine.draft is not None and set(engine.folders) == {str(tiny_phi3), model_path}
    with pytest.raises(ModelLoadingError, match="4 of its 49156 token ids stand for other text there, or for none"):
        load_engine(Settings(), ModelSpec(id="m", path=model_path, options={"SPECULATIVE_DRAFT_MODEL": str(tiny_phi3)}))
