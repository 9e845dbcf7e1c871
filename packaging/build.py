"""Build Tandem's package for this platform, in one command: `python packaging/build.py`
(or `make package`). Needs `pip install -e '.[build]'` and the demo model (`tandem-cli demo`).

  Linux    dist/Tandem/ (one folder) and dist/Tandem-<version>-linux-<arch>.tar.gz, with a
           .desktop file, the icon and install.sh (adds Tandem to the applications menu)
  macOS    dist/Tandem.app (MLX backend), ad-hoc signed, in dist/Tandem-<version>-macos-arm64.dmg;
           TANDEM_CODESIGN_IDENTITY signs with a real identity instead, ready for notarisation
  Windows  dist/Tandem/tandem.exe (PyTorch backend) and, with Inno Setup's iscc on PATH,
           dist/Tandem-<version>-windows-x64-setup.exe with a Start menu entry

`--check` validates everything a build needs (the spec, icons, scripts, the demo model, the
platform's tools) without building: the test suite runs it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bundle_contents import APP_NAME, DEMO_STAGE, ROOT, VERSION, VERSION_FILE  # noqa: E402

PACKAGING = ROOT / "packaging"
DIST, WORK = ROOT / "dist", ROOT / "build" / "pyinstaller"
TOOLS = {"darwin": ("hdiutil", "codesign"), "win32": (), "linux": ()}


def backends() -> str:
    """MLX on Apple Silicon Macs, PyTorch elsewhere (MLX on Linux is for development only)."""
    return "mlx" if sys.platform == "darwin" and platform.machine() == "arm64" else "torch"


def stage_demo() -> Path:
    """Copy the verified demo GGUF where the spec picks it up, so the first launch is offline."""
    from app.models.demo import DEMO_GGUF, _verified, ensure_demo, find_demo_gguf

    source = find_demo_gguf()
    if source is None or not _verified(source):
        ensure_demo()
        source = find_demo_gguf()
    DEMO_STAGE.mkdir(parents=True, exist_ok=True)
    target = DEMO_STAGE / DEMO_GGUF
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        shutil.copy2(source, target)
    return target


def write_version_file() -> None:
    """The Windows version resource (PyInstaller's VSVersionInfo), from pyproject's version."""
    numbers = tuple(int(x) for x in (VERSION.split(".") + ["0", "0", "0"])[:4])
    VERSION_FILE.parent.mkdir(parents=True, exist_ok=True)
    VERSION_FILE.write_text(f"""VSVersionInfo(
  ffi=FixedFileInfo(filevers={numbers}, prodvers={numbers}, mask=0x3f, flags=0x0, OS=0x40004,
                    fileType=0x1, subtype=0x0, date=(0, 0)),
  kids=[StringFileInfo([StringTable('040904B0', [
      StringStruct('CompanyName', 'Tandem'), StringStruct('FileDescription', 'Tandem: local AI chat'),
      StringStruct('FileVersion', '{VERSION}'), StringStruct('ProductName', 'Tandem'),
      StringStruct('ProductVersion', '{VERSION}'), StringStruct('OriginalFilename', 'tandem.exe')])]),
        VarFileInfo([VarStruct('Translation', [1033, 1200])])]
)
""")


def check() -> list[str]:
    """Problems that would stop a build here; empty when it can go ahead."""
    problems = []
    spec = PACKAGING / "tandem.spec"
    try:
        compile(spec.read_text(), str(spec), "exec")
    except SyntaxError as exc:
        problems.append(f"{spec.name}: {exc}")
    icons = ROOT / "resources" / "icons"
    for name in ("tandem.svg", "tandem.ico", "tandem.icns", "tandem-256.png"):
        if not (icons / name).is_file():
            problems.append(f"missing icon {name}: run python packaging/make_icons.py")
    for path in (PACKAGING / "launch_tandem.py", PACKAGING / "launch_cli.py", PACKAGING / "linux" / "tandem.desktop",
                 PACKAGING / "linux" / "install.sh", PACKAGING / "windows" / "tandem.iss",
                 PACKAGING / "macos" / "entitlements.plist", ROOT / "resources" / "NOTICE-SmolLM2.txt"):
        if not path.is_file():
            problems.append(f"missing {path.relative_to(ROOT)}")
    for tool in TOOLS.get(sys.platform, ()):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH")
    return problems


def run_pyinstaller() -> Path:
    env = {**os.environ, "TANDEM_BACKENDS": backends()}
    subprocess.run([sys.executable, "-m", "PyInstaller", str(PACKAGING / "tandem.spec"), "--noconfirm",
                    "--distpath", str(DIST), "--workpath", str(WORK)], check=True, env=env, cwd=ROOT)
    return DIST / (f"{APP_NAME}.app" if sys.platform == "darwin" else APP_NAME)


def package_linux(folder: Path) -> Path:
    arch = platform.machine()
    archive = DIST / f"{APP_NAME}-{VERSION}-linux-{arch}.tar.gz"
    top = f"{APP_NAME}-{VERSION}"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=f"{top}/{APP_NAME}")
        tar.add(PACKAGING / "linux" / "tandem.desktop", arcname=f"{top}/tandem.desktop")
        tar.add(PACKAGING / "linux" / "install.sh", arcname=f"{top}/install.sh")
        tar.add(ROOT / "resources" / "icons" / "tandem-256.png", arcname=f"{top}/tandem.png")
    return archive


def package_macos(app: Path) -> Path:
    identity = os.environ.get("TANDEM_CODESIGN_IDENTITY", "-")  # "-": ad-hoc
    sign = ["codesign", "--force", "--deep", "--sign", identity]
    if identity != "-":  # a real identity: hardened runtime and a timestamp, as notarisation requires
        sign += ["--options", "runtime", "--timestamp", "--entitlements",
                 str(PACKAGING / "macos" / "entitlements.plist")]
    subprocess.run([*sign, str(app)], check=True)
    staging = ROOT / "build" / "dmg"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copytree(app, staging / app.name, symlinks=True)
    (staging / "Applications").symlink_to("/Applications")  # drag the app onto it to install
    dmg = DIST / f"{APP_NAME}-{VERSION}-macos-{platform.machine()}.dmg"
    dmg.unlink(missing_ok=True)
    subprocess.run(["hdiutil", "create", "-volname", APP_NAME, "-srcfolder", str(staging), "-ov",
                    "-format", "UDZO", str(dmg)], check=True)
    return dmg


def package_windows(folder: Path) -> Path:
    iscc = shutil.which("iscc") or next(
        (str(p) for p in (Path(os.environ.get("ProgramFiles(x86)", "C:/Program Files (x86)")) / "Inno Setup 6"
                          / "ISCC.exe",) if p.is_file()), None)
    if iscc is None:  # the folder is a working app already; the installer needs Inno Setup
        archive = shutil.make_archive(str(DIST / f"{APP_NAME}-{VERSION}-windows-x64"), "zip", folder.parent,
                                      folder.name)
        print("Inno Setup (iscc) not found: made a .zip instead of an installer", file=sys.stderr)
        return Path(archive)
    subprocess.run([iscc, f"/DAppVersion={VERSION}", f"/DSourceDir={folder}", f"/DOutputDir={DIST}",
                    str(PACKAGING / "windows" / "tandem.iss")], check=True)
    return DIST / f"{APP_NAME}-{VERSION}-windows-x64-setup.exe"


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="validate the build's inputs, build nothing")
    args = parser.parse_args(argv)
    problems = check()
    if args.check or problems:
        for problem in problems:
            print(f"build: {problem}", file=sys.stderr)
        if not problems:
            print(f"build: ready to build Tandem {VERSION} for {sys.platform} ({backends()} backend)")
        return 1 if problems else 0
    print(f"staged {stage_demo().name}")
    write_version_file()
    bundle = run_pyinstaller()
    package = {"linux": package_linux, "darwin": package_macos, "win32": package_windows}[sys.platform](bundle)
    print(f"{bundle.relative_to(ROOT)}: {size_of(bundle) / 1e6:,.0f} MB")
    print(f"{package.relative_to(ROOT)}: {size_of(package) / 1e6:,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
