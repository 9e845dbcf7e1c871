"""Markdown to the HTML subset Qt's rich text understands, with pygments colours in code blocks.

Qt-free, so it can be tested and timed without a window. Qt's rich text engine knows inline
`style` attributes, tables and `<pre>` but no stylesheet classes from pygments, so every colour is
written inline. Raw HTML in a model's answer is shown as text, never interpreted: an answer must
not be able to load images or restyle the window.

Each fenced code block gets a header row with its language and a `copy:N` link; the raw code of
block N is returned next to the HTML so the view can copy exactly what the model wrote.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

COPY_SCHEME = "copy"  # links "copy:N" copy code block N
HIGHLIGHT_CACHE_SIZE = 64


@dataclass(frozen=True)
class MarkdownStyle:
    """The colours and fonts of one theme; the view builds it from its palette."""

    text: str = "#1f2328"
    muted: str = "#59636e"
    link: str = "#0969da"
    code_background: str = "#f4f5f7"
    code_header: str = "#e8eaee"
    inline_code_background: str = "#eceef1"
    border: str = "#d0d7de"
    mono_family: str = "monospace"
    pygments_style: str = "default"


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)  # raw code, indexed by the copy:N links


def _parser() -> MarkdownIt:
    # CommonMark plus the GitHub extras models use most; html=False escapes raw HTML.
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])


class MarkdownRenderer:
    """Renders with one style; make a new one when the theme changes."""

    def __init__(self, style: MarkdownStyle | None = None):
        self.style = style or MarkdownStyle()
        self._formatter = HtmlFormatter(style=self.style.pygments_style, noclasses=True, nowrap=True)
        self._md = _parser()
        # While an answer streams it is rendered again and again; only its last block changes.
        self._highlighted: dict[tuple[str, str], str] = {}
        # markdown-it-py binds each rule to its own renderer, so ours are wrapped in plain functions.
        rules = {"fence": self._fence, "code_block": self._fence, "code_inline": self._code_inline,
                 "table_open": self._table_open, "link_open": self._link_open}
        for name, rule in rules.items():
            self._md.add_render_rule(name, _unbound(rule))

    def render(self, text: str) -> Rendered:
        """An answer that is still streaming may end inside a code fence: markdown-it closes it
        at the end of the text, so a half-written block already shows as code."""
        env: dict = {"code_blocks": []}
        body = self._md.render(text, env)
        return Rendered(body, env["code_blocks"])

    # Render rules (markdown-it-py's signature less its renderer: tokens, idx, options, env)

    def _fence(self, tokens, idx, options, env) -> str:
        token = tokens[idx]
        code = token.content
        language = (token.info or "").strip().split(" ")[0]
        index = len(env["code_blocks"])
        env["code_blocks"].append(code.rstrip("\n"))
        s = self.style
        colored = self._highlight(code, language)
        label = html.escape(language) if language else "code"
        # One table per block: Qt pads and colours table cells, not <pre> blocks.
        return (
            f'<table width="100%" cellspacing="0" cellpadding="8" '
            f'style="background-color:{s.code_background}; margin-top:8px; margin-bottom:10px;">'
            f'<tr><td style="background-color:{s.code_header}; color:{s.muted};">{label}</td>'
            f'<td align="right" style="background-color:{s.code_header};">'
            f'<a href="{COPY_SCHEME}:{index}" style="color:{s.link}; text-decoration:none;">Copy</a></td></tr>'
            f'<tr><td colspan="2"><pre style="font-family:{s.mono_family}; white-space:pre-wrap; margin:0;">'
            f"{colored}</pre></td></tr></table>\n"
        )

    def _highlight(self, code: str, language: str) -> str:
        key = (language, code)
        if key not in self._highlighted:
            if len(self._highlighted) >= HIGHLIGHT_CACHE_SIZE:
                self._highlighted.pop(next(iter(self._highlighted)))  # the oldest entry
            self._highlighted[key] = self._colour(code, language)
        return self._highlighted[key]

    def _colour(self, code: str, language: str) -> str:
        try:
            lexer = get_lexer_by_name(language) if language else None
        except ClassNotFound:
            lexer = None
        if lexer is None:
            return html.escape(code.rstrip("\n"))
        return highlight(code, lexer, self._formatter).rstrip("\n")

    def _code_inline(self, tokens, idx, options, env) -> str:
        s = self.style
        return (f'<code style="font-family:{s.mono_family}; background-color:{s.inline_code_background};">'
                f"{html.escape(tokens[idx].content)}</code>")

    def _table_open(self, tokens, idx, options, env) -> str:
        return (f'<table border="1" cellspacing="0" cellpadding="4" '
                f'style="border-collapse:collapse; border-color:{self.style.border};">')

    def _link_open(self, tokens, idx, options, env) -> str:
        href = tokens[idx].attrGet("href") or ""
        return f'<a href="{html.escape(str(href), quote=True)}" style="color:{self.style.link};">'


def _unbound(rule):
    def call(_renderer, tokens, idx, options, env):
        return rule(tokens, idx, options, env)

    return call


def plain_to_html(text: str) -> str:
    """A user's own message: shown as typed, line breaks kept, nothing interpreted."""
    return html.escape(text).replace("\n", "<br>")
