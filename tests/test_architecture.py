"""Import direction (../shared/DESIGN.md, Layout): ui -> app; array libraries only in modules
named for their backend; app never imports Qt widgets; no circle of imports, lazy ones included.
An AST walk, so no later change can quietly break it."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARRAY_LIBS = {"mlx", "mlx_lm", "torch", "transformers", "torchao"}
BACKEND_WORDS = ("mlx", "torch", "transformers")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


def test_array_libraries_only_in_backend_named_modules():
    offenders = []
    for path in _files("app"):
        roots = {name.split(".")[0] for name in _imports(path)}
        if roots & ARRAY_LIBS and not any(word in path.stem for word in BACKEND_WORDS):
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(roots & ARRAY_LIBS)}")
    assert not offenders, offenders


def test_ui_never_imports_array_libraries():
    offenders = [str(p.relative_to(ROOT)) for p in _files("ui")
                 if {n.split(".")[0] for n in _imports(p)} & ARRAY_LIBS]
    assert not offenders, offenders


def test_app_never_imports_qt():
    offenders = [str(p.relative_to(ROOT)) for p in _files("app")
                 if any(n.startswith("PySide6") for n in _imports(p))]
    assert not offenders, offenders


def test_engine_core_is_array_free():
    for path in (ROOT / "app" / "engine").glob("*.py"):
        assert not {n.split(".")[0] for n in _imports(path)} & ARRAY_LIBS, path.name


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, dict[str, str]]:
    """Each module of app/ and ui/ -> {a module of theirs it imports: where ("app/cli.py:433")}.
    Imports inside functions count: a lazy import runs all the same, and a circle of them only
    waits for the first call to show (a half-initialised module, an ImportError)."""
    paths = {_module(path): path for folder in ("app", "ui") for path in _files(folder)}

    def ours(name: str) -> str | None:  # "app.models.demo.DEMO_SPECS" -> "app.models.demo"
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        graph[module] = edges = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up per dot after the first
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]  # a module or a name in one
            else:
                continue
            for name in names:
                if (found := ours(name)) not in (None, module):
                    edges.setdefault(found, f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def _shortest_circle(graph: dict[str, dict[str, str]], start: str) -> list[str] | None:
    """The fewest modules that lead from `start` back to it, breadth first; None if none do."""
    came_from, frontier = {start: None}, [start]
    while frontier:
        following = []
        for module in frontier:
            for imported in graph[module]:
                if imported == start:
                    path = [module]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if imported not in came_from:
                    came_from[imported] = module
                    following.append(imported)
        frontier = following
    return None


def test_no_import_circles():
    """A lower module never imports a higher one: where two need a name, it moves down into a small
    module named for what it holds (../shared/DESIGN.md, Layout)."""
    graph = _import_graph()
    circles = {}
    for module in graph:
        circle = _shortest_circle(graph, module)
        if circle:  # one entry per circle, whichever of its modules it was found from
            first = circle.index(min(circle[:-1]))
            circle = circle[first:-1] + circle[:first + 1]
            circles[tuple(circle)] = [graph[a][b] for a, b in pairwise(circle)]
    assert not circles, "import circles:\n" + "\n".join(
        f"{' -> '.join(circle)} ({', '.join(where)})" for circle, where in sorted(circles.items()))


def test_tests_never_see_the_real_user_folders(tmp_path):
    """Every test runs with its own data, config and cache folders (tests/conftest.py)."""
    import huggingface_hub.constants as hf
    import platformdirs

    from app.paths import data_dir

    real_home = Path.home()
    for folder in (data_dir(), Path(platformdirs.user_data_dir("Tandem")), Path(platformdirs.user_config_dir("Tandem")),
                   Path(hf.HF_HOME), Path(hf.HF_TOKEN_PATH).parent):
        assert real_home not in folder.parents or "tandem-tests-" in str(folder) or "pytest-of" in str(folder), folder
