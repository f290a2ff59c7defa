"""instructor (1.17, in a virtual environment of its own: requirements-instructor.txt) against real gunicorn on the
real model: a plain pydantic model's schema does not close its objects, and the server still answers only the keys
it declares (as OpenAI's structured outputs and vLLM's grammar do), so instructor parses it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.integration.conftest import MODEL_ID

REPO = Path(__file__).resolve().parents[2]
INSTRUCTOR_PYTHON = REPO / ".venv-instructor" / "bin" / "python"
SCRIPT = REPO / "tests" / "clients" / "instructor_city.py"


def test_a_plain_pydantic_model_in_json_schema_mode(server):
    assert INSTRUCTOR_PYTHON.exists(), "instructor's environment is missing: `make test` builds .venv-instructor"
    ran = subprocess.run([str(INSTRUCTOR_PYTHON), str(SCRIPT), server.url + "/v1", MODEL_ID], capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]  # IncompleteOutputException, when undeclared keys ran on
    answer = json.loads(ran.stdout)
    assert answer["keys"] == ["country", "name"]  # only the declared keys (unclosed, greedy gave five here)
    assert all(isinstance(value, str) for value in answer["parsed"].values())
