"""Every module, class, function and method a docstring or comment names with a role (``:mod:``, ``:class:``,
``:func:``, ``:meth:``, ``:data:``, ``:attr:``) still exists where it says: names of the package (``engine.kv.ledger``
or ``phi_api.engine.kv.ledger``, relative ones such as ``.shapes``), of the standard library's builtins, or of the
same module. A move leaves no docstring pointing at the old place."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "phi_api"
ROLE = re.compile(r":(mod|class|func|meth|data|attr):`~?([A-Za-z_.][A-Za-z0-9_.]*)`")
# Libraries a docstring may name by role; their names are not checked here.
FOREIGN = {"gevent", "flask", "werkzeug", "onnxruntime", "onnxruntime_genai", "sqlalchemy", "numpy", "llguidance",
           "prometheus_client", "opentelemetry", "gunicorn", "jsonschema", "onnx", "huggingface_hub", "transformers",
           "jinja2"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined(path: Path) -> set[str]:
    """The names a module defines or imports, at any depth (methods of its classes included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
DEFINED = {name: defined(path) for name, path in MODULES.items()}


def resolves(target: str, role: str, here: str, package: str) -> bool:
    """Whether a role's target names something that exists (see the module's docstring)."""
    if target.startswith("."):
        level = len(target) - len(target.lstrip("."))
        base = package.split(".")[: len(package.split(".")) - level + 1]
        target = ".".join(base + [target.lstrip(".")])
    first = target.split(".")[0]
    if first in FOREIGN or hasattr(builtins, first) or first in DEFINED[here]:
        return True
    if "." not in target and role == "attr":  # an instance's attribute, named bare
        return True
    for candidate in (target, "phi_api." + target):
        parts = candidate.split(".")
        for end in range(len(parts), 0, -1):
            module = ".".join(parts[:end])
            if module in MODULES:
                rest = parts[end:]
                if not rest or rest[0] in DEFINED[module]:
                    return True
                break
    return False


def references() -> list[tuple[str, int, str, str]]:
    found = []
    for name, path in sorted(MODULES.items()):
        text = path.read_text(encoding="utf-8")
        for match in ROLE.finditer(text):
            found.append((name, text[:match.start()].count("\n") + 1, match.group(1), match.group(2)))
    return found


def test_every_role_in_a_docstring_names_something_that_exists():
    broken = []
    for name, line, role, target in references():
        package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        if not resolves(target, role, name, package):
            broken.append(f"{MODULES[name].relative_to(PACKAGE.parent)}:{line}: :{role}:`{target}`")
    assert broken == []


@pytest.mark.parametrize("target,role,expected", [
    ("engine.kv.ledger", "mod", True), ("phi_api.engine.kv.ledger.Ledger", "class", True),
    ("engine.kvpool", "mod", False), ("engine.kv.ledger.Nothing", "class", False), ("RecursionError", "class", True),
])
def test_the_check_tells_a_name_that_exists_from_one_that_moved(target, role, expected):
    assert resolves(target, role, "phi_api.jsontext", "phi_api") is expected
