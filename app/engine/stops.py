"""Stop strings: find the earliest stop string in streamed text, and hold back text that could
still turn into one, so a stop string is never shown and then taken back."""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...] | list[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to show now, whether a stop string was hit)."""
        if not self.stops:
            return delta, False
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return text[: min(hits)], True
        # keep back the longest tail that is a prefix of some stop string
        keep = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
