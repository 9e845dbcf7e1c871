"""The built-in prompts alignment asks the target to answer, and the user's own when they opt in.

Chat asks of the kinds people send (explain, list, write, code, compare, summarise) about many
subjects, built from templates so the set is large and fixed (the same prompts in every run, in a
shuffled but seeded order). None is a prompt of the pair trial or of the bench's suite: those
measure the result, so they stay held out.
"""

from __future__ import annotations

import functools
import random
import sqlite3
import zlib
from pathlib import Path

ASKS = (
    "Explain {} to a beginner.",
    "List five facts about {}.",
    "Give me three practical tips about {}.",
    "Write a short poem about {}.",
    "Write a short story that involves {}.",
    "What are the pros and cons of {}?",
    "Write a friendly email to a colleague about {}.",
    "Summarise what you know about {} in one paragraph.",
    "What are common misconceptions about {}?",
    "Describe {} in simple words, then give an example.",
    "Write a step-by-step guide related to {}.",
    "Answer briefly: what is the most important thing to know about {}?",
)
SUBJECTS = (
    "volcanoes", "the French revolution", "photosynthesis", "binary search", "sorting a list in Python",
    "saving money", "learning to cook", "the moon", "climate change", "a cover letter", "dogs", "chess",
    "the water cycle", "electric cars", "a good night's sleep", "prime numbers", "the Roman empire",
    "gardening", "machine learning", "a job interview", "coffee", "the ocean", "recursion",
    "time management", "bicycles", "the human heart", "music theory", "renewable energy",
    "planning a birthday party", "SQL databases", "friendship", "rain forests", "the stock market",
    "public speaking", "JavaScript promises", "the solar system", "healthy eating", "ancient Egypt",
    "learning a new language", "git branches", "earthquakes", "the internet", "writing unit tests",
    "meditation", "the printing press", "bees", "a small business", "recycling", "probability",
    "mountains", "a road trip", "cats", "the immune system", "regular expressions", "running a marathon",
    "Shakespeare", "black holes", "budget travel", "a rainy day", "the Python dictionary", "democracy",
)
# a few asks with their own text to work on (code to edit, text to rewrite): answers that copy
CODE = (
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n",
    "def greet(name):\n    print('Hello ' + name)\n    return None\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
)
CODE_ASKS = (
    "Add comments to this code and write it out again:\n\n{}",
    "Rewrite this code with type hints:\n\n{}",
    "Explain what this code does, line by line:\n\n{}",
)


def builtin_prompts(seed: int = 0) -> list[str]:
    prompts = [ask.format(subject) for subject in SUBJECTS for ask in ASKS]
    prompts += [ask.format(code) for code in CODE for ask in CODE_ASKS]
    random.Random(seed).shuffle(prompts)
    return prompts


def held_out(text: str, seed: int = 0) -> bool:
    """Whether the answer to `text` measures agreement and is never trained on: every ask about a
    tenth of the subjects (and about one of the code snippets), so no held-out answer shares its
    subject with a trained one. With a random tenth of the answers instead, asks about the same
    subject fell on both sides: the demo's head read 0.45 there and 0.2 on the bench's prompts.
    Other texts (the user's own messages) by a hash: a tenth of them."""
    held, builtin = _held_out_builtin(seed)
    if text in builtin:
        return text in held
    return zlib.crc32(text.encode("utf-8")) % 10 == 0


@functools.lru_cache(maxsize=4)
def _held_out_builtin(seed: int) -> tuple[frozenset[str], frozenset[str]]:
    subjects = random.Random(seed).sample(SUBJECTS, max(1, len(SUBJECTS) // 10))
    held = {ask.format(subject) for subject in subjects for ask in ASKS}
    held |= {ask.format(CODE[seed % len(CODE)]) for ask in CODE_ASKS}
    return frozenset(held), frozenset(builtin_prompts(seed))


def history_prompts(database: Path, limit: int = 500) -> list[str]:
    """The user's own messages from their chat history (newest first), read-only; [] where there
    is no history yet. Used only when the user opts in."""
    if not Path(database).is_file():
        return []
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?",
                              (limit,)).fetchall()
    except sqlite3.Error:
        return []
    return [text for (text,) in rows if isinstance(text, str) and text.strip()]
