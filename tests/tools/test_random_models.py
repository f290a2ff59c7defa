"""The production-shaped benchmark model: Phi-3.5-mini's configuration, and `prepare-model --shape` building it
with the default model's tokenizer (the build itself is too big for the test suite; its toy-sized twin, the tiny
Phi-3 of the integration tests, goes through the same code)."""

from __future__ import annotations

from phi_api.tools import cli
from phi_api.tools.random_models import PHI35_MINI, shape_model_dir


def test_phi_3_5_mini_s_configuration():
    shape = PHI35_MINI
    assert (shape.hidden, shape.intermediate, shape.layers, shape.heads, shape.kv_heads) == (3072, 8192, 32, 32, 32)
    assert (shape.rms_norm_eps, shape.rope_theta) == (1e-5, 10000.0)
    assert (shape.original_positions, shape.max_positions) == (4096, 131072)
    factors = shape.rope_scaling()
    assert factors["type"] == "longrope"
    assert len(factors["short_factor"]) == len(factors["long_factor"]) == 48


def test_prepare_model_shape_builds_it_with_the_default_model_s_tokenizer(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr("phi_api.tools.prepare_command.prepare_default_model", lambda output=None: tmp_path / "default")
    monkeypatch.setattr("phi_api.tools.prepare_command.prepare_shape_model",
                        lambda shape, source, output: calls.append((shape, source, output)) or tmp_path / "built")
    assert cli.main(["prepare-model", "--shape", "phi-3.5-mini", "--output", str(tmp_path / "out")]) == 0
    assert calls == [(PHI35_MINI, tmp_path / "default", tmp_path / "out")]
    assert capsys.readouterr().out.splitlines()[-1] == str(tmp_path / "built")  # the folder, as the last line


def test_it_is_cached_beside_the_default_model(tmp_path):
    assert shape_model_dir(PHI35_MINI, tmp_path) == (
        tmp_path / "models" / "phi-3.5-mini-shape-random-cpu-int4-block-128-acc-level-4")
