"""One message in the chat: who wrote it, its text (Markdown for answers), its status and actions.

An answer that is still being written is rendered again as text arrives, but never more often
than the worker's coalesced rate, and less often when rendering gets expensive (a long answer),
so the GUI thread stays a small share of the machine while the engine decodes.

An answer Regenerate wrote again shows ‹ 2/3 › to go through its versions, and so does a message
of yours that was edited (each version with the answers that followed it); the controller
switches them. Tinted by origin, an answer is still rendered as Markdown, its text coloured.
A click on a message (its text included) says so (`clicked`): the side panel shows that
answer's rounds.
"""

from __future__ import annotations

import math
import time

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget

from app.chat.markdown import COPY_SCHEME, MarkdownRenderer, Tint, plain_to_html
from ui.chat.thinking_block import ThinkingBlock
from ui.panel.colors import chip_colors

MIN_RENDER_INTERVAL_S = 1 / 30  # the worker's coalesced rate
RENDER_BUDGET = 0.04  # at most this share of the time goes to re-rendering a streaming answer

STATUS_TAGS = {"stopped": "Stopped", "interrupted": "Interrupted", "error": "Failed"}
STATUS_TIPS = {
    "stopped": "You stopped this answer; what was written until then is kept.",
    "interrupted": "Tandem closed before this answer was finished; what was written until then is kept.",
    "error": "This answer failed; the message below says why.",
}
ROLE_NAMES = {"user": "You", "assistant": "Tandem"}
COPIED_MS = 1500  # how long a Copy button says "Copied"

# Qt's rich text has generous default margins and huge headings; these read like a chat.
DOCUMENT_CSS = """
p, ul, ol, pre, blockquote { margin-top: 0px; margin-bottom: 8px; }
li { margin-bottom: 2px; }
h1 { font-size: x-large; margin-top: 6px; margin-bottom: 6px; }
h2 { font-size: large; margin-top: 6px; margin-bottom: 6px; }
h3, h4, h5, h6 { font-size: medium; margin-top: 4px; margin-bottom: 4px; }
blockquote { margin-left: 12px; }
"""


class MessageText(QTextBrowser):
    """Rich text as tall as its content: the chat scrolls as a whole, a message never does."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("messageText")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().setDefaultStyleSheet(DOCUMENT_CSS)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.setFixedHeight(self.fontMetrics().lineSpacing() + 8)

    def _fit_height(self, size) -> None:
        height = math.ceil(size.height()) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(height)

    def wheelEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        event.ignore()  # let the chat scroll


class MessageWidget(QFrame):
    regenerate_requested = Signal()
    edit_requested = Signal()
    version_requested = Signal(int)  # the number of the version to show (1-based): an answer's, or a question's
    copied = Signal(str)  # what was copied, in words ("the answer", "the code"), for the status bar
    clicked = Signal()  # anywhere on the message: the side panel shows an answer's rounds

    def __init__(self, role: str, renderer: MarkdownRenderer, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.message_id: int | None = None  # its id in the history, set by the controller
        self.version, self.versions = 0, 0  # an answer's version on screen, and how many it has
        self.status = "complete"
        self.code_blocks: list[str] = []
        self._text = ""
        self._spans: list[tuple[int, str]] = []  # (characters, origin) of an answer, for the tint
        self._tint: bool | None = None  # None: plain; True/False: tinted for a dark/light theme
        self._streaming = False  # a streaming answer is shown as Markdown; the tint comes at its end
        self._renderer = renderer
        self._last_render = 0.0
        self._render_interval = MIN_RENDER_INTERVAL_S
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.timeout.connect(self._render)
        self.setObjectName("userMessage" if role == "user" else "assistantMessage")

        self.role_label = QLabel(ROLE_NAMES.get(role, role))
        self.role_label.setObjectName("roleLabel")
        self.status_tag = QLabel()
        self.status_tag.setObjectName("statusTag")
        self.status_tag.hide()
        self.thinking = ThinkingBlock()  # a reasoning model's thinking, folded (hidden for others)
        self.body = MessageText()
        self.body.anchorClicked.connect(self._link_clicked)
        # the text takes its own clicks (to select, to follow links); they pick the message too
        self.body.viewport().installEventFilter(self)
        self.error_label = QLabel()
        self.error_label.setObjectName("errorLabel")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        self.stats_label = QLabel()
        self.stats_label.setObjectName("statsLabel")
        # wraps rather than widen the row past a narrow chat column (the buttons would be cut off)
        self.stats_label.setWordWrap(True)
        self.stats_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.copy_button = self._action("Copy", "Copy the whole message as text", self.copy_message)
        self.edit_button = self._action(
            "Edit", "Edit this message and send it again; this version and the answers after it are kept "
                    "(‹ › under it go back to them)", self.edit_requested.emit)
        self.regenerate_button = self._action(
            "Regenerate", "Write this answer again; this version is kept (‹ › go through the versions)",
            self.regenerate_requested.emit)
        whose = "this answer" if role == "assistant" else "your message, with the answers that followed it"
        self.previous_button = self._action("‹", f"The previous version of {whose}",
                                            lambda: self.version_requested.emit(self.version - 1))
        self.next_button = self._action("›", f"The next version of {whose}",
                                        lambda: self.version_requested.emit(self.version + 1))
        self.previous_button.setAccessibleName("Previous version")  # screen readers say this, not "‹"
        self.next_button.setAccessibleName("Next version")
        self.version_label = QLabel()
        self.version_label.setObjectName("statsLabel")
        self._browse = True
        self._copied_timer = QTimer(self)
        self._copied_timer.setSingleShot(True)
        self._copied_timer.timeout.connect(lambda: self.copy_button.setText("Copy"))
        self.set_actions(regenerate=False, edit=False)
        self.set_versions(0, 0)

        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(self.role_label)
        top.addWidget(self.status_tag)
        top.addStretch(1)
        actions = QHBoxLayout()
        actions.setSpacing(2)
        for widget in (self.previous_button, self.version_label, self.next_button):
            actions.addWidget(widget)
        actions.addSpacing(6)
        actions.addWidget(self.stats_label, 1)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            actions.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 6)
        layout.setSpacing(4)
        layout.addLayout(top)
        layout.addWidget(self.thinking)
        layout.addWidget(self.body)
        layout.addWidget(self.error_label)
        layout.addLayout(actions)

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
        super().mousePressEvent(event)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.MouseButtonPress and event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
        return False  # the text still selects and follows links

    def _action(self, text: str, tip: str, slot) -> QToolButton:
        button = QToolButton()
        button.setObjectName("messageAction")
        button.setText(text)
        button.setToolTip(tip)
        button.clicked.connect(slot)
        return button

    # Content

    @property
    def text(self) -> str:
        return self._text

    def set_text(self, text: str) -> None:
        self._text = text
        self._render()

    def stream(self, delta: str) -> None:
        """Text of an answer being written: rendered now, or soon if it was rendered just now."""
        self._text += delta
        if self._render_timer.isActive():
            return
        wait = self._render_interval - (time.perf_counter() - self._last_render)
        if wait <= 0:
            self._render()
        else:
            self._render_timer.start(math.ceil(wait * 1000))

    def set_thinking(self, text: str, done: bool = True) -> None:
        self.thinking.set_text(text, done)

    def stream_thinking(self, delta: str) -> None:
        self.thinking.stream(delta)

    def finish(self, text: str, status: str, stats: dict | None = None, error: str = "") -> None:
        self._render_timer.stop()
        self._text = text
        self._streaming = False
        self._render()
        if self.thinking.text:
            self.thinking.set_text(self.thinking.text, done=True)
        self.set_status(status, error)
        self.set_stats(stats)

    def set_renderer(self, renderer: MarkdownRenderer) -> None:
        self._renderer = renderer
        self._render()

    def set_spans(self, spans: list[tuple[int, str]]) -> None:
        """Where the answer's text came from (app.chat.trace.TurnTrace.spans)."""
        self._spans = list(spans)
        if self._tint is not None:
            self._render()

    def set_tint(self, dark: bool | None) -> None:
        """Show the answer tinted by origin (None: rendered as usual)."""
        if dark != self._tint:
            self._tint = dark
            self._render()

    @property
    def tinted(self) -> bool:
        return self._tint is not None and bool(self._spans) and not self._streaming

    def _render(self) -> None:
        self._render_timer.stop()
        start = time.perf_counter()
        if self.role == "user":
            self.code_blocks = []
            self.body.setHtml(plain_to_html(self._text))
        else:
            rendered = self._renderer.render(self._text, self._tint_colours() if self.tinted else None)
            self.code_blocks = rendered.code_blocks
            self.body.setHtml(rendered.html)
        self._last_render = time.perf_counter()
        # A render that took r seconds waits r / RENDER_BUDGET before the next one.
        self._render_interval = max(MIN_RENDER_INTERVAL_S, (self._last_render - start) / RENDER_BUDGET)

    def _tint_colours(self) -> Tint:
        colours = chip_colors(bool(self._tint))
        styles = {kind: f"background-color:{c.background}; color:{c.text};" for kind, c in colours.items()}
        return Tint(self._spans, styles)

    # Status, stats and actions

    def set_streaming(self) -> None:
        self._streaming = True
        self.status_tag.setText("Writing…")
        self.status_tag.setProperty("kind", "")
        self.status_tag.setToolTip("")
        self.status_tag.show()
        self.body.setPlaceholderText("…")

    def set_status(self, status: str, error: str = "") -> None:
        self.status = status
        self._streaming = False
        self.body.setPlaceholderText("")
        tag = STATUS_TAGS.get(status)
        self.status_tag.setVisible(tag is not None)
        if tag:
            self.status_tag.setText(tag)
            self.status_tag.setToolTip(STATUS_TIPS[status])
            self.status_tag.setProperty("kind", "error" if status == "error" else "")
            self.status_tag.style().unpolish(self.status_tag)
            self.status_tag.style().polish(self.status_tag)
        self.error_label.setText(error)
        self.error_label.setVisible(bool(error))
        self.body.setVisible(bool(self._text) or status == "complete")

    def set_stats(self, stats: dict | None) -> None:
        self.stats_label.setText(stats_line(stats) if stats else "")

    def set_actions(self, regenerate: bool, edit: bool, browse: bool = True) -> None:
        """Which actions are offered; `browse`: the versions can be gone through (not while an
        answer is being written)."""
        self.regenerate_button.setVisible(regenerate and self.role == "assistant")
        self.edit_button.setVisible(edit and self.role == "user")
        self._browse = browse
        self.set_versions(self.version, self.versions)

    def set_versions(self, version: int, versions: int) -> None:
        """‹ version/versions ›, shown once an answer (Regenerate) or a message of yours (Edit) has
        more than one version."""
        self.version, self.versions = version, versions
        shown = versions > 1
        for widget in (self.previous_button, self.version_label, self.next_button):
            widget.setVisible(shown)
        self.version_label.setText(f"{version}/{versions}")
        whose = "this answer" if self.role == "assistant" else "your message (each with the answers that followed it)"
        self.version_label.setToolTip(f"Version {version} of {versions} of {whose}")
        self.previous_button.setEnabled(self._browse and version > 1)
        self.next_button.setEnabled(self._browse and version < versions)

    # Copying and links

    def copy_message(self) -> None:
        QGuiApplication.clipboard().setText(self._text)
        self.copy_button.setText("Copied")  # on the button pressed, for a moment
        self._copied_timer.start(COPIED_MS)
        self.copied.emit("the answer" if self.role == "assistant" else "your message")

    def copy_code(self, index: int) -> None:
        if 0 <= index < len(self.code_blocks):
            QGuiApplication.clipboard().setText(self.code_blocks[index])
            self.copied.emit("the code")

    def _link_clicked(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            self.copy_code(int(url.path()) if url.path().isdigit() else -1)
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)


def stats_line(stats: dict) -> str:
    if "tokens" not in stats:
        return ""
    parts = [f"{stats['tokens']} tokens", f"{stats.get('tokens_per_s', 0):.1f} tok/s"]
    if stats.get("drafted"):
        parts.append(f"{stats.get('acceptance', 0):.0%} of drafts accepted")
    if isinstance(stats.get("prefill_s"), (int, float)):  # the first answer of a chat too, not only follow-ups
        first = f"first token in {stats['prefill_s']:.2f}s"
        if stats.get("reused_tokens"):  # the caches kept the conversation so far: only the rest was read
            first += f", {stats['reused_tokens']:,} of {stats.get('prompt_tokens', 0):,} prompt tokens kept"
        parts.append(first)
    return " · ".join(parts)
