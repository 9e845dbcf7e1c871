"""The API key: checked once at start, then on every request (`Authorization: Bearer <key>`).

HTTP carries header values as bytes, which servers read as Latin-1, while a key typed on a
command line is Unicode: a key with "é" in it could never match what a client sends. Keys are
therefore ASCII, as OpenAI's are, and refused at start otherwise; a request is compared byte for
byte, in constant time, so no header it sends can raise anything.
"""

from __future__ import annotations

import hmac

from app.server.requests import ApiError

KEY_VARIABLE = "TANDEM_API_KEY"


def key_problem(key: str) -> str | None:
    """Why `key` cannot be used (None: it can). The message never repeats the key."""
    if all("!" <= ch <= "~" for ch in key):
        return None
    kind = "a space or control character" if key.isascii() else "a character that is not ASCII"
    return (f"The API key holds {kind}, which HTTP headers cannot carry as typed: choose a key of ASCII "
            f"letters, digits and punctuation (as OpenAI's keys are), in --api-key or ${KEY_VARIABLE}.")


class RequireKey:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <key>`, else 401."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode("ascii")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not self._allowed(scope["headers"]):
            refusal = ApiError(401, "This server needs an API key: send it as 'Authorization: Bearer <key>' "
                                    f"(the key given to tandem-cli serve --api-key, or {KEY_VARIABLE}).",
                               code="invalid_api_key")
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = next((value for name, value in headers if name == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
