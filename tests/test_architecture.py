"""Import direction (../shared/DESIGN.md, Layout): ui -> app; array libraries only in modules
named for their backend; app never imports Qt widgets. An AST walk, so no later change can
quietly break it."""

from __future__ import annotations

import ast
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


def test_tests_never_see_the_real_user_folders(tmp_path):
    """Every test runs with its own data, config and cache folders (tests/conftest.py)."""
    import huggingface_hub.constants as hf
    import platformdirs

    from app.paths import data_dir

    real_home = Path.home()
    for folder in (data_dir(), Path(platformdirs.user_data_dir("Tandem")), Path(platformdirs.user_config_dir("Tandem")),
                   Path(hf.HF_HOME), Path(hf.HF_TOKEN_PATH).parent):
        assert real_home not in folder.parents or "tandem-tests-" in str(folder) or "pytest-of" in str(folder), folder
