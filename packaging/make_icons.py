"""Build the app's icons from resources/icons/tandem.svg: PNGs at the usual sizes (Linux, the
window icon), tandem.ico (Windows) and tandem.icns (macOS). Qt renders the SVG; Pillow writes
the .ico and .icns containers. Run after editing the SVG: python packaging/make_icons.py"""

from __future__ import annotations

import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512, 1024)


def render(size: int, out: Path) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(ICONS / "tandem.svg"))
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    if not image.save(str(out)):
        raise SystemExit(f"could not write {out}")


def main() -> int:
    from PIL import Image
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (fonts, image plugins)
    for size in SIZES:
        render(size, ICONS / f"tandem-{size}.png")
    biggest = Image.open(ICONS / "tandem-1024.png")
    biggest.save(ICONS / "tandem.ico", sizes=[(s, s) for s in (16, 24, 32, 48, 64, 128, 256)])
    biggest.save(ICONS / "tandem.icns")  # Pillow writes every size macOS asks for from the 1024 one
    print(f"wrote {len(SIZES)} PNGs, tandem.ico and tandem.icns to {ICONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
