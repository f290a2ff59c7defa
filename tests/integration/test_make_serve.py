"""``make serve`` with a model folder installs the runtime only: no conversion tools (torch) in its environment,
and the server it starts answers the openai SDK."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from openai import OpenAI

from phi_api.bench.server import free_port
from tests.support.server import answers_health, wait_until

CHECKOUT = Path(__file__).resolve().parents[2]


def test_make_serve_with_a_model_path_installs_no_conversion_tools(model_path, tmp_path):
    venv, port = tmp_path / "venv", free_port()
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "MODEL_PATH": model_path,
               "MODEL_ID": "smol", "SERVER_HOST": "127.0.0.1", "SERVER_PORT": str(port), "WEB_CONCURRENCY": "1",
               "PHI_API_CACHE_DIR": str(tmp_path / "cache")}
    log = (tmp_path / "make.log").open("w")
    make = subprocess.Popen(["make", "--no-print-directory", "-C", str(CHECKOUT), "serve", f"VENV={venv}"],
                            env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(answers_health(make, url, tmp_path / "make.log"), timeout=600, interval=0.5,
                   message="make serve to answer /health")
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        answer = client.chat.completions.create(model="smol", max_tokens=8, temperature=0,
                                                messages=[{"role": "user", "content": "Say hello."}])
        assert answer.choices[0].message.content.strip()
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.wait(timeout=60)
        log.close()
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import onnxruntime_genai, gunicorn"]).returncode == 0
    for tool in ("torch", "transformers"):
        assert subprocess.run([str(python), "-c", f"import {tool}"], capture_output=True).returncode != 0, tool
