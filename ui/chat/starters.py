"""What the empty chat offers a newcomer: one line on what speculation does, and prompts that show
it. Drafting pays where the answer repeats what it was given (prompt lookup copies it, a draft
model guesses it): on the demo, copying a poem back ran 2.41x with 86% of drafts accepted, while
general questions ran 0.54-0.82x (issue 35's hour with the window). So the starters are copying
and editing tasks, with their text inside the prompt."""

from __future__ import annotations

EXPLAINER = ("Tandem writes with two models: a small draft proposes the next few tokens and the model checks them "
             "all in one pass, so the answer is exactly the model's own, only sooner. It pays most where the "
             "answer repeats what it was given.")

DEMO_NOTE = ("The demo's model is tiny (135M parameters), so only copying and editing tasks speed up here. "
             "For a real speedup on any question, pick a known-good pair from the Target slot's menu.")

STARTERS = (
    ("Fix the typos in a paragraph",
     "Fix the typos in this paragraph and give it back otherwise unchanged:\n\n"
     "Speculative decodign lets a smal model draft the next few tokens while the large model cheks them "
     "all at once. When the draft is rigth, several tokens are acepted in a single pass, and the answer is "
     "exactly what the large model would have writen on its own."),
    ("Repeat a poem",
     "Repeat this poem back to me exactly, line by line:\n\n"
     "The sea is calm tonight.\nThe tide is full, the moon lies fair\nUpon the straits; on the French coast "
     "the light\nGleams and is gone; the cliffs of England stand,\nGlimmering and vast, out in the tranquil bay."),
    ("Edit a function",
     "Rename the variable x to total in this function and show the whole function:\n\n"
     "```python\ndef add_all(numbers):\n    x = 0\n    for n in numbers:\n        x = x + n\n    return x\n```"),
)
