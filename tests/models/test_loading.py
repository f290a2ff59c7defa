"""Loading a model: a folder that holds a model of another task than the one declared is refused before anything
loads, whichever the two tasks."""

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
