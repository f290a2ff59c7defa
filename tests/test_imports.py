"""The package's layering: each folder imports only its own layer and those below it, no import cycles (lazy
imports included), and no Flask, even indirectly, below the web layer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "phi_api"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere in it (a name from a package counts as the package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imported(path, modules) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_the_package_imports_itself_back():
    assert cycles(import_graph()) == []


# Bottom to top: a module may import modules of its own layer and of the layers below, never above.
LAYERS = (
    ("phi_api.errors", "phi_api.version", "phi_api.jsontext"),
    ("phi_api.settings",),
    ("phi_api.engine",),
    ("phi_api.models", "phi_api.limits", "phi_api.storage", "phi_api.telemetry"),
    ("phi_api.service",),
    ("phi_api.protocols",),
    ("phi_api.web",),
    ("phi_api.batches", "phi_api.background"),
    ("phi_api.api",),
    ("phi_api.app",),
    ("phi_api.server",),
    ("phi_api.tools", "phi_api.bench", "phi_api.__main__"),
)
# Up to this layer (the protocols included), nothing reaches Flask or werkzeug, directly or not.
FLASK_FREE_UP_TO = "phi_api.protocols"
FRAMEWORK = {"flask", "flask_cors", "werkzeug"}


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (its longest matching prefix)."""
    found = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    assert found, f"{module} belongs to no layer: add its folder to LAYERS"
    return max(found)[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if target != "phi_api" and layer(target) > layer(module))


def test_every_module_has_a_layer():
    assert [module for module in import_graph() if module != "phi_api" and layer(module) < 0] == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward(import_graph()) == []


def test_the_layer_check_sees_an_upward_import():
    assert upward({"phi_api.engine.runtime.pool": {"phi_api.web.respond"}, "phi_api.web.respond": {"phi_api.engine"}}
                  ) == ["phi_api.engine.runtime.pool -> phi_api.web.respond"]


# The engine's rooms, bottom to top: each imports only its own room and the rooms below (its face, phi_api.engine
# and phi_api.engine.facade, on top).
ENGINE_ROOMS = (
    ("phi_api.engine.threads", "phi_api.engine.kernels", "phi_api.engine.params", "phi_api.engine.config"),
    ("phi_api.engine.sampling",),
    ("phi_api.engine.choice",),  # what the request side and the engine share: a choice, its grammar, its events
    ("phi_api.engine.runtime",),
    ("phi_api.engine.kv",),
    ("phi_api.engine.sched",),
    ("phi_api.engine.encoder",),  # encoders: their own thread and session, beside the generators' rooms
    ("phi_api.engine.facade", "phi_api.engine"),
)


def engine_room(module: str) -> int:
    """The index in :data:`ENGINE_ROOMS` of an engine module's room (the package's own face counts as the top)."""
    if module == "phi_api.engine":
        return len(ENGINE_ROOMS) - 1
    found = [index for index, prefixes in enumerate(ENGINE_ROOMS) for prefix in prefixes
             if prefix != "phi_api.engine" and (module == prefix or module.startswith(prefix + "."))]
    assert found, f"{module} belongs to no room of the engine: add it to ENGINE_ROOMS"
    return found[0]


def engine_upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports between the engine's rooms that run from a lower room to a higher one (a loop between rooms has
    at least one)."""
    inside = {module: {target for target in targets if target.startswith("phi_api.engine")}
              for module, targets in graph.items() if module.startswith("phi_api.engine")}
    return sorted(f"{module} -> {target}" for module, targets in inside.items() for target in targets
                  if engine_room(target) > engine_room(module))


def test_each_room_of_the_engine_imports_only_the_rooms_below_it():
    assert engine_upward(import_graph()) == []


def test_the_engine_check_sees_a_loop_between_two_rooms():
    loop = {"phi_api.engine.kv.cache": {"phi_api.engine.sched.scheduler"},
            "phi_api.engine.sched.scheduler": {"phi_api.engine.kv.cache"}}
    assert engine_upward(loop) == ["phi_api.engine.kv.cache -> phi_api.engine.sched.scheduler"]


def reaches(graph: dict[str, set[str]], start: str, framework: dict[str, bool]) -> bool:
    """Whether ``start`` imports the web framework, itself or through the package modules it imports."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if framework.get(module):
            return True
        todo.extend(graph.get(module, ()))
    return False


def test_nothing_below_the_web_layer_reaches_flask_even_indirectly():
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = import_graph()
    direct = {name: bool(imported(path, FRAMEWORK)) for name, path in paths.items()}
    low = [name for name in paths if name != "phi_api" and layer(name) <= layer(FLASK_FREE_UP_TO)]
    assert low and sorted(name for name in low if reaches(graph, name, direct)) == []


def test_the_flask_check_follows_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert reaches(graph, "a", {"c": True}) and not reaches(graph, "a", {"d": True})


def private_imports(source: str) -> list[str]:
    """Modules of other packages that ``source`` imports by a private name (a part starting with ``_``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [name for name in names if not name.startswith("phi_api")
                  and any(part.startswith("_") and part != "__future__" for part in name.split("."))]
    return found


def test_no_module_imports_another_package_s_private_modules():
    assert private_imports("from huggingface_hub.utils._verification import x\nimport a._b") == [
        "huggingface_hub.utils._verification", "a._b"]
    found = {module_name(path): private_imports(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}
    assert {name: names for name, names in found.items() if names} == {}
