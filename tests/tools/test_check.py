"""``python -m phi_api settings`` and ``check``: every declared setting listed, a misspelt one and a missing model
folder flagged before the server starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from phi_api.settings import SETTING_NAMES, describe
from phi_api.tools import check, settings_command


def phi_api(*args: str, **environ: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **environ}
    return subprocess.run([sys.executable, "-m", "phi_api", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_settings_lists_every_declared_setting_and_hides_keys():
    listed = phi_api("settings", SERVER_PORT="8123", API_KEYS="sk-secret-one")
    assert listed.returncode == 0, listed.stderr
    table, models = listed.stdout.split("\n\n# Sampling defaults of the declared models")
    names = [line.split(" = ")[0] for line in table.splitlines() if not line.startswith(" ")]
    assert names == list(SETTING_NAMES)
    assert models.splitlines()[1].startswith("(none) = no model to serve")
    assert "SERVER_PORT = 8123 (default 8000)" in listed.stdout
    assert "sk-secret-one" not in listed.stdout and "API_KEYS = (set)" in listed.stdout
    rows = settings_command.table({})
    assert all(row["value"] is None for row in rows)
    assert {row["name"]: row["description"] for row in rows} == describe()


def test_check_flags_a_misspelt_setting_and_a_missing_model_folder(tmp_path):
    found = phi_api("check", SERVER_PROT="9000", PHI_API_MODLE="x", MODEL_PATH=str(tmp_path / "nowhere"),
                    PHI_API_CACHE_DIR=str(tmp_path))
    assert found.returncode == 1, found.stdout + found.stderr
    assert "warning: SERVER_PROT is not a setting (ignored); did you mean SERVER_PORT?" in found.stdout
    assert "warning: PHI_API_MODLE is not a setting" in found.stdout
    assert f"error: model phi-3.5-mini: No folder {tmp_path / 'nowhere'} on the server." in found.stdout
    assert found.stdout.rstrip().endswith("configuration: NOT usable")


def test_check_passes_a_served_folder_and_says_what_it_runs_with(model_path, tmp_path):
    found = phi_api("check", MODEL_PATH=model_path, WEB_CONCURRENCY="2", INTRA_OP_THREADS="1",
                    PHI_API_CACHE_DIR=str(tmp_path))
    assert found.returncode == 0, found.stdout + found.stderr
    assert f"model phi-3.5-mini: {model_path}" in found.stdout
    assert "workers: 2, ONNX Runtime threads each: 1" in found.stdout
    assert found.stdout.rstrip().endswith("configuration: ok")


def test_check_passes_an_encoder_beside_a_generator_and_flags_a_task_its_folder_does_not_do(model_path,
                                                                                                embedding_model_path,
                                                                                                tmp_path):
    listing = tmp_path / "models.json"
    for task, ok in (("embed", True), ("rerank", False)):
        listing.write_text(json.dumps({"models": [{"id": "chat", "path": model_path},
                                                  {"id": "vectors", "path": embedding_model_path, "task": task}]}))
        found = phi_api("check", MODELS_FILE=str(listing), PHI_API_CACHE_DIR=str(tmp_path))
        assert (found.returncode == 0) == ok, found.stdout + found.stderr
        assert ok or f"holds an encoder of the task embed, not {task}" in found.stdout


def test_a_bad_value_is_an_error_and_ordinary_variables_are_no_warning(tmp_path):
    errors, warnings, _ = check.run({"SERVER_PORT": "eighty", "HOME": "/root", "LOGNAME": "root",
                                     "PATH": "/usr/bin", "MODEL_PATH": str(tmp_path)})
    assert len(errors) == 1 and "SERVER_PORT" in errors[0]
    assert warnings == []


def test_models_declared_by_name_are_not_pulled_by_a_check(tmp_path, monkeypatch):
    def no_pull(name: str) -> str:
        raise AssertionError(f"check pulled {name}")

    monkeypatch.setattr("phi_api.models.specs.pulled", no_pull)
    errors, _, notes = check.run({"MODEL": "phi-3.5-mini", "PHI_API_CACHE_DIR": str(tmp_path)})
    assert errors == [] and any("not checked here" in note for note in notes)
    models_file = tmp_path / "models.json"  # a models file naming one model by name and one by folder
    models_file.write_text(json.dumps([{"model": "phi-3.5-mini"}, {"id": "here", "path": str(tmp_path)}]))
    errors, _, _ = check.run({"MODELS_FILE": str(models_file), "PHI_API_CACHE_DIR": str(tmp_path)})
    assert len(errors) == 1 and "not an ONNX Runtime GenAI model folder" in errors[0]


def test_without_any_model_the_server_would_not_start_and_the_check_says_what_to_set(tmp_path):
    errors, _, _ = check.run({"PHI_API_CACHE_DIR": str(tmp_path)})
    assert len(errors) == 1 and errors[0].startswith("no model to serve: set MODEL_PATH to a model folder")


def test_the_settings_reference_in_docs_is_generated_from_the_declarations():
    page = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == settings_command.reference(), "run: python -m phi_api settings --markdown > docs/settings.md"
    assert all(f"| `{name}` |" in page for name in SETTING_NAMES)


def test_settings_shows_each_declared_models_sampling_defaults(tmp_path):
    for name, generation_config in (("a", {"temperature": 0.6, "top_k": 20}), ("b", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "genai_config.json").write_text(json.dumps({"model": {"context_length": 64}}))
        if generation_config:
            (tmp_path / name / "generation_config.json").write_text(json.dumps(generation_config))
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps([{"id": "alpha", "path": str(tmp_path / "a"),
                                    "options": {"SAMPLING_DEFAULTS": {"top_k": 40}}},
                                   {"id": "beta", "path": str(tmp_path / "b")}]))
    listed = phi_api("settings", MODELS_FILE=str(listing))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[-2:] == ['alpha = {"temperature": 0.6, "top_k": 40}', "beta = {}"]
