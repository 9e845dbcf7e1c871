"""A model on a server as the window's target: the Target slot's dialog lists the server's models
(and says what is wrong with an address), a server's address dropped on the Target slot opens it,
the chat answers from the server with its rounds in the side panel, and the header says where the
model runs. The server is another Tandem serving from this process (tests/test_remote_tandem.py
runs one as a process of its own)."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from app.draft_choice import NO_DRAFT  # noqa: E402
from app.server.openai_api import model_id  # noqa: E402
from tests.test_pairing_window import banner_count, drop_on, wait_banner  # noqa: E402
from tests.test_window import LOAD_TIMEOUT_MS, Session, greedy_answer, make_window, wait_until  # noqa: E402


@pytest.fixture(scope="module")
def remote_session(qapp, tiny_pair, tmp_path_factory):
    session = Session(None, tmp_path_factory.mktemp("remote"))
    session.window = make_window(session, str(tiny_pair["target"]), draft=NO_DRAFT)
    wait_until(session.window.composer.can_send, LOAD_TIMEOUT_MS)
    yield session
    session.window.close()


def _listed(dialog, address: str) -> str:
    dialog.address.setText(address)
    before = dialog.state.text()
    dialog.connect_button.click()
    wait_until(lambda: dialog.connect_button.isEnabled() and dialog.state.text() != before, 30_000)
    return dialog.state.text()


def test_the_server_dialog_lists_the_models_and_says_what_is_wrong(remote_session, api_server, service):
    from ui.pairing.remote_dialog import RemoteDialog

    dialog = RemoteDialog(remote_session.window)
    assert "starts with http" in _listed(dialog, "gpu-box:8000")
    assert not dialog.use.isEnabled()
    dead = api_server.url.rsplit(":", 1)[0] + ":1"
    assert "Nothing is listening" in _listed(dialog, dead)
    assert _listed(dialog, api_server.url.removesuffix("/v1")) == "1 model on Tandem"
    assert dialog.use.isEnabled() and dialog.models.currentData() == model_id(service)
    choice = dialog.choice()
    assert (choice.address, choice.model, choice.key) == (api_server.url, model_id(service), None)
    dialog.close()


def test_a_servers_address_dropped_on_the_target_slot_answers_with_its_rounds(remote_session, api_server, service,
                                                                              tmp_path):
    from ui.pairing.remote_dialog import RemoteChoice

    window = remote_session.window
    asked = []

    def ask(address):
        asked.append(address)
        return RemoteChoice(address, model_id(service))

    window.pairing.ask_remote = ask
    before = banner_count(window)
    drop_on(window.header.draft_slot, [api_server.url])  # the draft slot is not where a server goes
    assert "goes on the Target slot" in wait_banner(window, before)
    drop_on(window.header.target_slot, [api_server.url])
    assert asked == [api_server.url]
    wait_until(lambda: window.controller.model is not None and window.controller.model.remote, LOAD_TIMEOUT_MS)
    info = window.controller.model
    assert info.remote_model == model_id(service) and info.backend == "remote"
    header = window.header.target_slot._shown[1]  # the whole line (the label may elide it)
    assert "Tandem" in header and api_server.url.removesuffix("/v1") in header
    draft = window.header.draft_slot._shown
    assert draft[0] == "the server's own" and "Tandem speculates as it was started" in draft[1]

    stats = greedy_answer(window, "tell me about the sea and the sea", max_tokens=16)
    assert stats.tokens == 16 and stats.drafted > 0  # the server drafted, k=4 asked
    trace = window.draft_panel.trace
    assert trace is not None and trace.figures().drafted == stats.drafted  # every round shown
    assert trace.baseline is not None  # the server timed its target alone, asked for from here
    window.resize(1400, 900)
    assert window.grab().save(str(tmp_path / "remote-window.png"))  # a window that renders (looked at by hand)


def test_a_race_on_another_tandem_runs_its_target_alone_and_its_speculation_there(remote_session, api_server,
                                                                                 service):
    from ui.pairing.remote_dialog import RemoteChoice

    window = remote_session.window
    if window.controller.model is None or not window.controller.model.remote:
        window.pairing.choose_remote(RemoteChoice(api_server.url, model_id(service)))
        wait_until(lambda: window.controller.model is not None and window.controller.model.remote, LOAD_TIMEOUT_MS)
    greedy_answer(window, "tell me about the sea and the sea", max_tokens=16)
    assert window.draft_panel.race_button.isEnabled()
    races = []
    window.worker.race_done.connect(races.append)
    window.start_race()
    wait_until(lambda: bool(races), LOAD_TIMEOUT_MS)
    window.worker.race_done.disconnect(races.append)
    window.race_dialog.close()
    race = races[0]
    assert race.identical  # the server's target alone and its speculation wrote the same text (T=0)
    assert race.alone.stats.drafted == 0 and race.speculative.stats.drafted > 0
