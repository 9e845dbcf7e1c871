"""Bad files, bad values and a stalling hub end in a message, never a traceback, and nothing the
user had is lost: weights behind a looping or dangling symbolic link, CLI values checked before
any model loads, a data folder that cannot be made, a damaged Tandem.conf and pairs.json, a hub
that stops answering mid-listing, odd links dropped on a slot, and staging folders left by an
import that was killed. Fast: no model weights load here."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.models.errors import ModelFileError


def model_folder(root: Path, name: str = "model") -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


@pytest.fixture
def no_loading(monkeypatch):
    """Fails the test if the CLI tries to load a model: every check here comes before that."""
    from app.runner import Runner

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad value was refused")

    monkeypatch.setattr(Runner, "load", refuse)


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """app.cli.main in-process: its exit code (argparse's own errors included) and stderr."""
    from app.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a value with usage and exit 2
        code = exc.code
    return code, capsys.readouterr().err


# 1. Weights behind a symbolic link that loops or points nowhere


def test_a_weights_file_that_is_a_symlink_loop_is_named_with_what_to_do(tmp_path):
    from app.models.integrity import check_weights

    folder = model_folder(tmp_path)
    os.symlink("model.safetensors", folder / "model.safetensors")  # a link to itself
    with pytest.raises(ModelFileError, match=r"^model\.safetensors is a symbolic link that loops .*Replace the link"):
        check_weights(folder)


def test_a_dangling_weights_link_and_a_dangling_shard_say_where_they_pointed(tmp_path):
    from app.models.integrity import check_weights

    folder = model_folder(tmp_path)
    os.symlink(tmp_path / "gone.safetensors", folder / "model.safetensors")
    with pytest.raises(ModelFileError, match=r"model\.safetensors is a symbolic link to .*gone\.safetensors, which "
                                             r"does not exist"):
        check_weights(folder)
    sharded = model_folder(tmp_path, "sharded")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "a.safetensors"}}))
    os.symlink(tmp_path / "moved.safetensors", sharded / "a.safetensors")
    with pytest.raises(ModelFileError, match=r"a\.safetensors is a symbolic link to .*moved\.safetensors"):
        check_weights(sharded)


def test_the_cli_prints_one_line_for_a_looping_weights_link(tmp_path, capsys):
    folder = model_folder(tmp_path)
    os.symlink("model.safetensors", folder / "model.safetensors")
    code, err = cli(["generate", "--model", str(folder), "--backend", "torch", "--draft", "none",
                     "--prompt", "hi"], capsys)
    assert code == 2
    assert err.startswith("tandem-cli: model.safetensors is a symbolic link that loops")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_cli_catches_any_os_error_while_loading_in_one_line(tmp_path, capsys, monkeypatch):
    from app.runner import Runner

    def unreadable(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "model"))

    monkeypatch.setattr(Runner, "load", unreadable)
    code, err = cli(["generate", "--model", str(tmp_path / "model"), "--prompt", "hi"], capsys)
    assert code == 1
    assert err.startswith(f"tandem-cli: cannot read or write {tmp_path / 'model'}: Permission denied.")
    assert "Traceback" not in err


def test_a_two_model_drop_with_a_dangling_link_is_sized_and_refused_in_words(tmp_path):
    from app.models.sources import classify, model_size
    from ui.pairing.controller import _by_size

    good, bad = model_folder(tmp_path, "good"), model_folder(tmp_path, "bad")
    (good / "model.safetensors").write_bytes(b"\0" * 100)
    os.symlink(tmp_path / "gone.safetensors", bad / "model.safetensors")
    assert model_size(str(bad)) == 0
    assert _by_size([str(bad), str(good)]) == (str(good), str(bad))
    loop = tmp_path / "loop.gguf"
    os.symlink(loop.name, loop)
    with pytest.raises(ModelFileError, match=r"^loop\.gguf is a symbolic link that loops"):
        classify(str(loop))


# 2. CLI values, checked before anything loads


@pytest.mark.parametrize("args, words", [
    (["--temperature", "nan"], "temperature"),
    (["--temperature", "1e-40"], "temperature"),
    (["--temperature", "inf"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-k", "-1"], "top-k"),
    (["--max-tokens", "0"], "--max-tokens: takes at least 1 new token, not 0"),
    (["--max-tokens", "-5"], "--max-tokens: takes at least 1 new token, not -5"),
    (["--max-tokens", "many"], "--max-tokens: takes a whole number of new tokens"),
])
def test_sampling_values_and_max_tokens_are_refused_before_any_model_loads(args, words, capsys, no_loading):
    code, err = cli(["generate", "--prompt", "hi", *args], capsys)
    assert code == 2
    assert words in err and "Traceback" not in err


def test_a_prompt_that_is_not_utf8_gets_a_message_not_a_tokenizer_traceback(capsys, no_loading):
    prompt = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # what Linux argv gives for Latin-1 bytes
    code, err = cli(["generate", "--prompt", prompt], capsys)
    assert code == 2
    assert err.startswith("tandem-cli: --prompt is not valid UTF-8 text (an undecodable byte at character 4)")
    code, err = cli(["generate", "--prompt", "hi", "--system", prompt], capsys)
    assert code == 2 and "--system is not valid UTF-8" in err


# 3. A data folder that cannot be made


@pytest.fixture
def home_under_a_file(tmp_path, monkeypatch) -> Path:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where Tandem's folder should go")
    monkeypatch.setenv("TANDEM_HOME", str(blocker / "tandem"))
    monkeypatch.delenv("TANDEM_CACHE", raising=False)
    return blocker


def test_the_cli_says_which_folder_cannot_be_made_and_why(home_under_a_file, capsys):
    code, err = cli(["generate", "--backend", "torch", "--draft", "none", "--prompt", "hi"], capsys)
    assert code == 1
    assert err.startswith(f"tandem-cli: Tandem cannot create its cache folder {home_under_a_file}/tandem/cache: "
                          f"{home_under_a_file} is a file, not a folder. TANDEM_HOME is set to")
    assert "Traceback" not in err


def test_the_window_shows_a_dialog_when_its_data_folder_cannot_be_made(qapp, home_under_a_file, capsys):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    import ui.main

    seen = []

    def answer_the_dialog():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, answer_the_dialog)
            return
        seen.append((box.windowTitle(), box.text()))
        box.button(QMessageBox.StandardButton.Ok).click()

    QTimer.singleShot(0, answer_the_dialog)
    assert ui.main.main([]) == 1
    assert seen and seen[0][0] == "Tandem cannot start"
    assert seen[0][1].startswith(f"Tandem cannot create its data folder {home_under_a_file}/tandem/data: "
                                 f"{home_under_a_file} is a file, not a folder.")
    assert "Tandem cannot create its data folder" in capsys.readouterr().err


# 4. Tandem.conf: under TANDEM_HOME, and a damaged value is reset, never fatal

DAMAGED_CONF = """[window]
geometry=hello
splitter=@Variant(\\0\\0\\0\\x7f\\0\\0\\0\\x5bgarbage)
side_panel=banana
settings_drawer=2

[chat]
last_conversation=not-a-number
"""


def test_the_settings_file_lives_under_tandem_home(qapp, tmp_path, monkeypatch):
    from ui import window_state

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    settings = window_state.open_settings()
    settings.setValue(window_state.SIDE_PANEL, False)
    settings.sync()
    assert Path(settings.fileName()) == tmp_path / "home" / "Tandem.conf"
    assert "side_panel=false" in (tmp_path / "home" / "Tandem.conf").read_text()


def test_damaged_window_settings_are_reset_not_fatal(qapp, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QLabel, QMainWindow, QSplitter

    from ui import window_state

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    (tmp_path / "Tandem.conf").write_text(DAMAGED_CONF)
    settings = window_state.open_settings()
    window, splitter = QMainWindow(), QSplitter()
    splitter.addWidget(QLabel("a"))
    assert window_state.restore_layout(settings, window, splitter) is False  # as on a first start
    assert window_state.flag(settings, window_state.SIDE_PANEL, True) is True
    assert window_state.flag(settings, window_state.SETTINGS_DRAWER, False) is False
    assert window_state.last_conversation(settings) is None
    settings.sync()
    text = (tmp_path / "Tandem.conf").read_text()
    assert "hello" not in text and "banana" not in text and "not-a-number" not in text
    window_state.save(settings, window, splitter, side_panel=True, drawer=False, conversation_id=3)
    assert window_state.restore_layout(window_state.open_settings(), QMainWindow(), splitter) is True


def test_the_window_starts_over_a_damaged_settings_file(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from ui.main_window import MainWindow

    (tmp_path / "Tandem.conf").write_text(DAMAGED_CONF)
    settings = QSettings(str(tmp_path / "Tandem.conf"), QSettings.Format.IniFormat)
    window = MainWindow(model=str(tmp_path / "no-model"), backend="torch", history_path=tmp_path / "h.sqlite3",
                        settings=settings)
    qtbot.addWidget(window)
    window.show()
    assert window.side_panel_action.isChecked()  # the default, since "banana" is no answer
    window.app_settings.sync()
    assert "hello" not in (tmp_path / "Tandem.conf").read_text()


# 5. pairs.json read defensively (its bad entries: tests/test_bad_inputs.py, PAIRS), written
#    without losing anything

GOOD = {"backend": "torch", "target": "/m/a", "draft": "ngram", "title": "a + prompt lookup"}


@pytest.mark.parametrize("code, reason", [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "the folder is read-only"),
                                          (errno.EACCES, "no permission to write there")])
def test_a_full_or_read_only_folder_at_the_pairs_json_write_is_reported_and_loses_nothing(code, reason, tmp_path,
                                                                                           monkeypatch):
    from app.draft_choice import NO_DRAFT
    from app.models.pair_memory import PairMemory, TrialResult

    path = tmp_path / "pairs.json"
    path.write_text(json.dumps({"recent": [GOOD]}))
    before = path.read_text()
    memory = PairMemory(path)
    real_write = Path.write_text

    def full(self, *args, **kwargs):
        if self.parent == tmp_path:
            raise OSError(code, os.strerror(code), str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    message = memory.add_recent("torch", "/m/b", NO_DRAFT, "b")
    assert message.startswith(f"Tandem could not save its recent pairs to {path} ({reason}).")
    assert memory.set_trial("torch", "/m/b", NO_DRAFT, TrialResult(0.5, 1.2, 2.0, 64, 0.0)).startswith(
        "Tandem could not save")
    assert [r["target"] for r in memory.recent()] == ["/m/b", "/m/a"]  # kept for this session
    assert path.read_text() == before and not path.with_suffix(".tmp").exists()


# 6. A hub that answers the probe, then stalls the listing


@pytest.fixture
def stalled_hub(tmp_path, monkeypatch):
    from tests.fake_hub import FakeHub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub() as server:
        server.add("org/slow", {"config.json": b"{}", "model.safetensors": b"\0" * 64})
        server.hold_listing = threading.Event()
        yield server


def test_a_stalled_listing_times_out_with_a_message(stalled_hub, monkeypatch):
    from app.models import hub

    monkeypatch.setattr(hub, "LIST_TIMEOUT_S", 0.5)
    stalled_hub.hold_max_s = 8  # long past the timeout: before the fix the listing just waited
    with pytest.raises(hub.NoNetwork, match=r"^The hub did not send the file list of org/slow within 0 s"):
        hub.plan_download(hub.HubRef("org/slow"), endpoint=stalled_hub.endpoint)
    assert stalled_hub.listings_answered == 0


def test_cancel_returns_at_once_while_the_listing_stalls(stalled_hub):
    from app.models import hub

    cancel, outcome = threading.Event(), []

    def fetch():
        try:
            hub.download(hub.HubRef("org/slow"), lambda p: None, cancel, endpoint=stalled_hub.endpoint)
            outcome.append("done")
        except Exception as exc:  # noqa: BLE001 (the outcome is what the test checks)
            outcome.append(exc)

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    while not any("/tree/" in path for _, path, _ in list(stalled_hub.requests)):
        threading.Event().wait(0.02)
    cancel.set()
    thread.join(15)  # the hub holds the listing 20 s: an answer before that came from the cancel
    assert outcome and isinstance(outcome[0], hub.DownloadCancelled)
    assert stalled_hub.listings_answered == 0


def test_the_pairing_is_free_again_once_a_stalled_download_is_cancelled(qtbot, stalled_hub):
    from ui.pairing.controller import PairController
    from ui.pairing.downloads import DownloadStrip

    strip = DownloadStrip()
    qtbot.addWidget(strip)
    pairing = PairController(strip, "torch", endpoint=stalled_hub.endpoint)
    errors = []
    pairing.error.connect(errors.append)
    pairing.choose("target", "org/slow")
    assert pairing.job is not None and strip.file_label.text() == "Asking the hub for the file list…"
    qtbot.waitUntil(lambda: any("/tree/" in path for _, path, _ in list(stalled_hub.requests)))
    strip.cancel_button.click()
    qtbot.waitUntil(lambda: pairing.job is None, timeout=15_000)  # the hub holds its answer 20 s
    assert stalled_hub.listings_answered == 0 and not strip.isVisible()
    pairing.choose("target", "org/slow")  # another try is not refused as "already running"
    assert pairing.job is not None and not errors
    pairing.cancel_download()
    qtbot.waitUntil(lambda: pairing.job is None, timeout=15_000)


# 7. Odd links and texts dropped on a slot


@pytest.mark.parametrize("text, reason", [
    ("https://huggingface.co/org/model/blob/main/../../x.gguf", "has “..” or “.” in its path"),
    ("https://huggingface.co/org/model/tree/../x", "has “..” or “.” in its path"),
    ("hf.co/org/m/resolve/./a.gguf", "has “..” or “.” in its path"),
    ("a" * 5000, "the text dropped is 5,000 characters long"),
    ("/" + "a" * 300, "is too long to be a file name on this computer"),
])
def test_dotted_hub_links_and_huge_texts_are_not_a_model_also_on_drag_over(text, reason):
    from app.models.sources import classify, drag_verdict

    with pytest.raises(ModelFileError, match="^Not a model: ") as caught:
        classify(text, "draft")
    assert reason in str(caught.value)
    verdict = drag_verdict(text, "target")
    assert verdict.startswith("Not a model: ") and reason.split(" (")[0][:20] in verdict


# 8. Staging folders left by a killed GGUF import


def _tiny_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "b", "c", "d"])  # a GGUF without a vocabulary is refused before staging
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_killed_imports_staging_folder_is_removed_by_the_next_import_and_a_live_one_kept(tmp_path, monkeypatch):
    import types

    from app.models import gguf_import

    built = []

    def convert(gguf_path, out):  # the conversion itself is tested elsewhere; here, where it is staged
        built.append(out.parent.name)
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setitem(sys.modules, "app.models.transformers_convert",
                        types.SimpleNamespace(gguf_to_hf_folder=convert))
    out = tmp_path / "imports" / "tiny"
    out.mkdir(parents=True)
    dead = out / f".hf-staging-{_dead_pid()}-1700000000-abcd1234"
    (dead / "hf").mkdir(parents=True)
    (dead / "hf" / "model.safetensors").write_bytes(b"\0" * 1024)  # what SIGKILL left mid-write
    live = out / f"{gguf_import.staging_prefix('hf')}other"  # an import running now, in this process
    (live / "hf").mkdir(parents=True)
    reused = out / f".hf-staging-{os.getpid()}-1-abcd"  # this pid, but another process's start time
    reused.mkdir()
    notes = []
    result = gguf_import.import_gguf(_tiny_gguf(tmp_path / "tiny.gguf"), out, mlx_variants=(), progress=notes.append)
    assert not dead.exists() and not reused.exists()
    assert live.is_dir()
    assert (result["hf"] / "config.json").is_file()
    assert built and gguf_import.STAGING.match(built[0])  # staged under a name that says whose it is
    assert any(str(dead) in note and "did not finish" in note for note in notes)


def test_the_self_test_says_which_folder_cannot_be_made(home_under_a_file, capsys):
    import ui.main

    assert ui.main.main(["--self-test"]) == 1
    assert capsys.readouterr().err.startswith("tandem: Tandem cannot create its data folder ")


def test_an_import_killed_with_sigkill_leaves_a_folder_the_next_import_removes(tmp_path, monkeypatch):
    import signal
    import types

    from app.models import gguf_import

    gguf = _tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "imports" / "tiny"
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time, types
def convert(gguf_path, out):  # stands in for the real conversion: writes, then takes its time
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"\\0" * 4096)
    time.sleep(600)
sys.modules["app.models.transformers_convert"] = types.SimpleNamespace(gguf_to_hf_folder=convert)
from app.models.gguf_import import import_gguf
import_gguf({str(gguf)!r}, {str(out)!r}, mlx_variants=())
"""], cwd=Path(__file__).resolve().parent.parent)
    try:
        while not list(out.glob(".hf-*/hf/model.safetensors")):
            assert child.poll() is None, "the importing process ended early"
            threading.Event().wait(0.05)
        left = next(out.glob(".hf-*"))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert left.is_dir()  # SIGKILL: no cleanup ran
    monkeypatch.setitem(sys.modules, "app.models.transformers_convert", types.SimpleNamespace(
        gguf_to_hf_folder=lambda gguf_path, staging: (staging.mkdir(), (staging / "config.json").write_text("{}"))))
    gguf_import.import_gguf(gguf, out, mlx_variants=())
    assert not left.exists()
    assert {p.name for p in out.iterdir()} == {"hf", gguf_import.IMPORT_MARKER}
