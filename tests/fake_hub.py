"""A local HTTP server standing in for the Hugging Face hub's two endpoints that downloads use:
the repo tree listing (/api/models/<repo>/tree/<rev>) and the file endpoint
(/<repo>/resolve/<rev>/<file>, HEAD and ranged GET). Records every request, can serve slowly
(screenshots of a download in progress), and can answer as the hub does for gated repos."""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 64 * 1024


class FakeHub:
    def __init__(self, port: int = 0):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: set[str] = set()  # repos that need a token from `tokens`
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range header
        self.delay_s = 0.0  # per chunk of a GET body
        self.on_sent = None  # called with (file name, bytes of it sent so far) after each chunk
        # A stalled hub: while `hold_listing` is an unset Event, a tree listing waits for it (at
        # most hold_max_s) before answering; `listings_answered` counts the answers sent.
        self.hold_listing: threading.Event | None = None
        self.hold_max_s = 20.0
        self.listings_answered = 0
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet test output
                pass

            def do_HEAD(self):  # noqa: N802 (http.server's name)
                hub._serve(self, body=False)

            def do_GET(self):  # noqa: N802 (http.server's name)
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.hold_listing is not None:
            self.hold_listing.set()  # let a held request end
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos[repo] = files

    def add_folder(self, repo: str, folder) -> None:
        self.add(repo, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})

    def _serve(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append((handler.command, path, handler.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and "tree" in parts:
            at = parts.index("tree")
            repo = "/".join(parts[2:at])
            return self._tree(handler, repo)
        if "resolve" in parts:
            at = parts.index("resolve")
            repo, name = "/".join(parts[:at]), "/".join(parts[at + 2:])
            return self._file(handler, repo, name, body)
        self._error(handler, 404, "EntryNotFound", "no such endpoint")

    def _refused(self, handler, repo: str) -> bool:
        auth = handler.headers.get("Authorization", "")
        return repo in self.gated and auth.removeprefix("Bearer ") not in self.tokens

    def _error(self, handler, status: int, code: str, message: str) -> None:
        handler.send_response(status)
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _tree(self, handler, repo: str) -> None:
        import json

        if self.hold_listing is not None:
            self.hold_listing.wait(self.hold_max_s)
        self.listings_answered += 1

        if self._refused(handler, repo):
            return self._error(handler, 401, "GatedRepo", "Access to this model is restricted.")
        if repo not in self.repos:
            return self._error(handler, 404, "RepoNotFound", "Repository not found")
        listing = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                   for name, data in self.repos[repo].items()]
        payload = json.dumps(listing).encode()
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (a held listing)
            pass

    def _file(self, handler, repo: str, name: str, body: bool) -> None:
        if self._refused(handler, repo):
            return self._error(handler, 401, "GatedRepo", "Access to this model is restricted.")
        data = self.repos.get(repo, {}).get(name)
        if data is None:
            return self._error(handler, 404, "EntryNotFound", f"{name} not found")
        start = 0
        wanted = handler.headers.get("Range")
        if body and wanted and wanted.startswith("bytes="):
            start = int(wanted[6:].split("-")[0])
        handler.send_response(206 if start else 200)
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        handler.send_header("Content-Length", str(len(data) - start))
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        handler.end_headers()
        if not body:
            return
        try:
            for at in range(start, len(data), CHUNK):
                handler.wfile.write(data[at:at + CHUNK])
                if self.on_sent is not None:
                    self.on_sent(name, at + CHUNK)
                if self.delay_s:
                    time.sleep(self.delay_s)
        except (BrokenPipeError, ConnectionResetError):  # the client cancelled
            pass
