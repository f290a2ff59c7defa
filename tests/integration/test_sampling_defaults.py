"""A model's sampling defaults against real gunicorn through the openai SDK: its folder's generation_config.json
and MODELS_FILE's per-model SAMPLING_DEFAULTS fill what a request omits, never what it sets."""

from __future__ import annotations

import json
from pathlib import Path

import ollama
import pytest
from openai import OpenAI

from tests.support.server import Server

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
SEEDS = (1, 2, 3)


def folder_view(model_path: str, target: Path, generation_config: dict | None) -> str:
    """The model's files linked into ``target``, with a generation_config.json of its own (or none)."""
    target.mkdir()
    for entry in Path(model_path).iterdir():
        if entry.is_file() and entry.name != "generation_config.json":
            (target / entry.name).symlink_to(entry)
    if generation_config is not None:
        (target / "generation_config.json").write_text(json.dumps(generation_config))
    return str(target)


@pytest.fixture(scope="module")
def served(model_path, logs_dir, tmp_path_factory):
    """Three views of the default model: greedy by its folder, greedy by MODELS_FILE over a folder that says
    otherwise, and one with no defaults at all (the server's: DEFAULT_TEMPERATURE)."""
    root = tmp_path_factory.mktemp("sampling-defaults")
    listing = root / "models.json"
    listing.write_text(json.dumps({"models": [
        {"id": "by-folder", "path": folder_view(model_path, root / "a", {"temperature": 0.0, "eos_token_id": 2})},
        {"id": "by-models-file", "path": folder_view(model_path, root / "b", {"temperature": 1.5}),
         "options": {"SAMPLING_DEFAULTS": {"temperature": 0}}},
        {"id": "none", "path": folder_view(model_path, root / "c", None)},
    ]}))
    with Server(logs_dir, MODELS_FILE=str(listing), MAX_MODELS=3) as running:
        yield running


def answers(client: OpenAI, model: str, **fields) -> list[str]:
    return [client.chat.completions.create(model=model, messages=PROMPT, max_tokens=24, seed=seed,
                                           **fields).choices[0].message.content for seed in SEEDS]


def test_a_models_defaults_fill_what_a_request_omits(served):
    client = OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    # the control: without defaults of its own the model samples (DEFAULT_TEMPERATURE), so the seeds matter
    assert len(set(answers(client, "none"))) > 1
    for model in ("by-folder", "by-models-file"):
        greedy = answers(client, model, temperature=0)[0]
        assert answers(client, model) == [greedy] * len(SEEDS), model


def test_what_a_request_sets_wins_over_the_defaults(served):
    client = OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    for model in ("by-folder", "by-models-file"):
        assert len(set(answers(client, model, temperature=1.5))) > 1, model


def test_the_defaults_are_shown_with_the_model(served):
    client = OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    shown = {model: client.models.retrieve(model).model_extra["sampling_defaults"]
             for model in ("by-folder", "by-models-file", "none")}
    assert shown == {"by-folder": {"temperature": 0.0}, "by-models-file": {"temperature": 0.0}, "none": {}}
    parameters = ollama.Client(host=served.url).show("by-folder").parameters
    assert parameters.splitlines()[1:] == ["temperature 0.0"]
