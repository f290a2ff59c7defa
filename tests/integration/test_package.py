"""phi-api as a package: the wheel built from this checkout, installed into a fresh virtual environment, serves the
default model with ``phi-api serve`` from outside the checkout, answering the openai SDK, without the conversion
tools installed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from openai import OpenAI

from phi_api.bench.server import free_port
from phi_api.settings import SETTING_NAMES
from tests.support.server import answers_health, wait_until

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The ``bin`` folder of a fresh virtual environment with the wheel (and its runtime dependencies) installed."""
    work = tmp_path_factory.mktemp("package")
    source = work / "source"  # what a source distribution holds: no build folder of an earlier run, no environments
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(CHECKOUT / name, source / name)
    for folder in ("phi_api", "schemas"):
        shutil.copytree(CHECKOUT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(work / "dist"),
                            "-q"], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next((work / "dist").glob("phi_api-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=120)
    bin_dir = work / "venv" / "bin"
    done = subprocess.run([str(bin_dir / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    return bin_dir


def outside(bin_dir: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run([str(bin_dir / "phi-api"), *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=environ)


def test_the_installed_package_has_the_runtime_only_and_its_commands(installed, tmp_path, model_path):
    python = installed / "python"
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0
    assert subprocess.run([str(python), "-c", "import onnxruntime_genai, flask, gevent"]).returncode == 0
    listed = outside(installed, "settings", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    table = listed.stdout.split("\n\n# Sampling defaults of the declared models")[0]
    assert [line.split(" = ")[0] for line in table.splitlines() if not line.startswith(" ")] == list(SETTING_NAMES)
    checked = outside(installed, "check", cwd=tmp_path, MODEL_PATH=model_path, PHI_API_CACHE_DIR=str(tmp_path))
    assert checked.returncode == 0 and checked.stdout.rstrip().endswith("configuration: ok"), checked.stdout


def test_phi_api_serve_from_outside_the_checkout_answers_the_openai_sdk(installed, tmp_path, model_path):
    port = free_port()
    environ = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
               "PHI_API_CACHE_DIR": str(tmp_path / "cache")}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([str(installed / "phi-api"), "serve", "--model-path", model_path, "--model-id", "smol",
                               "--port", str(port), "--workers", "1", "--host", "127.0.0.1"],
                              cwd=tmp_path, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(answers_health(server, url, tmp_path / "serve.log"), timeout=120, interval=0.2,
                   message="phi-api serve to answer /health")
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answer = client.chat.completions.create(model="smol", max_tokens=16, temperature=0, messages=question)
        assert answer.model == "smol" and answer.choices[0].message.content.strip()
        assert answer.usage.completion_tokens > 0
        assert requests.get(url + "/", timeout=10).text.lstrip().lower().startswith("<!doctype html>")  # its files
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
