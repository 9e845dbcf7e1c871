"""Markdown to the HTML subset Qt's rich text understands, with pygments colours in code blocks.

Qt-free, so it can be tested and timed without a window. Qt's rich text engine knows inline
`style` attributes, tables and `<pre>` but no stylesheet classes from pygments, so every colour is
written inline. Raw HTML in a model's answer is shown as text, never interpreted, and Markdown
images are shown as their alt text and address: an answer must not be able to load a file or a
remote image, or restyle the window.

The answer can be tinted by origin (which characters a draft wrote, which the target): the
Markdown is rendered as usual, then every stretch of text in the HTML is matched back to the
answer's source characters, in order, and wrapped in the colour of whoever wrote them. In code
blocks only the background is tinted: the text keeps its syntax highlighting. The markers the
renderer leaves in the HTML for this are private-use characters the answer does not hold, picked
for each render: an answer may hold any character, and one it holds is always its text.

Each fenced code block gets a header row with its language and a `copy:N` link; the raw code of
block N is returned next to the HTML so the view can copy exactly what the model wrote.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from itertools import islice

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

COPY_SCHEME = "copy"  # links "copy:N" copy code block N
HIGHLIGHT_CACHE_SIZE = 64
# Markers in the HTML of a tinted render (_markers picks them: characters the answer does not hold):
# what the renderer adds itself (a code block's label and Copy link) is not the answer's text,
# and a code block's text starts at a known place of the source.
_PRIVATE_USE = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))
_TAG = re.compile(r"(<[^>]*>)")
MAX_SKIP = 2000  # source characters a rendered one may be found ahead (Markdown syntax, a link's address)


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


@dataclass(frozen=True)
class Tint:
    """Who wrote which characters of the answer: `spans` is (characters, origin) in order over
    the text; `styles` is the inline CSS of each origin (in code blocks, all but its `color`)."""

    spans: list[tuple[int, str]]
    styles: dict[str, str]


@dataclass(frozen=True)
class _Markers:
    """The tint's markers in one render's HTML: a stretch the renderer added (chrome_start ..
    chrome_end), and where a code block starts in the source (sync, the offset, sync)."""

    chrome_start: str
    chrome_end: str
    sync: str

    @property
    def unit(self) -> re.Pattern:
        """One unit of the HTML's text: a marker, an entity, or a character."""
        start, end, sync = (re.escape(c) for c in (self.chrome_start, self.chrome_end, self.sync))
        return re.compile(f"{start}|{end}|{sync}(\\d{{1,18}}){sync}|&#?\\w+;|.", re.DOTALL)


def _markers(text: str) -> _Markers | None:
    """Three private-use characters `text` does not hold (None where it holds them all)."""
    held = set(text)
    free = (chr(c) for block in _PRIVATE_USE for c in block if chr(c) not in held)
    picked = list(islice(free, 3))
    return _Markers(*picked) if len(picked) == 3 else None


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)  # raw code, indexed by the copy:N links


def _parser() -> MarkdownIt:
    # CommonMark plus the GitHub extras models use most; html=False escapes raw HTML.
    md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
    md.core.ruler.after("block", "unfenced_code", _unfenced_code)
    return md


# A line that opens an indented block of code: a Python compound statement, or a line ending in an
# opening bracket (C, JavaScript, Rust, JSON...). Prose ending in a colon ("The steps are:") is not.
_CODE_OPENER = re.compile(r"^\s*(?:(?:async\s+)?def|class|if|elif|else|for|while|try|except|finally|with|match|"
                          r"case)\b.*:\s*(?:#.*)?$|[{\[(]\s*$")


def _code_start(lines: list[str]) -> int | None:
    """Where code starts in a paragraph's source lines: the first line that opens a block and is
    followed by a line indented deeper. Markdown would join such lines as prose and drop their
    indentation (an indented block cannot interrupt a paragraph); None where none does."""
    for i, line in enumerate(lines[:-1]):
        if _CODE_OPENER.search(line):
            following = lines[i + 1]
            if following.strip() and _indent(following) > _indent(line):
                return i
    return None


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def _unfenced_code(state) -> None:
    """Markdown's core rule after block parsing: code a model wrote without a fence, inside a
    top-level paragraph ("Here it is:\ndef f(x):\n    return x"), becomes a code block of its
    source lines, indentation kept, with a Copy link like a fenced one; the prose before it stays
    a paragraph."""
    lines = state.src.split("\n")
    tokens, out, i = state.tokens, [], 0
    while i < len(tokens):
        opening = tokens[i]
        if (opening.type != "paragraph_open" or opening.level != 0 or not opening.map or i + 2 >= len(tokens)
                or tokens[i + 1].type != "inline"):
            out.append(opening)
            i += 1
            continue
        start, end = opening.map
        cut = _code_start(lines[start:end])
        if cut is None:
            out.append(opening)
            i += 1
            continue
        inline, closing = tokens[i + 1], tokens[i + 2]
        if cut:  # the prose before the code: still a paragraph, of its own lines
            inline.content = "\n".join(line.strip() for line in lines[start:start + cut])
            opening.map = inline.map = [start, start + cut]
            out += [opening, inline, closing]
        code = Token("code_block", "code", 0)
        code.content, code.map, code.block = "\n".join(lines[start + cut:end]) + "\n", [start + cut, end], True
        code.meta = {"unfenced": True}
        code.info = "python" if lines[start + cut].rstrip().endswith(":") else ""  # for its colours
        out.append(code)
        i += 3
    state.tokens = _joined(out, lines)


def _joined(tokens: list, lines: list[str]) -> list:
    """Unfenced code that a blank line split (the part after it is Markdown's own indented block,
    its indentation cut by four) as one block of its source lines."""
    out: list = []
    for token in tokens:
        before = out[-1] if out else None
        if (token.type == "code_block" and before is not None and before.type == "code_block" and before.map
                and token.map and (before.meta or {}).get("unfenced")):
            before.content = "\n".join(lines[before.map[0]:token.map[1]]).rstrip("\n") + "\n"
            before.map = [before.map[0], token.map[1]]
            continue
        out.append(token)
    return out


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
                 "table_open": self._table_open, "link_open": self._link_open, "image": self._image}
        for name, rule in rules.items():
            self._md.add_render_rule(name, _unbound(rule))

    def render(self, text: str, tint: Tint | None = None) -> Rendered:
        """An answer that is still streaming may end inside a code fence: markdown-it closes it
        at the end of the text, so a half-written block already shows as code."""
        markers = _markers(text) if tint is not None else None
        env: dict = {"code_blocks": [], "markers": markers, "lines": _line_starts(text)}
        body = self._md.render(text, env)
        if markers is not None:
            body = _tinted(body, text, tint, markers)
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
        copy = "Copy"
        if (m := env.get("markers")) is not None:
            label, copy = m.chrome_start + label + m.chrome_end, m.chrome_start + copy + m.chrome_end
            # the code starts on the line after a fence's opening line (an indented block: on its first)
            first_line = token.map[0] + (1 if token.type == "fence" else 0) if token.map else 0
            lines = env["lines"]
            colored = f"{m.sync}{lines[min(first_line, len(lines) - 1)]}{m.sync}{colored}"
        # One table per block: Qt pads and colours table cells, not <pre> blocks.
        return (
            f'<table width="100%" cellspacing="0" cellpadding="8" '
            f'style="background-color:{s.code_background}; margin-top:8px; margin-bottom:10px;">'
            f'<tr><td style="background-color:{s.code_header}; color:{s.muted};">{label}</td>'
            f'<td align="right" style="background-color:{s.code_header};">'
            f'<a href="{COPY_SCHEME}:{index}" style="color:{s.link}; text-decoration:none;">{copy}</a></td></tr>'
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

    def _image(self, tokens, idx, options, env) -> str:
        """An image is never loaded (a local file, a tracking pixel): its alt text and address
        are shown as text instead."""
        token = tokens[idx]
        alt = "".join(child.content for child in token.children or []).strip()
        src = str(token.attrGet("src") or "")
        shown = " ".join(part for part in (html.escape(alt), f"({html.escape(src)})" if src else "") if part)
        return f'<span style="color:{self.style.muted};">{shown}</span>'


def _line_starts(text: str) -> list[int]:
    """The offset in `text` where each line starts (markdown-it's token maps count lines)."""
    return [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]


def _tinted(body: str, source: str, tint: Tint, markers: _Markers) -> str:
    """Wrap every stretch of text in `body` (the HTML of `source`) in the colour of whoever wrote
    it; in a code block (<pre>), only its background, so the highlighting stays. Each visible
    character is found in the source at or after the last one matched (Markdown only removes
    characters, never reorders them); whitespace takes its neighbour's colour, and text between
    block tags (only whitespace) is left alone so no empty lines appear."""
    unit_pattern = markers.unit
    code_styles = {kind: _background_only(style) for kind, style in tint.styles.items()}
    in_code = False
    kinds: list[str | None] = [None] * len(source)
    at = 0
    for n, kind in tint.spans:
        kinds[at: at + n] = [kind] * len(kinds[at: at + n])
        at += n
    pos, last, out = 0, None, []
    for piece in _TAG.split(body):
        if not piece or piece.startswith("<"):
            in_code = piece.startswith("<pre") or (in_code and not piece.startswith("</pre"))
            out.append(piece)
            continue
        units: list[tuple[str | None, str]] = []
        chrome = False
        for match in unit_pattern.finditer(piece):
            unit = match.group(0)
            if unit in (markers.chrome_start, markers.chrome_end):
                chrome = unit == markers.chrome_start
                continue
            if match.group(1) is not None:  # a code block starts here in the source
                pos = max(pos, int(match.group(1)))
                continue
            char = html.unescape(unit) if unit.startswith("&") else unit
            if chrome:
                units.append((None, unit))
            elif char.isspace():
                units.append((last, unit))
            else:
                found = source.find(char, pos, pos + MAX_SKIP)
                if found >= 0:
                    last, pos = kinds[found], found + 1
                units.append((last, unit))
        if all(html.unescape(unit).isspace() for _, unit in units):
            out.append("".join(unit for _, unit in units))
            continue
        run_kind, run = None, []
        for kind, unit in [*units, ("\0end", "")]:
            if kind != run_kind and run:
                text = "".join(run)
                style = (code_styles if in_code else tint.styles).get(run_kind) if run_kind else None
                out.append(f'<span style="{style}">{text}</span>' if style else text)
                run = []
            run_kind = kind
            run.append(unit)
    return "".join(out)


def _background_only(style: str) -> str:
    """Inline CSS without its text colour: a tint that leaves code's highlighting as it is."""
    kept = [part for part in style.split(";") if part.strip() and part.split(":")[0].strip().lower() != "color"]
    return "; ".join(part.strip() for part in kept) + (";" if kept else "")


def _unbound(rule):
    def call(_renderer, tokens, idx, options, env):
        return rule(tokens, idx, options, env)

    return call


def plain_to_html(text: str) -> str:
    """A user's own message: shown as typed, line breaks kept, nothing interpreted."""
    return html.escape(text).replace("\n", "<br>")
