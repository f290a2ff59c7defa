"""A model's sampling defaults: its folder's generation_config.json under SAMPLING_DEFAULTS, each checked."""

from __future__ import annotations

import json
import logging

import pytest

from phi_api.errors import ConfigError
from phi_api.models.sampling import sampling_defaults
from phi_api.settings import Settings, load_settings, parse_option


def folder(tmp_path, generation_config=None):
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "context_length": 64}}))
    if generation_config is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation_config))
    return str(tmp_path)


def test_the_folders_sampling_fields_are_read_and_the_rest_ignored(tmp_path):
    path = folder(tmp_path, {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "eos_token_id": 2,
                             "min_p": None})
    assert sampling_defaults(Settings(), path) == (("temperature", 0.6), ("top_k", 20), ("top_p", 0.95))


def test_generation_config_off_ignores_the_folder(tmp_path):
    path = folder(tmp_path, {"temperature": 0.6})
    assert sampling_defaults(Settings(GENERATION_CONFIG="off"), path) == ()


def test_sampling_defaults_win_over_the_folder_field_by_field(tmp_path):
    path = folder(tmp_path, {"temperature": 0.6, "top_p": 0.95})
    settings = Settings(SAMPLING_DEFAULTS=parse_option("SAMPLING_DEFAULTS", {"temperature": 0.1}))
    assert sampling_defaults(settings, path) == (("temperature", 0.1), ("top_p", 0.95))


def test_a_folders_field_out_of_bounds_is_left_out_with_a_warning(tmp_path, caplog):
    path = folder(tmp_path, {"temperature": 7, "top_p": 0.5})
    with caplog.at_level(logging.WARNING, logger="phi_api.models.sampling"):
        assert sampling_defaults(Settings(), path) == (("top_p", 0.5),)
    assert "generation_config.json.temperature" in caplog.text


def test_no_generation_config_no_defaults(tmp_path):
    assert sampling_defaults(Settings(), folder(tmp_path)) == ()
    (tmp_path / "generation_config.json").write_text("not json")
    assert sampling_defaults(Settings(), str(tmp_path)) == ()


def test_the_setting_reads_json_from_the_environment():
    settings = load_settings({"SAMPLING_DEFAULTS": '{"repetition_penalty": 1.1, "top_k": 40}'})
    assert settings.SAMPLING_DEFAULTS == (("repetition_penalty", 1.1), ("top_k", 40))


@pytest.mark.parametrize("raw, named", [
    ('{"temperature": 3}', "SAMPLING_DEFAULTS.temperature"),
    ('{"beam_width": 2}', "'beam_width' is not a sampling field"),
    ('[0.5]', "JSON object"),
    ('{"temperature": ', "JSON object"),
    ('{"top_k": "many"}', "SAMPLING_DEFAULTS.top_k"),
])
def test_a_bad_setting_is_refused_naming_it(raw, named):
    with pytest.raises(ConfigError) as caught:
        load_settings({"SAMPLING_DEFAULTS": raw})
    assert named in str(caught.value)
