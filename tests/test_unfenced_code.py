"""Code a model writes without a fence keeps its indentation (issue 35, defect 2): Markdown joins
such lines into a paragraph and drops their leading spaces; Tandem shows them as a code block of
their source lines, with a Copy link, and leaves prose that merely ends in a colon alone."""

from __future__ import annotations

import pytest

from app.chat.markdown import MarkdownRenderer, Tint

FUNCTION = "def area(w, h):\n    if w < 0:\n        raise ValueError(w)\n    return w * h"


@pytest.mark.parametrize("text, code", [
    (f"Here is the function:\n{FUNCTION}\n\nCall it with two numbers.", FUNCTION),
    (f"{FUNCTION}\n", FUNCTION),
    ("Sure:\ndef f(x):\n    y = x\n\n    return y\n\nDone.", "def f(x):\n    y = x\n\n    return y"),
    ("In C:\nint main() {\n    return 0;\n}", "int main() {\n    return 0;\n}"),
])
def test_unfenced_code_is_a_code_block_with_its_indentation(qapp, text, code):
    from PySide6.QtGui import QTextDocument

    rendered = MarkdownRenderer().render(text)
    assert rendered.code_blocks == [code]  # what Copy puts on the clipboard: the code as written
    shown = QTextDocument()
    shown.setHtml(rendered.html)
    assert "\n    return" in shown.toPlainText()  # the indentation is on screen
    assert 'href="copy:0"' in rendered.html


@pytest.mark.parametrize("text", [
    "The steps are:\n  first this\n  then that",  # prose ending in a colon, indented by habit
    "If you like:\nthe sea is calm today.",
    "A poem\n  with an indented line\nand another",
])
def test_prose_is_left_as_prose(text):
    rendered = MarkdownRenderer().render(text)
    assert rendered.code_blocks == [] and "<pre" not in rendered.html


def test_the_prose_before_unfenced_code_stays_a_paragraph_and_tinting_keeps_the_text(qapp):
    from PySide6.QtGui import QTextDocument

    text = f"Here is **the** function:\n{FUNCTION}\n"
    renderer = MarkdownRenderer()
    rendered = renderer.render(text)
    assert rendered.html.startswith("<p>Here is <strong>the</strong> function:</p>")
    spans = [(3, "accepted"), (2, "target")] * (len(text) // 5 + 1)
    plain, tinted = QTextDocument(), QTextDocument()
    plain.setHtml(rendered.html)
    tinted.setHtml(renderer.render(text, Tint(spans, {"accepted": "background-color:#00ff00;",
                                                      "target": "background-color:#0000ff;"})).html)
    assert tinted.toPlainText() == plain.toPlainText() and "        raise ValueError(w)" in plain.toPlainText()
