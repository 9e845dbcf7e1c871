"""A server's address as users paste it, made into one base URL (app/remote/endpoint.py), and its
API key kept in the OS's credential store or, where there is none, in a file only the user can
read (app/remote/keys.py)."""

from __future__ import annotations

import json
import stat

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail
from keyring.errors import PasswordDeleteError

from app.paths import data_dir
from app.remote import keys
from app.remote.endpoint import EndpointError, is_remote, parse_endpoint


@pytest.mark.parametrize("given, base", [
    ("http://gpu-box:8000", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1"),
    (" HTTP://GPU-Box:8000/v1/ ", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/v1/chat/completions", "http://gpu-box:8000/v1"),
    ("https://example.com/llm/v1/models", "https://example.com/llm/v1"),
    ("https://example.com/openai", "https://example.com/openai/v1"),
    ("http://[::1]:8080", "http://[::1]:8080/v1"),
])
def test_an_address_with_or_without_v1_is_one_base(given, base):
    endpoint = parse_endpoint(given)
    assert endpoint.base == base
    assert endpoint.secure == base.startswith("https")
    assert endpoint.root == base.removesuffix("/v1") and endpoint.url("/models") == base + "/models"


@pytest.mark.parametrize("given, words", [
    ("gpu-box:8000", "starts with http:// or https://"),
    ("ftp://gpu-box", "starts with http:// or https://"),
    ("http://", "names no host"),
    ("http://user:sk-secret@gpu-box:8000/v1", "user name or key"),
    ("http://gpu-box:port/v1", "not a valid address"),
    ("http://gpu-box:8000/v1?key=1", "query or fragment"),
])
def test_an_address_that_cannot_be_used_is_refused_in_words(given, words):
    with pytest.raises(EndpointError, match=words) as refused:
        parse_endpoint(given)
    assert "sk-secret" not in str(refused.value)


def test_only_http_and_https_name_a_server():
    assert is_remote("https://x") and is_remote(" http://x") and not is_remote("demo")
    assert not is_remote("/models/http://x") and not is_remote(None)


class _MemoryStore(KeyringBackend):
    """A credential store in memory, standing in for the OS's (none runs here)."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.kept: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.kept.get((service, username))

    def set_password(self, service, username, password):
        self.kept[(service, username)] = password

    def delete_password(self, service, username):
        if self.kept.pop((service, username), None) is None:
            raise PasswordDeleteError("none kept")


@pytest.fixture
def store():
    before = keyring.get_keyring()
    memory = _MemoryStore()
    keyring.set_keyring(memory)
    yield memory
    keyring.set_keyring(before)


@pytest.fixture
def no_store():
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


def test_keys_go_to_the_credential_store_and_nowhere_else(store):
    keys.save("https://gpu-box:8000", "sk-one")
    assert store.kept == {(keys.SERVICE, "https://gpu-box:8000"): "sk-one"}
    assert keys.load("https://gpu-box:8000") == "sk-one" and keys.load("https://other:8000") is None
    assert not (data_dir() / keys.KEYS_FILE).exists()
    assert "credential store" in keys.where()
    assert keys.forget("https://gpu-box:8000") and store.kept == {}
    assert not keys.forget("https://gpu-box:8000")


def test_without_a_store_keys_go_in_a_file_only_the_user_can_read(no_store):
    keys.save("https://gpu-box:8000", "sk-one")
    keys.save("http://home:8080", "sk-two")
    path = data_dir() / keys.KEYS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"https://gpu-box:8000": "sk-one", "http://home:8080": "sk-two"}
    assert keys.load("http://home:8080") == "sk-two"
    assert str(path) in keys.where() and "readable only by you" in keys.where()
    assert keys.forget("https://gpu-box:8000")
    assert keys.load("https://gpu-box:8000") is None and keys.load("http://home:8080") == "sk-two"


def test_a_damaged_key_file_loses_no_more_than_itself(no_store, caplog):
    path = data_dir() / keys.KEYS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert keys.load("http://home:8080") is None
    assert "cannot be read" in caplog.text
    path.write_text(json.dumps({"http://home:8080": 7, "http://a:1": "sk-a"}))  # a bad field is skipped
    assert keys.load("http://home:8080") is None and keys.load("http://a:1") == "sk-a"
    keys.save("http://home:8080", "sk-new")  # a new key is kept beside the good ones
    assert json.loads(path.read_text()) == {"http://a:1": "sk-a", "http://home:8080": "sk-new"}
    assert "sk-" not in caplog.text


def test_a_key_file_that_cannot_be_written_is_a_clear_error(no_store):
    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / keys.KEYS_FILE).mkdir()  # a folder where the file belongs
    with pytest.raises(keys.KeyStoreError, match="could not be saved") as refused:
        keys.save("http://home:8080", "sk-secret")
    assert "sk-secret" not in str(refused.value)
