"""A server's address as the user gives it, made into the one base URL every request is sent to.

Users paste what their server printed or what a README said: with or without `/v1`, with a
trailing slash, sometimes the whole `/v1/chat/completions`. Each becomes `scheme://host[:port]
[/prefix]/v1`, the base OpenAI's clients take. A key in the URL itself (`https://user:key@host`)
is refused: it would be shown wherever the URL is (the header, the history, a screenshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# what people paste after the base, longest first: the base is what is left
_ENDPOINT_TAILS = ("/chat/completions", "/completions", "/models")


class EndpointError(ValueError):
    """Not a server address Tandem can use; the message says why and what to type instead."""


def is_remote(spec: object) -> bool:
    """Whether a model spec names a server rather than a file, folder or hub id."""
    return isinstance(spec, str) and spec.strip().lower().startswith(("http://", "https://"))


HUB_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")  # a link there is a model to fetch


def is_server_address(text: object) -> bool:
    """Whether a dropped or typed text names a server to talk to: an http(s) address anywhere but
    the Hugging Face hub (whose links are models to fetch, or links refused in words)."""
    if not is_remote(text):
        return False
    try:
        host = (urlsplit(text.strip()).hostname or "").lower()
    except ValueError:
        return True  # parse_endpoint says what is wrong with it
    return host not in HUB_HOSTS


@dataclass(frozen=True)
class Endpoint:
    base: str  # "https://gpu-box:8000/v1": requests go to base + "/chat/completions"
    secure: bool  # https

    @property
    def origin(self) -> str:
        """scheme://host:port: what a stored key belongs to, and what the window shows."""
        parts = urlsplit(self.base)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def root(self) -> str:
        """The server's root, where engines keep their own routes (/metrics, /props, /generate)."""
        return self.base.removesuffix("/v1")

    def url(self, path: str) -> str:
        return self.base + path

    def __str__(self) -> str:
        return self.base


def parse_endpoint(text: str) -> Endpoint:
    """The base URL of `text` ("gpu-box:8000" is refused: a scheme says whether it is TLS)."""
    raw = (text or "").strip()
    if not is_remote(raw):
        raise EndpointError(f"“{raw[:80]}” is not a server address: give one that starts with http:// or "
                            "https://, such as http://192.168.1.20:8000/v1.")
    try:
        parts = urlsplit(raw)
        port = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise EndpointError(f"“{raw[:80]}” is not a valid address: {exc}.") from None
    if not parts.hostname:
        raise EndpointError(f"“{raw[:80]}” names no host: give one such as http://localhost:8000/v1.")
    if parts.username is not None or parts.password is not None:
        raise EndpointError("The address holds a user name or key (user:key@host), which would be shown wherever "
                            "the address is: give the address without it, and the key in the API key field.")
    if parts.query or parts.fragment:
        raise EndpointError(f"“{raw[:80]}” has a query or fragment (?… or #…): give the server's address alone.")
    path = parts.path.rstrip("/")
    for tail in _ENDPOINT_TAILS:
        if path.endswith("/v1" + tail):
            path = path.removesuffix(tail)
            break
    if not path.endswith("/v1"):
        path += "/v1"
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"  # an IPv6 literal
    netloc = host if port is None else f"{host}:{port}"
    scheme = parts.scheme.lower()
    return Endpoint(urlunsplit((scheme, netloc.lower(), path, "", "")), scheme == "https")


@dataclass(frozen=True)
class RemoteSpec:
    """What a user gives for a remote target: the address, the model (None: the server's only
    one), the CA file of a self-signed server, and a key not to store (the CLI's variable);
    otherwise the key kept for the server's origin is used."""

    address: str
    model: str | None = None
    ca_file: Path | None = None
    key: str | None = None
