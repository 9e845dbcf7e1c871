"""The Linux bundle's install.sh writes a desktop entry whose Exec line starts Tandem from wherever
it was unpacked, whatever characters that folder's path holds; and the README's apt line names every
library Qt's xcb plugin needs that a minimal Linux lacks."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINUX = ROOT / "packaging" / "linux"
# Desktop Entry spec, "The Exec key": an argument holding one of these must be quoted
RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")
FIELD_CODES = set("fFuUick")


def unescape_string(value: str) -> str:
    """The general rule for string values: \\s \\n \\t \\r \\\\, applied before the Exec quoting."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\":
            out.append({"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[value[i + 1]])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def parse_exec(value: str) -> list[str]:
    """An Exec value as a launcher reads it, strictly: quoting, then field codes (%% is a %)."""
    text, args, current, i = unescape_string(value), [], None, 0
    while i < len(text):
        c = text[i]
        if c == " ":
            if current is not None:
                args.append(current)
            current, i = None, i + 1
        elif c == '"':
            current, i = current or "", i + 1
            while text[i] != '"':
                if text[i] == "\\":
                    assert text[i + 1] in '"`$\\', f"\\{text[i + 1]} is no escape inside quotes: {value}"
                    current, i = current + text[i + 1], i + 2
                else:
                    assert text[i] not in "`$", f"an unescaped {text[i]} inside quotes: {value}"
                    current, i = current + text[i], i + 1
            i += 1
        else:
            assert c not in RESERVED, f"a reserved {c!r} outside quotes: {value}"
            current, i = (current or "") + c, i + 1
    if current is not None:
        args.append(current)

    def field_codes(arg: str) -> str:
        if len(arg) == 2 and arg[0] == "%" and arg[1] in FIELD_CODES:
            return arg  # the launcher fills it in
        assert not re.search(r"%(?!%)", arg.replace("%%", "")), f"a lone % in {arg!r}"
        return arg.replace("%%", "%")

    return [field_codes(arg) for arg in args]


def install(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True)
    for name in ("install.sh", "tandem.desktop"):
        shutil.copy(LINUX / name, folder / name)
    (folder / "tandem.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run(["sh", str(folder / "install.sh")], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("char", ["&", "|", '"', "$", "%", "\\", "`", " ", "'", "$HOME", "%U"])
def test_install_sh_writes_an_exec_line_that_names_the_unpacked_program(char, tmp_path):
    folder = tmp_path / f"Tandem {char}x{char}" / "bundle"
    run = install(folder, tmp_path)
    assert run.returncode == 0, run.stderr
    entry = (tmp_path / "data" / "applications" / "tandem.desktop").read_text()
    keys = dict(line.split("=", 1) for line in entry.splitlines() if "=" in line)
    assert parse_exec(keys["Exec"]) == [f"{folder}/Tandem/tandem", "%U"]
    assert keys["Icon"] == "tandem" and (tmp_path / "data" / "icons/hicolor/256x256/apps/tandem.png").is_file()
    template = (LINUX / "tandem.desktop").read_text().splitlines()
    assert [line for line in entry.splitlines() if not line.startswith(("Exec=", "Icon="))] == [
        line for line in template if not line.startswith(("Exec=", "Icon="))]


def test_install_sh_refuses_a_folder_with_a_line_break_in_words(tmp_path):
    run = install(tmp_path / "two\nlines", tmp_path)
    assert run.returncode == 1 and "line break" in run.stderr
    assert not (tmp_path / "data" / "applications" / "tandem.desktop").exists()


def test_the_readme_apt_line_names_every_xcb_library_this_linux_lacks():
    """`make run` on a minimal Linux: Qt's xcb plugin would not load until libxcb-icccm4 and
    libxcb-keysyms1 were installed too. Each library ldd reports missing here must be on the line."""
    import PySide6

    if shutil.which("ldd") is None:
        pytest.skip("no ldd on this system")
    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    if not plugin.is_file():
        pytest.skip("this PySide6 has no xcb plugin")
    missing = set(re.findall(r"^\s*(\S+) => not found", subprocess.run(
        ["ldd", str(plugin)], capture_output=True, text=True).stdout, re.M))
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "apt-get install" in line)
    packages = set(re.search(r"apt-get install ([^`]+)`", line).group(1).split())
    for soname in missing:  # libxcb-icccm.so.4 -> libxcb-icccm4 (Debian's naming)
        base, version = re.fullmatch(r"(.+)\.so\.(\d+)", soname).groups()
        package = f"{base}{'-' if base[-1].isdigit() else ''}{version}"
        assert package in packages, f"{soname} is missing here and {package} is not in the README's apt line"
    assert {"libxcb-icccm4", "libxcb-keysyms1"} <= packages
