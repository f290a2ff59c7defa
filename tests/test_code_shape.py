"""The package's code stays easy to read: no module over 400 lines, no function over 60, no class over 200."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "phi_api"
FILES = sorted(PACKAGE.rglob("*.py"))
LIMITS = {"module": 400, "function": 60, "class": 200}


def sizes(path: Path) -> list[tuple[str, str, int]]:
    """(kind, name, lines) of ``path`` itself and of every function and class in it."""
    text = path.read_text(encoding="utf-8")
    found = [("module", path.name, len(text.splitlines()))]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            found.append((kind, node.name, (node.end_lineno or node.lineno) - node.lineno + 1))
    return found


@pytest.mark.parametrize("path", FILES, ids=[str(path.relative_to(PACKAGE)) for path in FILES])
def test_modules_fit_400_lines_functions_60_and_classes_200(path):
    assert [item for item in sizes(path) if item[2] > LIMITS[item[0]]] == []


def test_every_module_says_what_it_is_for():
    assert [str(path.relative_to(PACKAGE)) for path in FILES
            if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))] == []


def test_the_measure_sees_a_long_function(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n" + "    x = 1\n" * 70)
    assert sizes(source) == [("module", "long.py", 71), ("function", "f", 71)]
