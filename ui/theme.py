"""Light and dark themes: the OS scheme by default, the user's choice in View → Theme, and
TANDEM_THEME=dark|light to force one (screenshots, tests).

One palette and one stylesheet for the whole application, so every widget agrees; the chat's
Markdown colours come from the same theme. Qt's Fusion style is used on every platform because
it follows a palette faithfully (native styles ignore parts of it, dark mode on Windows among them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from string import Template

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QFontDatabase, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app.chat.markdown import MarkdownStyle
from app.paths import asset

THEME_ENV = "TANDEM_THEME"


@dataclass(frozen=True)
class Theme:
    name: str  # "light" | "dark"
    window: str  # the frame: conversation list, header, status bar
    surface: str  # the chat itself and inputs
    raised: str  # a user's message, the composer
    text: str
    muted: str
    accent: str
    accent_text: str
    border: str
    selection: str
    error: str
    warning: str
    code_background: str
    code_header: str
    pygments_style: str

    @property
    def dark(self) -> bool:
        return self.name == "dark"

    def markdown_style(self) -> MarkdownStyle:
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        return MarkdownStyle(
            text=self.text, muted=self.muted, link=self.accent, code_background=self.code_background,
            code_header=self.code_header, inline_code_background=self.code_header, border=self.border,
            mono_family=f"'{mono}', monospace", pygments_style=self.pygments_style,
        )

    def palette(self) -> QPalette:
        palette = QPalette()
        roles = {
            QPalette.ColorRole.Window: self.window, QPalette.ColorRole.WindowText: self.text,
            QPalette.ColorRole.Base: self.surface, QPalette.ColorRole.AlternateBase: self.raised,
            QPalette.ColorRole.Text: self.text, QPalette.ColorRole.Button: self.raised,
            QPalette.ColorRole.ButtonText: self.text, QPalette.ColorRole.Highlight: self.selection,
            QPalette.ColorRole.HighlightedText: self.text, QPalette.ColorRole.ToolTipBase: self.raised,
            QPalette.ColorRole.ToolTipText: self.text, QPalette.ColorRole.PlaceholderText: self.muted,
            QPalette.ColorRole.Link: self.accent, QPalette.ColorRole.BrightText: self.error,
        }
        for role, colour in roles.items():
            palette.setColor(role, QColor(colour))
        for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
            palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(self.muted))
        return palette

    def stylesheet(self) -> str:
        template = Template(asset("styles", "10-base.qss").read_text(encoding="utf-8"))
        check = asset("icons", f"check-{self.name}.svg").as_posix()  # drawn in the accent's text colour
        return template.substitute({**{name: getattr(self, name) for name in self.__dataclass_fields__},
                                    "check_icon": check})


LIGHT = Theme(
    name="light", window="#f3f4f6", surface="#ffffff", raised="#f1f3f5", text="#1f2328", muted="#656d76",
    accent="#2f6feb", accent_text="#ffffff", border="#d8dde3", selection="#cfe0fc", error="#c62828",
    warning="#fff4d6", code_background="#f6f8fa", code_header="#eaeef2", pygments_style="default",
)
DARK = Theme(
    name="dark", window="#1b1d21", surface="#23262b", raised="#2d3137", text="#e6e8eb", muted="#9aa1aa",
    accent="#6ea8fe", accent_text="#0d1117", border="#3a3f46", selection="#2f4a74", error="#ff7b72",
    warning="#3d3420", code_background="#1a1c20", code_header="#2b2f35", pygments_style="github-dark",
)


CHOICES = ("system", "light", "dark")  # View → Theme


def requested_theme(choice: str = "system") -> Theme:
    """TANDEM_THEME wins (screenshots, tests); then the user's choice (View → Theme); "system"
    follows the OS scheme, light when it is unknown."""
    forced = os.environ.get(THEME_ENV, "").strip().lower()
    if forced in ("dark", "light"):
        return DARK if forced == "dark" else LIGHT
    if choice in ("dark", "light"):
        return DARK if choice == "dark" else LIGHT
    return DARK if QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark else LIGHT


class ThemeManager(QObject):
    """Applies the theme to the application and follows the OS when it switches."""

    changed = Signal(object)  # Theme

    def __init__(self, app: QApplication):
        super().__init__(app)
        self.setObjectName("tandem-theme")
        self._app = app
        self.choice = "system"
        self.theme = requested_theme()
        app.setStyle("Fusion")
        self._apply()
        app.styleHints().colorSchemeChanged.connect(self._scheme_changed)

    def set_choice(self, choice: str) -> None:
        """The user's theme: "system", "light" or "dark" (anything else: the system's)."""
        self.choice = choice if choice in CHOICES else "system"
        self._scheme_changed(None)

    def _scheme_changed(self, _scheme) -> None:
        theme = requested_theme(self.choice)
        if theme != self.theme:
            self.theme = theme
            self._apply()
            self.changed.emit(theme)

    def _apply(self) -> None:
        self._app.setPalette(self.theme.palette())
        self._app.setStyleSheet(self.theme.stylesheet())


def install(app: QApplication) -> ThemeManager:
    """The application's one theme manager (made on first use, a child of the application)."""
    existing = app.findChild(ThemeManager, "tandem-theme")
    return existing if existing is not None else ThemeManager(app)
