"""The engine's code stays easy to read: no function in ``phi_api/engine`` over 60 lines, no class over 200."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "phi_api" / "engine"
FILES = sorted(ENGINE.glob("*.py"))


def sizes(path: Path) -> list[tuple[str, str, int]]:
    """(kind, name, lines) of every function and class in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            found.append((kind, node.name, (node.end_lineno or node.lineno) - node.lineno + 1))
    return found


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_engine_functions_fit_60_lines_and_classes_200(path):
    limits = {"function": 60, "class": 200}
    assert [item for item in sizes(path) if item[2] > limits[item[0]]] == []


def test_the_measure_sees_a_long_function(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n" + "    x = 1\n" * 70)
    assert sizes(source) == [("function", "f", 71)]
