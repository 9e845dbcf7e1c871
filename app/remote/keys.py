"""API keys of remote servers: kept in the OS's credential store (macOS Keychain, Windows
Credential Manager, the Secret Service on Linux desktops) through `keyring`, one per server
origin. Where there is no store (a Linux without a Secret Service, a headless box) the keys go in
a file only the user can read (0600, in Tandem's data folder), and `where()` says so for the
settings. A key is never logged, never part of an error message, never in a URL.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from app.paths import data_dir

log = logging.getLogger(__name__)

SERVICE = "Tandem remote servers"
KEYS_FILE = "remote-keys.json"
KEY_VARIABLE = "TANDEM_REMOTE_API_KEY"  # the CLI's way to give a key without storing it


class KeyStoreError(OSError):
    """A key could not be stored or read; the message says where and why (never the key)."""


def _keyring():
    """The OS's credential store, or None where keyring has no usable backend."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:  # a build without it: the file
        return None
    backend = keyring.get_keyring()
    chained = getattr(backend, "backends", None)
    if isinstance(backend, fail.Keyring) or (chained is not None and not chained):
        return None
    return keyring


def _file() -> Path:
    return data_dir() / KEYS_FILE


def where() -> str:
    """The settings' words for where keys are kept."""
    store = _keyring()
    if store is not None:
        return f"in the system's credential store ({type(store.get_keyring()).__name__})"
    return f"in {_file()}, readable only by you (no system credential store was found)"


def _read_file() -> dict[str, str]:
    path = _file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("the remote servers' key file %s cannot be read (%s): no stored keys are used", path,
                    type(exc).__name__)
        return {}
    if not isinstance(data, dict):
        log.warning("the remote servers' key file %s does not hold an object: no stored keys are used", path)
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _write_file(keys: dict[str, str]) -> None:
    path = _file()
    partial = path.with_suffix(".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # created 0600 before a byte is written: the key is never readable by others, even briefly
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(keys, out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(partial, stat.S_IRUSR | stat.S_IWUSR)  # an old partial file kept its mode through O_TRUNC
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise KeyStoreError(f"The API key could not be saved in {path}: {exc.strerror or type(exc).__name__}.") \
            from None


def save(origin: str, key: str) -> None:
    """Keep `key` for the server at `origin` ("https://host:port")."""
    store = _keyring()
    if store is not None:
        try:
            store.set_password(SERVICE, origin, key)
            return
        except store.errors.KeyringError as exc:
            log.warning("the credential store refused the key (%s): it is kept in %s", type(exc).__name__, _file())
    keys = _read_file()
    keys[origin] = key
    _write_file(keys)


def load(origin: str) -> str | None:
    """The key kept for `origin`, or None."""
    store = _keyring()
    if store is not None:
        try:
            key = store.get_password(SERVICE, origin)
        except store.errors.KeyringError as exc:
            log.warning("the credential store could not be read (%s)", type(exc).__name__)
            key = None
        if key is not None:
            return key
    return _read_file().get(origin)


def forget(origin: str) -> bool:
    """Remove the key kept for `origin`; whether there was one."""
    found = False
    store = _keyring()
    if store is not None:
        try:
            store.delete_password(SERVICE, origin)
            found = True
        except store.errors.KeyringError:  # PasswordDeleteError: none kept there
            pass
    keys = _read_file()
    if keys.pop(origin, None) is not None:
        _write_file(keys)
        found = True
    return found
