"""Every field read from a data file is checked where it is read (issue 34, class 1): pairs.json's
entries, a chat's settings, and the history's rows. A value of the wrong type or range, one per
example, never raises; the good entries survive it; a bad one is skipped (or that part shown as
unreadable) and reported once, in a sentence naming the file and the field. Plus the history's
format (a table unlike its recorded version, a negative version), the alignment card over a
string agreement, a plain model named as an aligned head, and one real window started over a
damaged pairs.json and a damaged history row."""

from __future__ import annotations

import atexit
import json
import math
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

from app.chat.history import HistoryStore
from app.chat.settings import MAX_COUNT, MAX_DRAFT_TOKENS, ChatSettings
from app.draft_choice import PROMPT_LOOKUP, REQUEST_CHOICES, DraftChoice
from app.models.pair_memory import PairMemory, TrialResult, alignment_key

# Examples make their folders under one per process (hypothesis runs many examples in one test, so
# no per-test tmp_path), removed when it ends (every xdist worker imports this file, whichever
# runs it): runs once left thousands of them in /tmp.
_SCRATCH = Path(tempfile.mkdtemp(prefix="tandem-fields-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)


# The autouse per-test TANDEM_HOME is a function-scoped fixture; each example makes its own folder.
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# What JSON can hold in a field, in the wrong places: numbers (huge ones, NaN and Infinity, which
# Python's json reads and writes), text, lists, objects, null and booleans.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.sampled_from([10**400, -(2**63), 2**63])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
# What an SQLite column can hold, whatever its declared type: JSON's values as text (valid JSON of
# any type), text that is not JSON, numbers, blobs and NULL.
SQL_VALUES = (st.none() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20)
              | st.binary(max_size=12) | JSON_VALUES.map(json.dumps)
              | st.sampled_from(["{not json", "[[[[", '{"a": }', "", "NaN", "\x00"]))


def _said_once(notice: str | None, *words: str) -> None:
    """The notice is one sentence (or a few) naming each of `words` (the file, the field)."""
    assert notice, "nothing was said"
    for word in words:
        assert word in notice, f"{word!r} not named in: {notice}"


# pairs.json

GOOD_RECENT = {"backend": "torch", "target": "/models/a", "draft": "ngram", "title": "a + prompt lookup"}
GOOD_TRIAL = {"acceptance": 0.5, "speedup": 1.5, "tokens_per_pass": 2.0, "tokens": 96, "measured_at": 1.0}
GOOD_ALIGNMENT = {"aligned": "/models/a-draft", "original": "ngram", "before": GOOD_TRIAL, "after": GOOD_TRIAL,
                  "agreement": [0.1, 0.5], "active": True}


def _memory(content: dict) -> PairMemory:
    folder = Path(tempfile.mkdtemp(prefix="pairs-", dir=_SCRATCH))
    path = folder / "pairs.json"
    path.write_text(json.dumps(content), encoding="utf-8")  # NaN and Infinity as Python's json writes them
    return PairMemory(path)


def _assert_reported(memory: PairMemory, skipped: bool, section: str, field: str | None = None) -> None:
    if not skipped:
        assert memory.notice is None, memory.notice
        return
    assert len(memory.skipped) == 1, memory.skipped  # the bad entry once; the good one not at all
    _said_once(memory.notice, "pairs.json", section, *([field] if field else []))


@FAST
@given(field=st.sampled_from(["backend", "target", "draft", "title"]), value=JSON_VALUES)
def test_a_recent_pair_with_a_wrong_field_is_skipped_and_named(field, value):
    memory = _memory({"recent": [{**GOOD_RECENT, field: value}, GOOD_RECENT]})
    pairs = memory.recent_pairs()  # what the slot menus read: titles, names, drafts typed
    targets = [entry["target"] for entry in memory.recent()]
    assert targets[-1] == "/models/a" and all(isinstance(entry["title"], str) for entry in pairs)
    _assert_reported(memory, len(targets) == 1, "recent", None if field == "title" else field)


@FAST
@given(field=st.sampled_from(sorted(GOOD_TRIAL) + ["low", "high"]), value=JSON_VALUES)
def test_a_trial_with_a_wrong_field_is_skipped_and_named(field, value):
    memory = _memory({"trials": {"torch|/models/a|ngram": {**GOOD_TRIAL, field: value},
                                 "torch|/models/b|ngram": GOOD_TRIAL}})
    found = memory.trial("torch", "/models/a", PROMPT_LOOKUP)
    assert found is None or all(isinstance(v, (int, float)) and math.isfinite(v) for v in found.range())
    assert memory.trial("torch", "/models/b", PROMPT_LOOKUP) == TrialResult(**GOOD_TRIAL)
    _assert_reported(memory, found is None, "trials", "/models/a")


@FAST
@given(value=JSON_VALUES)
def test_a_context_of_a_wrong_type_or_size_is_skipped_and_named(value):
    memory = _memory({"contexts": {"/models/a": value, "/models/b": 4096}})
    found = memory.context("/models/a")
    assert found is None or (type(found) is int and 256 <= found < 2**31)
    assert memory.context("/models/b") == 4096
    _assert_reported(memory, found is None, "contexts", "/models/a")


@FAST
@given(field=st.sampled_from(sorted(GOOD_ALIGNMENT)), value=JSON_VALUES)
def test_an_alignment_with_a_wrong_field_never_stops_a_load_or_the_card(field, value):
    from app.models.pair_memory import aligned_draft
    from ui.pairing.align_card import card_title

    memory = _memory({"alignments": {"torch|/models/a": {**GOOD_ALIGNMENT, field: value},
                                     "torch|/models/b": GOOD_ALIGNMENT}})
    found = memory.alignment("torch", "/models/a")  # what "auto" reads as a pair loads
    aligned_draft("torch", "/models/a", memory)
    if found is not None:
        card_title(found["agreement"], found["before"], found["after"])  # what the card shows
        assert isinstance(found["active"], bool) and isinstance(found["aligned"], DraftChoice)
        assert len(found["agreement"]) in (0, 2) and all(0 <= a <= 1 for a in found["agreement"])
    assert memory.alignment("torch", "/models/b")["agreement"] == [0.1, 0.5]
    if memory.skipped:
        _said_once(memory.notice, "pairs.json", "alignments", "/models/a", field)
        assert len(memory.skipped) == 1
    else:
        assert found is not None and memory.notice is None


@FAST
@given(section=st.sampled_from(["recent", "trials", "contexts", "alignments"]), value=JSON_VALUES)
def test_a_section_of_the_wrong_type_is_skipped_and_the_others_kept(section, value):
    kinds = {"recent": list, "trials": dict, "contexts": dict, "alignments": dict}
    good = {"recent": [GOOD_RECENT], "trials": {"torch|/models/a|ngram": GOOD_TRIAL},
            "contexts": {"/models/a": 4096}, "alignments": {"torch|/models/a": GOOD_ALIGNMENT}}
    assume(value is not None and not isinstance(value, kinds[section]))
    memory = _memory({**good, section: value})
    assert (memory.recent() != []) == (section != "recent")
    assert (memory.context("/models/a") == 4096) == (section != "contexts")
    assert (memory.trial("torch", "/models/a", PROMPT_LOOKUP) is not None) == (section != "trials")
    assert (memory.alignment("torch", "/models/a") is not None) == (section != "alignments")
    _assert_reported(memory, True, section)


def test_the_alignment_card_renders_an_agreement_given_as_text(qapp, tmp_path):
    """A string agreement once raised in the card ("ab" formatted as a percentage)."""
    from ui.pairing.align import DraftAligner
    from ui.pairing.align_card import card_title

    path = tmp_path / "pairs.json"
    path.write_text(json.dumps({"alignments": {"torch|/models/a": {**GOOD_ALIGNMENT, "agreement": "ab"}}}))
    memory = PairMemory(path)
    found = memory.alignment("torch", "/models/a")
    assert found["agreement"] == [] and found["aligned"] == DraftChoice.model("/models/a-draft")
    _said_once(memory.notice, str(path), "agreement", "/models/a")
    strip = DraftAligner.build_strip()
    for agreement in ("ab", found["agreement"], ["x", "y"], [math.nan, 0.5], 7, {"a": 1}):
        strip.show_card(card_title(agreement, found["before"], found["after"]), "note", True)
        assert strip.card_title.text().startswith("Aligned draft") and "agrees" not in strip.card_title.text()
    strip.show_card(card_title([0.1, 0.5], None, None), "", None)
    assert strip.card_title.text() == "Aligned draft — agrees 10% → 50%"


def test_a_plain_model_named_as_the_aligned_head_is_refused_in_words_and_auto_keeps_its_draft(tmp_path):
    """pairs.json naming a plain model as the demo's aligned head: the demo never loaded, and the
    banner said nothing of pairs.json. Now "auto" drafts as it would without the entry."""
    from app.models.demo import demo_draft
    from app.paths import data_dir
    from app.runner import auto_draft

    plain = tmp_path / "plain-model"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    expected = demo_draft("demo", "torch")
    path = data_dir() / "pairs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"alignments": {alignment_key("torch", "demo"): {
        **GOOD_ALIGNMENT, "aligned": f"head:{plain}", "before": None, "after": None}}}))
    assert auto_draft("demo", "torch") == expected  # the default draft: the demo loads as without the entry
    memory = PairMemory()
    assert memory.alignment("torch", "demo") is None
    _said_once(memory.notice, "pairs.json", "aligned", str(plain), "not an aligned draft head")


# A chat's settings (the history keeps them per chat, as JSON)

SETTING_FIELDS = ["temperature", "top_p", "top_k", "max_tokens", "draft_tokens", "drafter", "thinking", "trees"]


@FAST
@given(field=st.sampled_from(SETTING_FIELDS), value=JSON_VALUES)
def test_a_chat_setting_of_a_wrong_type_falls_back_to_its_default_and_is_named(field, value):
    base = ChatSettings(temperature=0.3)
    read, refused = ChatSettings.read({field: value, "unknown": [1]}, base)
    # what the settings drawer's spin boxes and menus take, whatever the file held
    assert type(read.max_tokens) is int and 1 <= read.max_tokens <= MAX_COUNT
    assert read.draft_tokens is None or type(read.draft_tokens) is int and 1 <= read.draft_tokens <= MAX_DRAFT_TOKENS
    assert type(read.top_k) is int and 0 <= read.top_k <= MAX_COUNT
    assert all(type(v) in (int, float) and math.isfinite(v) for v in (read.temperature, read.top_p))
    assert type(read.thinking) is bool and read.drafter in REQUEST_CHOICES
    assert read.trees in ("auto", "on", "off")  # the drawer's list has no other item
    assert refused in ([], [field])
    if refused:
        assert getattr(read, field) == getattr(base, field)
    if not isinstance(value, dict):
        assert ChatSettings.read(value, base) == (base, [])  # not an object: nothing of it is read


# The history's rows

# column -> whether it is NOT NULL (SQLite refuses NULL there, even with checks off)
CONVERSATION_COLUMNS = {"title": True, "system_prompt": True, "settings": True, "created": True, "updated": True}
MESSAGE_COLUMNS = {"role": True, "content": True, "status": True, "settings": False, "stats": False, "trace": False,
                   "created": True, "position": True, "version": True, "thinking": True}
VERSION_COLUMNS = {"number": True, "content": True, "status": True, "settings": False, "stats": False,
                   "trace": False, "created": True, "thinking": True}
STATS = {"tokens": 12, "tokens_per_s": 30.5, "drafted": 8, "acceptance": 0.75, "reused_tokens": 4,
         "prefill_s": 0.1, "prompt_tokens": 20, "finish_reason": "stop"}


def _history() -> tuple[Path, int, int]:
    """A history with two chats of one turn each: (path, the chat to damage, the chat to keep)."""
    path = Path(tempfile.mkdtemp(prefix="history-", dir=_SCRATCH)) / "history.sqlite3"
    with HistoryStore.open(path) as store:
        chats = []
        for name in ("damaged", "kept"):
            conv = store.create_conversation(name, "be brief", {"temperature": 0.2})
            store.add_turn(conv.id, f"{name}?", f"{name}!", settings={"temperature": 0.2}, stats=STATS,
                           trace={"version": 3, "baseline": None, "rounds": []})
            chats.append(conv.id)
    return path, *chats


def _damage(path: Path, sql: str, value) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA ignore_check_constraints = ON")  # a role or status no CHECK would let in
    try:
        db.execute(sql, (value,))
        db.commit()
    except sqlite3.IntegrityError:  # a position taken already: the unique index keeps that out of any file
        reject()
    finally:
        db.close()


def _read_all(store: HistoryStore, conv_id: int) -> None:
    """Everything the window reads of a chat, as it reads it: no field may raise on the way."""
    from app.chat.trace import TurnTrace
    from ui.chat.message_widget import stats_line
    from ui.panel.race_dialog import race_notice

    assert all(c.id != conv_id for c in store.list_conversations("no such words"))  # a search reads every row
    for conversation in store.list_conversations():
        assert isinstance(conversation.title, str) and isinstance(conversation.system_prompt, str)
        assert isinstance(conversation.settings, dict) and isinstance(conversation.updated, float)
        ChatSettings.read(conversation.settings)
    conversation = store.get_conversation(conv_id)
    assert ChatSettings.read(conversation.settings)[1] == []  # what was refused is left out, and said
    for message in store.messages(conv_id):
        assert message.role in ("user", "assistant") and isinstance(message.content, str)
        assert isinstance(message.thinking, str) and isinstance(message.created, float)
        assert message.settings is None or isinstance(message.settings, dict)
        if message.stats:
            stats_line(message.stats)
            if "race" in message.stats:
                race_notice(message.stats["race"])
        TurnTrace.from_dict(message.trace)
        for version in store.versions(message.id):
            assert isinstance(version.content, str) and isinstance(version.status, str)
            if version.stats:
                stats_line(version.stats)
            TurnTrace.from_dict(version.trace)


def _check_after_damage(path: Path, damaged: int, kept: int, column: str) -> None:
    with HistoryStore.open(path) as store:
        _read_all(store, kept)
        try:
            _read_all(store, damaged)
        except Exception as exc:  # only the one way a chat may be unopenable: the controller's HistoryError
            from app.chat.history import HistoryError

            assert isinstance(exc, HistoryError), repr(exc)
        assert [m.content for m in store.messages(kept)] == ["kept?", "kept!"]  # the good chat, whole
        assert store.get_conversation(kept).settings == {"temperature": 0.2}
        sentence = store.unreadable.sentence()
        if sentence is not None:  # the file, and the field in its own words
            _said_once(sentence, str(path))
            assert any(word in sentence for word in (column, "setting", "figure", "a message", "a version")), sentence
        told = []
        store.unreadable.listen(told.append)  # told once: reading the same rows again says nothing new
        _read_all(store, kept)
        try:
            _read_all(store, damaged)
        except Exception:
            pass
        assert len(told) == (1 if sentence else 0)
        store.add_turn(kept, "still writable?", "yes")  # the file stays in use


@FAST
@given(column=st.sampled_from(sorted(CONVERSATION_COLUMNS)), value=SQL_VALUES)
def test_a_chat_row_with_a_field_of_the_wrong_type_opens(column, value):
    assume(value is not None or not CONVERSATION_COLUMNS[column])
    path, damaged, kept = _history()
    _damage(path, f"UPDATE conversations SET {column} = ? WHERE id = {damaged}", value)
    _check_after_damage(path, damaged, kept, column)


@FAST
@given(column=st.sampled_from(sorted(MESSAGE_COLUMNS)), value=SQL_VALUES)
def test_a_message_row_with_a_field_of_the_wrong_type_opens(column, value):
    assume(value is not None or not MESSAGE_COLUMNS[column])
    path, damaged, kept = _history()
    _damage(path, f"UPDATE messages SET {column} = ? WHERE conversation_id = {damaged} AND role = 'assistant'",
            value)
    _check_after_damage(path, damaged, kept, column)


@FAST
@given(column=st.sampled_from(sorted(VERSION_COLUMNS)), value=SQL_VALUES)
def test_an_answer_version_with_a_field_of_the_wrong_type_opens(column, value):
    assume(value is not None or not VERSION_COLUMNS[column])
    path, damaged, kept = _history()
    _damage(path, f"UPDATE answer_versions SET {column} = ? WHERE message_id IN "
                  f"(SELECT id FROM messages WHERE conversation_id = {damaged})", value)
    _check_after_damage(path, damaged, kept, column)


@FAST
@given(field=st.sampled_from(sorted(STATS) + ["error", "race"]), value=JSON_VALUES,
       where=st.sampled_from(["stats", "settings"]))
def test_an_answers_stats_or_settings_with_a_wrong_figure_open_without_it(field, value, where):
    """Valid JSON objects whose fields are of the wrong type: the figure is left out, and named."""
    path, damaged, kept = _history()
    stored = {**STATS, field: value} if where == "stats" else {field: value}
    text = json.dumps(stored)
    _damage(path, f"UPDATE messages SET {where} = ? WHERE conversation_id = {damaged} AND role = 'assistant'", text)
    _check_after_damage(path, damaged, kept, where)
    with HistoryStore.open(path) as store:
        answer = store.messages(damaged)[1]
        if where == "stats" and field in answer.stats:
            assert json.dumps(answer.stats[field]) == json.dumps(value)  # kept as it was
        elif where == "stats":
            _said_once(store.unreadable.sentence(), str(path), f"the figure “{field}”", f"chat {damaged}")


@FAST
@given(field=st.sampled_from(SETTING_FIELDS), value=JSON_VALUES)
def test_a_chats_setting_of_the_wrong_type_is_named_and_the_chat_opens(field, value):
    path, damaged, kept = _history()
    _damage(path, f"UPDATE conversations SET settings = ? WHERE id = {damaged}", json.dumps({field: value}))
    with HistoryStore.open(path) as store:
        conversation = store.get_conversation(damaged)
        _read_all(store, damaged)
        if field not in conversation.settings:
            _said_once(store.unreadable.sentence(), str(path), f"the setting “{field}”", f"chat {damaged}")
        else:
            assert store.unreadable.sentence() is None


@pytest.mark.parametrize("damage", [
    {"chip_p": "high"}, {"chip_q": [1]}, {"chip_p": 10**400}, {"at": 10**400}, {"index": math.inf},
    {"baseline": {"samples": [0.01], "context": math.inf}}, {"baseline": {"samples": [10**400]}},
    {"baseline": 10**400}], ids=str)
def test_an_answers_trace_with_a_figure_of_the_wrong_type_reads_as_none(damage):
    """The panel draws the trace and prints a chip's p and q: a stored string or 1e400 there raised
    (in the tooltip, or at once as an OverflowError). Such a trace reads as none, as an old answer's."""
    from app.chat.trace import TurnTrace

    chip = [5, "a", "accepted", damage.get("chip_p", 0.5), damage.get("chip_q", 0.25)]
    stored = {"version": 3, "baseline": damage.get("baseline", {"samples": [0.01], "context": 10, "tokens": 1}),
              "rounds": [[damage.get("index", 1), 4, "lookup", "a", 0, damage.get("at", 0.5), 0.1, 0.1, [chip],
                          False]]}
    text = json.dumps(stored)  # as the history holds it: Infinity and 10**400 are JSON Python reads back
    trace = TurnTrace.from_dict(json.loads(text))
    if "baseline" in damage:
        assert trace is not None and trace.baseline is None and trace.figures().speedup is None
    else:
        assert trace is None
    good = TurnTrace.from_dict({**stored, "baseline": None, "rounds": [[1, 4, "lookup", "a", 0, 0.5, 0.1, 0.1,
                                                                        [[5, "a", "accepted", 0.5, 0.25]], False]]})
    assert good is not None and good.rounds[0].chips[0].p == 0.5


# The history's format: its recorded version and its tables' columns


def _rows(path: Path, sql: str) -> list:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def test_a_table_missing_a_column_of_its_version_is_set_aside_in_words(tmp_path):
    path, damaged, kept = _history()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE messages DROP COLUMN thinking")
    db.close()
    with HistoryStore.open(path) as store:
        assert store.list_conversations() == []
        store.add_turn(store.create_conversation().id, "a fresh history?", "yes")
        message = store.recovery_message
    _said_once(message, str(path), "messages", "thinking", "moved to", "Nothing was deleted")
    (aside,) = path.parent.glob("history.sqlite3.corrupt-*[0-9]")
    assert len(_rows(aside, "SELECT * FROM conversations")) == 2  # the old chats, kept as they were


def test_a_table_with_an_extra_column_opens_as_it_is(tmp_path):
    path, damaged, kept = _history()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE messages ADD COLUMN pinned INTEGER")
    db.close()
    with HistoryStore.open(path) as store:
        assert store.recovery_message is None
        assert [m.content for m in store.messages(kept)] == ["kept?", "kept!"]
        store.add_turn(kept, "and another?", "yes")
        assert store.unreadable.sentence() is None


@pytest.mark.parametrize("version", [-1, -(2**31)])
def test_a_negative_version_is_set_aside_and_no_migration_runs_again(version, tmp_path):
    """It once ran the last migration again: "duplicate column name: thinking"."""
    path, damaged, kept = _history()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {version}")
    db.close()
    with HistoryStore.open(path) as store:
        assert store.list_conversations() == []
        store.add_turn(store.create_conversation().id, "works?", "yes")
        message = store.recovery_message
    _said_once(message, str(path), f"format {version}", "moved to")
    assert "duplicate column" not in message
    (aside,) = path.parent.glob("history.sqlite3.corrupt-*[0-9]")
    assert _rows(aside, "PRAGMA user_version") == [(version,)]  # as it was: no migration touched it
    assert len(_rows(aside, "SELECT * FROM messages")) == 4


# One real window over both


def test_the_window_starts_over_a_damaged_pairs_json_and_a_damaged_history_row(qtbot, tmp_path):
    """Each once stopped every start: an alignment whose agreement is a number stopped the load
    ("'int' object is not iterable"), an answer whose stats are not JSON aborted the window. The
    target is a folder that is not there, as in tests/test_robust_files.py: no weights load here,
    and its load reads the alignment first (app/runner.auto_draft), so the message it ends with
    says whether the alignment stopped it."""
    from PySide6.QtCore import QSettings

    from app.paths import data_dir
    from ui.main_window import MainWindow

    target = str(tmp_path / "no-model")
    pairs = data_dir() / "pairs.json"
    pairs.parent.mkdir(parents=True, exist_ok=True)
    pairs.write_text(json.dumps({"recent": [GOOD_RECENT], "alignments": {alignment_key("torch", target): {
        **GOOD_ALIGNMENT, "aligned": "ngram", "original": "none", "agreement": 5}}}))
    history = tmp_path / "history.sqlite3"
    with HistoryStore.open(history) as store:
        conv = store.create_conversation("damaged", "", {"max_tokens": 10**30})
        store.add_turn(conv.id, "q", "a", stats=STATS)
    _damage(history, f"UPDATE messages SET stats = ? WHERE conversation_id = {conv.id}", "{not json")
    (tmp_path / "Tandem.conf").write_text(f"[chat]\nlast_conversation={conv.id}\n")
    window = MainWindow(model=target, backend="torch", history_path=history,
                        settings=QSettings(str(tmp_path / "Tandem.conf"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.banners.get("pairing") is not None, timeout=60_000)
    failed = window.banners.get("pairing").label.text()
    assert "no-model" in failed and "iterable" not in failed  # the folder stopped it, not pairs.json
    assert window.controller.current is not None and window.controller.current.id == conv.id
    assert [w.role for w in window.chat_view.messages()] == ["user", "assistant"]
    assert window.settings_drawer.max_tokens.value() == ChatSettings().max_tokens
    _said_once(window.banners.get("pairs").label.text(), "pairs.json", "agreement")
    _said_once(window.banners.get("history-rows").label.text(), str(history), "stats", "max_tokens")
