"""View → Theme (issue 35, defect 10): light, dark or the system's, chosen in the window and kept
for the next start; a check box stays visible on the dark theme.

Run in a process of their own by tests/test_theme_choice.py: a theme change restyles every widget
alive in the process, and windows other test files left behind (closed, their services winding
down) crashed CI workers in setStyleSheet, and when closed again here."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings  # noqa: E402


def test_the_users_choice_picks_the_theme_and_the_environment_still_wins(qapp, monkeypatch):
    from ui import theme

    monkeypatch.delenv("TANDEM_THEME", raising=False)
    assert theme.requested_theme("dark") is theme.DARK and theme.requested_theme("light") is theme.LIGHT
    manager = theme.install(qapp)
    changed = []
    manager.changed.connect(changed.append)
    try:
        manager.set_choice("dark")
        assert manager.theme is theme.DARK and changed[-1] is theme.DARK
        assert qapp.palette().window().color().name() == theme.DARK.window
        manager.set_choice("nonsense")  # a damaged settings file: the system's
        assert manager.choice == "system"
        monkeypatch.setenv("TANDEM_THEME", "light")
        manager.set_choice("dark")
        assert manager.theme is theme.LIGHT  # screenshots and tests force one
    finally:
        manager.changed.disconnect(changed.append)
        monkeypatch.delenv("TANDEM_THEME", raising=False)
        manager.set_choice("system")


def test_a_check_box_is_visible_on_the_dark_theme(qapp, qtbot, monkeypatch):
    """The "Tint answers by origin" box was nearly invisible on the dark window: its frame must
    stand out from the background it is drawn on, ticked or not."""
    from PySide6.QtWidgets import QCheckBox

    from ui import theme

    monkeypatch.delenv("TANDEM_THEME", raising=False)
    manager = theme.install(qapp)
    manager.set_choice("dark")
    try:
        for ticked in (False, True):
            box = QCheckBox("Tint answers by origin")
            box.setChecked(ticked)
            qtbot.addWidget(box)
            box.show()
            image = box.grab().toImage()
            background = image.pixelColor(image.width() - 2, image.height() // 2).lightness()
            # the indicator: the square left of the text
            side = box.style().pixelMetric(box.style().PixelMetric.PM_IndicatorWidth, None, box)
            top = (image.height() - side) // 2
            pixels = [image.pixelColor(x, y).lightness() for x in range(side) for y in range(top, top + side)]
            stand_out = [abs(p - background) > 60 for p in pixels]
            if ticked:  # filled, not a thin glyph on the window's colour
                assert sum(stand_out) > 0.4 * len(pixels), sum(stand_out) / len(pixels)
            else:  # its frame
                assert any(stand_out), max(abs(p - background) for p in pixels)
    finally:
        manager.set_choice("system")


def test_the_view_menu_sets_the_theme_and_a_restart_keeps_it(qapp, qtbot, tmp_path, monkeypatch):
    from ui import theme
    from ui.main_window import MainWindow

    monkeypatch.delenv("TANDEM_THEME", raising=False)
    settings = QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat)
    window = MainWindow(model=str(tmp_path / "no-model"), history_path=tmp_path / "h.sqlite3", settings=settings)
    qtbot.addWidget(window)
    checked = [a.data() for a in window.theme_actions.actions() if a.isChecked()]
    assert checked == ["system"]
    next(a for a in window.theme_actions.actions() if a.data() == "dark").trigger()
    assert window.theme.theme is theme.DARK and settings.value("view/theme") == "dark"
    window.close()
    again = MainWindow(model=str(tmp_path / "no-model"), history_path=tmp_path / "h.sqlite3", settings=settings)
    qtbot.addWidget(again)
    try:
        assert again.theme.theme is theme.DARK
        assert [a.data() for a in again.theme_actions.actions() if a.isChecked()] == ["dark"]
    finally:
        again.set_theme("system")
        again.close()
