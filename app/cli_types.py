"""The command line's option types (argparse's `type=`): each turns an option's text into its
value or says, in words, what was wrong with it. Apart from app/cli.py so the subcommands it
adds (app/align/command.py) share them without importing the CLI that imports them.

Every type raises ArgumentTypeError with the words to show: from a plain ValueError argparse
says "invalid <the function's name> value" ("invalid _draft_tokens value").
"""

from __future__ import annotations

import argparse


def draft_choice(text: str):
    """--draft's type: the edge where its text becomes a DraftChoice (app/draft_choice.py)."""
    from app.draft_choice import DraftChoice, DraftChoiceError

    try:
        return DraftChoice.parse_loadable(text)
    except DraftChoiceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def whole_number(value: str) -> int:
    """An argparse type for an integer option (--seed, --top-k, --port)."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a whole number") from None


def real_number(value: str) -> float:
    """An argparse type for a number that may have a fraction (--temperature, --top-p)."""
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a number") from None


def named(what: str):
    """An argparse type for a model or a path that must be named: an empty one would be read as
    the current folder (".: no config.json ...")."""

    def name(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"it is empty, so it names nothing: give {what}")
        return value

    return name


MODEL = named('a model folder, a .gguf file or "demo"')


def at_least_one(what: str, least: int = 1):
    """An argparse type for counts such as --max-tokens (0 or less once emitted one token anyway);
    `least` 0 for counts where 0 means none (--self-prompts)."""

    def count(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a whole number of {what}s, not {value[:40]!r}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"takes at least {least} {what}{'s' if least != 1 else ''}, not {n}")
        return n

    return count
