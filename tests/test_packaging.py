"""The packages stay buildable without building them on every run: the spec, the build script,
the icons, the Linux desktop entry and the hosted workflow are checked here; the self-test the
frozen apps run is run here on the demo pair."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packaging"))

import bundle_contents  # noqa: E402


def _load_build():
    """packaging/build.py, by path: a module named `build` may also be installed (pypa/build)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tandem_packaging_build", ROOT / "packaging" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()

WORKFLOW = ROOT / ".github" / "workflows" / "build.yml"


def test_the_build_has_everything_it_needs():
    assert build.check() == []
    assert build.main(["--check"]) == 0


def test_the_spec_names_only_files_and_modules_that_exist(tmp_path):
    compile((ROOT / "packaging" / "tandem.spec").read_text(), "tandem.spec", "exec")
    for source, dest in bundle_contents.resources_datas(ROOT):
        assert Path(source).exists(), source
        assert dest.startswith("resources")  # where app.paths.resources_dir() looks when frozen
    # the demo's aligned head goes where the frozen app looks for it (resources_dir()/aligned/<name>)
    from app.models.demo import demo_head_dir

    assert (str(ROOT / "resources" / "aligned"), "resources/aligned") in bundle_contents.resources_datas(ROOT)
    assert demo_head_dir().parent.name == "aligned" and demo_head_dir().parent.parent.name == "resources"
    import importlib.util

    for family in bundle_contents.TORCH_FAMILIES:
        assert importlib.util.find_spec(f"transformers.models.{family}"), family
    assert bundle_contents.VERSION.count(".") == 2


def test_the_windows_version_resource_follows_pyproject(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "VERSION_FILE", tmp_path / "version_info.txt")
    build.write_version_file()
    text = (tmp_path / "version_info.txt").read_text()
    assert f"StringStruct('ProductVersion', '{bundle_contents.VERSION}')" in text
    compile(text, "version_info.txt", "eval")  # PyInstaller evaluates it as a Python expression


def test_icons_come_in_every_size_from_the_svg():
    from PIL import Image

    icons = ROOT / "resources" / "icons"
    for size in (16, 32, 256, 1024):
        assert Image.open(icons / f"tandem-{size}.png").size == (size, size)
    assert (256, 256) in Image.open(icons / "tandem.ico").info["sizes"]
    assert Image.open(icons / "tandem.icns").size[0] >= 512
    assert "<svg" in (icons / "tandem.svg").read_text()


def test_linux_desktop_entry_and_installer():
    entry = (ROOT / "packaging" / "linux" / "tandem.desktop").read_text().splitlines()
    keys = dict(line.split("=", 1) for line in entry if "=" in line)
    assert entry[0] == "[Desktop Entry]" and keys["Type"] == "Application" and keys["Name"] == "Tandem"
    assert keys["Exec"].startswith("@EXEC@") and keys["Icon"] == "@ICON@"  # filled in by install.sh
    assert subprocess.run(["bash", "-n", str(ROOT / "packaging" / "linux" / "install.sh")]).returncode == 0


def test_the_workflow_is_valid_and_runs_the_frozen_self_test():
    lint = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(WORKFLOW)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert jobs["macos"]["runs-on"] == "macos-14"  # Apple Silicon: the MLX build
    assert jobs["windows"]["runs-on"] == "windows-latest"
    for job in jobs.values():
        uses = {step["uses"].split("@")[0] for step in job["steps"] if "uses" in step}
        assert uses == {"actions/checkout", "actions/setup-python", "actions/upload-artifact"}
        runs = "\n".join(step.get("run", "") for step in job["steps"])
        assert "python packaging/build.py" in runs and "tandem-cli demo" in runs
    mac_runs = "\n".join(s.get("run", "") for s in jobs["macos"]["steps"])
    win_runs = "\n".join(s.get("run", "") for s in jobs["windows"]["steps"])
    # the frozen programs the spec makes, where build.py leaves them
    assert f"dist/{bundle_contents.APP_NAME}.app/Contents/MacOS/tandem --self-test" in mac_runs
    assert f"dist\\{bundle_contents.APP_NAME}\\tandem-cli.exe self-test" in win_runs
    assert "choco install innosetup" in win_runs  # iscc for the installer
    # the .exe bundles PyTorch's CUDA build, installed before the project so PyPI's CPU-only
    # Windows wheel never replaces it, and checked after
    steps = [s.get("run", "") for s in jobs["windows"]["steps"]]
    cuda = next(i for i, run in enumerate(steps) if "--index-url https://download.pytorch.org/whl/cu" in run)
    project = next(i for i, run in enumerate(steps) if 'pip install -e ".[build]"' in run)
    assert cuda < project and "torch.version.cuda" in steps[project]
    upload = next(s for s in jobs["windows"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "dist/*-setup*"  # the setup .exe and its disk-spanning .bin slices
    iss = (ROOT / "packaging" / "windows" / "tandem.iss").read_text()
    assert "DiskSpanning=yes" in iss and "DiskSliceSize=max" in iss
    assert build.TOOLS["darwin"] == ("hdiutil", "codesign")  # preinstalled on macOS runners


def test_self_test_passes_on_the_demo_pair_and_fails_when_outputs_differ(demo):
    from app.self_test import self_test

    lines: list[str] = []
    assert self_test(out=lines.append) == 0
    assert lines[-1].startswith("Tandem self-test: ok, 16 tokens identical to the target alone")
    assert self_test(compare=lambda alone, spec: False, out=lines.append) == 1
    assert "FAILED, speculative output differs from the target alone at token" in lines[-1]
    assert self_test(model="/no/such/model", out=lines.append) == 1
    assert "FAILED" in lines[-1] and "no such file" in lines[-1]


@pytest.mark.parametrize("entry", ["window", "cli"])
def test_both_programs_offer_the_self_test(entry, monkeypatch):
    import app.self_test

    calls = []
    monkeypatch.setattr(app.self_test, "self_test", lambda **kwargs: calls.append(kwargs) or 0)
    if entry == "window":
        from ui.main import main

        assert main(["--self-test"]) == 0
    else:
        from app.cli import main

        assert main(["self-test"]) == 0
    assert len(calls) == 1
