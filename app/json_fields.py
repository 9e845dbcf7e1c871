"""Checks for values read from JSON data files (pairs.json, history rows), and how to name one.

JSON's numbers reach Python as int or float, and Python counts true and false as ints; a data
file written by hand or damaged can hold any of them where a figure belongs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def is_whole(value) -> bool:
    """An integer, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite number a float holds (10**400 is a JSON number no float holds, and math.isfinite
    raises on it; true and false are not numbers here)."""
    if is_whole(value):
        return abs(value) < 2**63
    return isinstance(value, float) and math.isfinite(value)


def shown(value) -> str:
    """A value from a file as a user would see it there, cut short: `5`, `"abc"`, `[1, 2]`."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def read_object(path: Path) -> dict:
    """A JSON file's top-level object, or {} where the file is missing, unreadable, not JSON or
    not an object (a model folder's config.json read to tell what the folder holds)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
