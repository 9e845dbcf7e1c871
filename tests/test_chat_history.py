"""The SQLite chat history: conversations, turn writes in one transaction, restart, migration,
newer files refused, damaged files moved aside (never deleted), a locked file left alone."""

from __future__ import annotations

import itertools
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.chat import history, history_file
from app.chat.history import HistoryError, HistoryStore
from tests.faults import FailingWrites

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "history.sqlite3"


@pytest.fixture
def store(db_path):
    ticks = itertools.count(1000.0)  # a clock that always moves, so "newest first" is decided
    with HistoryStore.open(db_path, clock=lambda: next(ticks)) as store:
        yield store


def _rows(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _contents(store, conv_id) -> list[tuple[str, str, str]]:
    return [(m.role, m.content, m.status) for m in store.messages(conv_id)]


def _siblings(path: Path) -> list[str]:
    names = (p.name for p in path.parent.iterdir())
    return sorted(name for name in names if name != path.name and not name.endswith(("-wal", "-shm")))


# Conversations


def test_default_path_is_in_the_user_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    assert history.default_path() == tmp_path / "data" / "history.sqlite3"


def test_create_rename_settings_and_delete(store, db_path):
    conv = store.create_conversation(system_prompt="Be brief.", settings={"temperature": 0.7})
    assert (conv.title, conv.system_prompt, conv.settings) == ("New chat", "Be brief.", {"temperature": 0.7})
    store.rename(conv.id, "Trip")
    store.set_system_prompt(conv.id, "Be kind.")
    store.set_settings(conv.id, {"temperature": 0.0, "draft": "ngram"})
    again = store.get_conversation(conv.id)
    assert (again.title, again.system_prompt) == ("Trip", "Be kind.")
    assert again.settings == {"temperature": 0.0, "draft": "ngram"}
    store.add_turn(conv.id, "hi", "hello")
    store.delete_conversation(conv.id)
    assert store.list_conversations() == []
    assert _rows(db_path, "SELECT COUNT(*) FROM messages") == [(0,)]  # the cascade took the messages
    with pytest.raises(HistoryError, match="no conversation"):
        store.get_conversation(conv.id)
    with pytest.raises(HistoryError, match="no conversation"):
        store.rename(conv.id, "gone")


def test_list_newest_activity_first_and_search(store):
    a = store.create_conversation("Paris trip")
    b = store.create_conversation()
    c = store.create_conversation("Recipes")
    store.add_turn(b.id, "How do I compute 100% of a_b?", "Multiply by one.")
    assert [x.id for x in store.list_conversations()] == [b.id, c.id, a.id]
    store.add_turn(a.id, "Où est le MUSÉE?", "Au centre.")
    assert [x.id for x in store.list_conversations()] == [a.id, b.id, c.id]
    assert [x.id for x in store.list_conversations("paris")] == [a.id]  # title, any case
    assert [x.id for x in store.list_conversations("musée")] == [a.id]  # message text, non-ASCII case
    assert [x.id for x in store.list_conversations("MULTIPLY")] == [b.id]  # an answer's text
    assert [x.id for x in store.list_conversations("100%")] == [b.id]  # % and _ are literal
    assert [x.id for x in store.list_conversations("a_b")] == [b.id]
    assert store.list_conversations("a%b") == []
    assert store.list_conversations("nowhere") == []


def test_first_message_names_the_chat(store):
    conv = store.create_conversation()
    store.add_turn(conv.id, "\n  Plan a   week in Lisbon with two kids who love trams and the sea\nmore", "Sure.")
    title = store.get_conversation(conv.id).title
    assert title == "Plan a week in Lisbon with two kids who love trams and the sea"  # whole: the list elides it
    store.add_turn(conv.id, "Second question", "ok")
    assert store.get_conversation(conv.id).title == title
    named = store.create_conversation("Mine")
    store.add_turn(named.id, "hello", "hi")
    assert store.get_conversation(named.id).title == "Mine"


# Turn writes


def test_turns_keep_their_order_and_payloads(store):
    conv = store.create_conversation()
    user, answer = store.add_turn(
        conv.id, "one", "1", "complete", {"temperature": 0}, {"tokens": 3, "acceptance": 0.5}, [[1, 2], [3]]
    )
    assert (user.role, user.position, answer.role, answer.position) == ("user", 0, "assistant", 1)
    store.add_turn(conv.id, "two", "2", "stopped")
    messages = store.messages(conv.id)
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "one", "complete"), ("assistant", "1", "complete"),
        ("user", "two", "complete"), ("assistant", "2", "stopped"),
    ]
    assert [m.position for m in messages] == [0, 1, 2, 3]
    assert (messages[1].settings, messages[1].stats, messages[1].trace) == (
        {"temperature": 0}, {"tokens": 3, "acceptance": 0.5}, [[1, 2], [3]]
    )
    assert messages[3].settings is None and messages[0].stats is None
    assert messages[0].as_chat() == {"role": "user", "content": "one"}
    with pytest.raises(ValueError, match="status"):
        store.add_turn(conv.id, "three", "3", "done")
    assert len(store.messages(conv.id)) == 4


def test_regenerate_keeps_every_version_of_the_last_answer(store):
    conv = store.create_conversation()
    store.add_turn(conv.id, "one", "1")
    _, old = store.add_turn(conv.id, "two", "2", "complete", {"seed": 1}, {"tokens": 1}, {"rounds": [1]})
    assert (old.version, old.versions) == (1, 1)
    new = store.add_answer_version(conv.id)  # Regenerate: a new, empty version is shown
    assert (new.id, new.position, new.version, new.versions) == (old.id, old.position, 2, 2)
    assert (new.content, new.status) == ("", "interrupted")
    done = store.finish_answer(new.id, "two!", "stopped", {"seed": 5}, {"tokens": 2}, {"rounds": [2]}, version=2)
    assert (done.content, done.status, done.settings, done.version) == ("two!", "stopped", {"seed": 5}, 2)
    assert _contents(store, conv.id) == [
        ("user", "one", "complete"), ("assistant", "1", "complete"),
        ("user", "two", "complete"), ("assistant", "two!", "stopped"),
    ]
    first, second = store.versions(old.id)
    assert (first.number, first.content, first.status, first.settings, first.stats, first.trace) == (
        1, "2", "complete", {"seed": 1}, {"tokens": 1}, {"rounds": [1]})
    assert (second.number, second.content, second.status, second.stats, second.trace) == (
        2, "two!", "stopped", {"tokens": 2}, {"rounds": [2]})

    shown = store.show_version(old.id, 1)  # the ‹ arrow: the conversation now reads version 1
    assert (shown.content, shown.status, shown.stats, shown.trace, shown.version, shown.versions) == (
        "2", "complete", {"tokens": 1}, {"rounds": [1]}, 1, 2)
    assert store.messages(conv.id)[-1] == shown
    assert [m.as_chat()["content"] for m in store.messages(conv.id)] == ["one", "1", "two", "2"]
    # Finishing a version that is not on screen keeps the screen's version in the conversation.
    store.finish_answer(old.id, "two!!", "complete", None, None, None, version=2)
    assert store.messages(conv.id)[-1].content == "2" and store.versions(old.id)[1].content == "two!!"
    assert store.list_conversations("two!!")[0].id == conv.id  # search finds every version
    with pytest.raises(HistoryError, match="no version 3"):
        store.show_version(old.id, 3)
    empty = store.create_conversation()
    with pytest.raises(HistoryError, match="does not end with an answer"):
        store.add_answer_version(empty.id)


def test_versions_survive_a_restart_and_go_with_their_turn(db_path):
    with HistoryStore.open(db_path) as store:
        conv = store.create_conversation()
        _, answer = store.add_turn(conv.id, "q", "first")
        store.finish_answer(store.add_answer_version(conv.id).id, "second", "complete", version=2)
        store.show_version(answer.id, 1)
    with HistoryStore.open(db_path) as store:
        last = store.messages(conv.id)[-1]
        assert (last.content, last.version, last.versions) == ("first", 1, 2)
        assert [v.content for v in store.versions(answer.id)] == ["first", "second"]
        store.edit_last_user(conv.id, "q2", "other")  # the edited turn's answer and its versions stay, a branch
        assert [v.content for v in store.versions(store.messages(conv.id)[-1].id)] == ["other"]
        assert [v.content for v in store.versions(answer.id)] == ["first", "second"]


def test_edit_and_resend_shows_the_new_turn_in_its_place(store):
    conv = store.create_conversation()
    store.add_turn(conv.id, "one", "1")
    store.add_turn(conv.id, "two", "2")
    user, answer = store.edit_last_user(conv.id, "TWO", "2!", "stopped")
    assert (user.position, answer.position) == (2, 3)
    assert _contents(store, conv.id) == [
        ("user", "one", "complete"), ("assistant", "1", "complete"),
        ("user", "TWO", "complete"), ("assistant", "2!", "stopped"),
    ]
    assert store.get_conversation(conv.id).title == "one"  # not the first message: the title stays


def test_editing_the_first_message_renames_an_auto_titled_chat_only(store):
    auto = store.create_conversation()
    store.add_turn(auto.id, "Tell me about owls", "Owls...")
    store.edit_last_user(auto.id, "Tell me about cats", "Cats...")
    assert store.get_conversation(auto.id).title == "Tell me about cats"
    assert _contents(store, auto.id) == [
        ("user", "Tell me about cats", "complete"), ("assistant", "Cats...", "complete")
    ]
    chosen = store.create_conversation()
    store.add_turn(chosen.id, "Tell me about owls", "Owls...")
    store.rename(chosen.id, "Birds")
    store.edit_last_user(chosen.id, "Tell me about cats", "Cats...")
    assert store.get_conversation(chosen.id).title == "Birds"


def test_begin_and_finish_an_answer(store):
    conv = store.create_conversation()
    answer_id = store.begin_answer(conv.id, "question")
    assert _contents(store, conv.id) == [("user", "question", "complete"), ("assistant", "", "interrupted")]
    done = store.finish_answer(answer_id, "answer", "complete", {"temperature": 0}, {"tokens_per_s": 41.5}, [1])
    assert (done.content, done.status, done.stats, done.trace) == ("answer", "complete", {"tokens_per_s": 41.5}, [1])
    assert _contents(store, conv.id) == [("user", "question", "complete"), ("assistant", "answer", "complete")]
    with pytest.raises(HistoryError, match="no answer"):
        store.finish_answer(store.messages(conv.id)[0].id, "x", "complete")  # a user message is not an answer


def test_every_turn_write_moves_the_conversation_up(store):
    a, b = store.create_conversation(), store.create_conversation()
    writes = [
        lambda: store.add_turn(a.id, "q", "a"),
        lambda: store.add_answer_version(a.id),
        lambda: store.edit_last_user(a.id, "q2", "a3"),
        lambda: store.begin_answer(a.id, "q3"),
    ]
    for write in writes:
        store.add_turn(b.id, "other", "other")
        assert store.list_conversations()[0].id == b.id
        write()
        assert store.list_conversations()[0].id == a.id


def test_a_failed_write_leaves_nothing_half_written(store, db_path, monkeypatch):
    conv = store.create_conversation()
    store.add_turn(conv.id, "kept", "kept")
    before = store.get_conversation(conv.id)
    real_insert = store._insert_message

    def insert_then_fail(conv_id, position, role, body):
        if role == "assistant":
            raise RuntimeError("disk pulled out after the user's message was inserted")
        return real_insert(conv_id, position, role, body)

    monkeypatch.setattr(store, "_insert_message", insert_then_fail)
    for write in (
        lambda: store.add_turn(conv.id, "lost", "lost"),
        lambda: store.begin_answer(conv.id, "lost"),
        lambda: store.edit_last_user(conv.id, "lost", "lost"),
    ):
        with pytest.raises(RuntimeError, match="disk pulled out"):
            write()
        assert _contents(store, conv.id) == [("user", "kept", "complete"), ("assistant", "kept", "complete")]
        assert store.get_conversation(conv.id) == before  # neither `updated` nor the title moved
    fresh = store.create_conversation()
    with pytest.raises(RuntimeError):
        store.add_turn(fresh.id, "A title from a lost message", "lost")
    assert store.get_conversation(fresh.id).title == "New chat"
    monkeypatch.undo()
    store.add_turn(conv.id, "after", "after")  # the store is still usable
    assert len(store.messages(conv.id)) == 4


# Restarts and crashes


def test_reopening_shows_the_same_history(db_path):
    with HistoryStore.open(db_path) as store:
        conv = store.create_conversation(system_prompt="sys", settings={"k": 4})
        store.add_turn(conv.id, "one", "1", "complete", None, {"tokens": 1}, {"rounds": [[1, 1]]})
        conversations, messages = store.list_conversations(), store.messages(conv.id)
    with HistoryStore.open(db_path) as reopened:
        assert reopened.recovery_message is None
        assert reopened.list_conversations() == conversations
        assert reopened.messages(conv.id) == messages


def test_closing_mid_answer_keeps_the_question_and_an_interrupted_answer(db_path):
    with HistoryStore.open(db_path) as store:
        conv = store.create_conversation()
        store.begin_answer(conv.id, "Will this survive?")
    with HistoryStore.open(db_path) as reopened:
        assert _contents(reopened, conv.id) == [
            ("user", "Will this survive?", "complete"), ("assistant", "", "interrupted")
        ]


def test_a_process_killed_mid_answer_keeps_the_question(db_path):
    script = (
        "import os, sys\n"
        "from app.chat.history import HistoryStore\n"
        "store = HistoryStore.open(sys.argv[1])\n"
        "conv = store.create_conversation()\n"
        "store.begin_answer(conv.id, 'killed while answering')\n"
        "os._exit(9)  # no close, no cleanup: as if the app crashed\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(db_path)], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 9, done.stderr.decode()
    with HistoryStore.open(db_path) as reopened:
        (conv,) = reopened.list_conversations()
        assert conv.title == "killed while answering"
        assert _contents(reopened, conv.id) == [
            ("user", "killed while answering", "complete"), ("assistant", "", "interrupted")
        ]


# Schema versions


def test_a_version_0_file_is_migrated(db_path):
    db_path.write_bytes(b"")  # what sqlite3.connect leaves behind: user_version 0, no tables
    with HistoryStore.open(db_path) as store:
        conv = store.create_conversation()
        store.add_turn(conv.id, "q", "a")
    assert _rows(db_path, "PRAGMA user_version") == [(len(history.MIGRATIONS),)]
    assert _rows(db_path, "PRAGMA journal_mode") == [("wal",)]
    names = {name for (name,) in _rows(db_path, "SELECT name FROM sqlite_master")}
    assert {"conversations", "messages", "messages_in_order"} <= names


def test_only_the_missing_migrations_run_in_one_transaction(db_path, monkeypatch):
    with HistoryStore.open(db_path) as store:
        store.add_turn(store.create_conversation().id, "q", "a")
    ran = []

    def add_pinned(db):
        ran.append("v2")
        db.execute("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    def broken(db):
        db.execute("ALTER TABLE conversations ADD COLUMN archived INTEGER")
        raise sqlite3.OperationalError("a bug in migration 3")

    shipped = len(history.MIGRATIONS)
    monkeypatch.setattr(history, "MIGRATIONS", (*history.MIGRATIONS, add_pinned, broken))
    with pytest.raises(HistoryError, match="migration 3"):
        HistoryStore.open(db_path)
    assert _rows(db_path, "PRAGMA user_version") == [(shipped,)]  # both steps rolled back together
    assert "pinned" not in {row[1] for row in _rows(db_path, "PRAGMA table_info(conversations)")}

    ran.clear()
    monkeypatch.setattr(history, "MIGRATIONS", history.MIGRATIONS[: shipped + 1])
    with HistoryStore.open(db_path) as store:
        assert len(store.messages(store.list_conversations()[0].id)) == 2
    assert ran == ["v2"]
    assert _rows(db_path, "PRAGMA user_version") == [(shipped + 1,)]
    assert _rows(db_path, "SELECT pinned FROM conversations") == [(0,)]


def test_a_newer_file_is_refused_and_left_alone(db_path):
    with HistoryStore.open(db_path) as store:
        store.add_turn(store.create_conversation().id, "q", "a")
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA user_version = 7")
    db.close()
    before = db_path.read_bytes()
    with pytest.raises(HistoryError, match="newer Tandem"):
        HistoryStore.open(db_path)
    assert db_path.read_bytes() == before
    assert _siblings(db_path) == []
    assert _rows(db_path, "SELECT COUNT(*) FROM messages") == [(2,)]


# Damage and locks


def _assert_moved_aside(store, db_path, original: bytes, wal: bytes | None = None):
    (moved,) = _siblings(db_path)
    assert moved.startswith("history.sqlite3.corrupt-")
    moved_path = db_path.parent / moved
    assert moved_path.read_bytes() == original  # exactly as found, nothing written into it
    if wal is not None:
        assert Path(f"{moved_path}-wal").read_bytes() == wal
    message = store.recovery_message
    assert str(db_path) in message and str(moved_path) in message and "Nothing was deleted" in message
    assert store.list_conversations() == []  # a fresh, working history in the old place
    store.add_turn(store.create_conversation().id, "after", "recovery")
    assert len(store.list_conversations()) == 1


def test_a_file_that_is_not_a_database_is_moved_aside(db_path):
    original, wal = os.urandom(8192), os.urandom(4096)
    db_path.write_bytes(original)
    Path(f"{db_path}-wal").write_bytes(wal)
    with HistoryStore.open(db_path) as store:
        _assert_moved_aside(store, db_path, original, wal)


def test_a_damaged_database_is_moved_aside(db_path):
    with HistoryStore.open(db_path) as store:
        for n in range(40):
            store.add_turn(store.create_conversation().id, f"question {n} " * 50, f"answer {n} " * 50)
    good = db_path.read_bytes()
    damaged = good[: len(good) // 2] + os.urandom(4096)  # a torn copy: half a database, then garbage
    db_path.write_bytes(damaged)
    with HistoryStore.open(db_path) as store:
        _assert_moved_aside(store, db_path, damaged)


def test_a_database_that_opens_but_fails_its_check_is_moved_aside(db_path):
    with HistoryStore.open(db_path) as store:
        conversations = [store.create_conversation() for _ in range(30)]
        for conv in conversations:
            store.add_turn(conv.id, "q " * 500, "a " * 500)
        for conv in conversations[5:]:
            store.delete_conversation(conv.id)  # their pages go to the free list
    damaged = bytearray(db_path.read_bytes())
    assert int.from_bytes(damaged[36:40], "big") > 0
    damaged[32:40] = bytes(8)  # forget the free list: quick_check reports pages that belong to nothing
    db_path.write_bytes(bytes(damaged))
    with HistoryStore.open(db_path) as store:
        _assert_moved_aside(store, db_path, bytes(damaged))
        assert "never used" in store.recovery_message and "\n" not in store.recovery_message


def _rollback_journal_db(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE other_program (x)")
    db.commit()
    db.close()


def _wal_history(path: Path) -> None:
    with HistoryStore.open(path) as store:
        store.add_turn(store.create_conversation().id, "q", "a")


@pytest.mark.parametrize("make", [_rollback_journal_db, _wal_history], ids=["rollback-journal", "wal"])
def test_a_locked_database_is_refused_and_left_alone(db_path, make):
    make(db_path)
    before = db_path.read_bytes()
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HistoryError, match="another Tandem may be running"):
            HistoryStore.open(db_path, busy_timeout=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert db_path.read_bytes() == before
    assert _siblings(db_path) == []
    with HistoryStore.open(db_path) as store:  # once the other program lets go, it opens
        assert store.recovery_message is None


def test_a_write_while_another_program_holds_the_lock_says_so(store, db_path):
    conv = store.create_conversation()
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        store._db.execute("PRAGMA busy_timeout = 100")
        with pytest.raises(HistoryError, match="another Tandem may be running"):
            store.add_turn(conv.id, "q", "a")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.messages(conv.id) == []
    store.add_turn(conv.id, "q", "a")
    assert len(store.messages(conv.id)) == 2


def test_a_version_1_file_opens_and_keeps_its_answers_as_first_versions(db_path):
    db = sqlite3.connect(db_path, isolation_level=None)
    history.MIGRATIONS[0](db)  # the format Tandem wrote before answers had versions
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO conversations VALUES (1, 'Old chat', '', '{}', 1.0, 2.0)")
    db.execute("INSERT INTO messages VALUES (1, 1, 0, 'user', 'q', 'complete', NULL, NULL, NULL, 1.0)")
    db.execute("INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'old answer', 'stopped', '{\"seed\": 3}', "
               "'{\"tokens\": 4}', '{\"rounds\": []}', 2.0)")
    db.close()
    with HistoryStore.open(db_path) as store:
        user, answer = store.messages(1)
        assert (user.content, user.versions) == ("q", 0)
        assert (answer.content, answer.status, answer.stats, answer.version, answer.versions) == (
            "old answer", "stopped", {"tokens": 4}, 1, 1)
        (version,) = store.versions(2)
        assert (version.content, version.status, version.settings, version.trace) == (
            "old answer", "stopped", {"seed": 3}, {"rounds": []})
        store.finish_answer(store.add_answer_version(1).id, "new answer", "complete", version=2)
        assert [v.content for v in store.versions(2)] == ["old answer", "new answer"]
    assert _rows(db_path, "PRAGMA user_version") == [(len(history.MIGRATIONS),)]


# Write failures: each one is a HistoryError that says what happened, and the store stays usable


@pytest.mark.parametrize("error, says", [
    ("database or disk is full", "the disk is full"),
    ("attempt to write a readonly database", "the data folder is read-only"),
    ("disk I/O error", "disk I/O error"),
])
def test_a_failed_write_is_a_history_error_that_says_why(store, monkeypatch, error, says):
    conv = store.create_conversation()
    answer_id = store.begin_answer(conv.id, "q")
    monkeypatch.setattr(store, "_db", FailingWrites(store._db, sqlite3.OperationalError(error)))
    with pytest.raises(history.HistoryWriteError, match=says) as caught:
        store.finish_answer(answer_id, "the answer", "complete")
    assert str(store.path) in str(caught.value)
    monkeypatch.undo()
    assert _contents(store, conv.id)[-1] == ("assistant", "", "interrupted")  # nothing half written
    store.finish_answer(answer_id, "the answer", "complete")  # the same write, once it can be done
    assert _contents(store, conv.id)[-1] == ("assistant", "the answer", "complete")


def test_a_full_database_and_a_read_only_one_are_said_so(store):
    conv = store.create_conversation()
    answer_id = store.begin_answer(conv.id, "q")
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own "disk full", for real
    with pytest.raises(history.HistoryWriteError, match="the disk is full"):
        store.finish_answer(answer_id, "long answer " * 5000, "complete")
    store._db.execute("PRAGMA max_page_count = 1073741823")
    store._db.execute("PRAGMA query_only = ON")  # SQLite refuses every write: SQLITE_READONLY
    with pytest.raises(history.HistoryWriteError, match="the data folder is read-only"):
        store.finish_answer(answer_id, "long answer " * 5000, "complete")
    store._db.execute("PRAGMA query_only = OFF")
    assert store.finish_answer(answer_id, "long answer " * 5000, "complete").status == "complete"


def test_a_retry_waits_only_briefly_for_a_lock(store, db_path):
    conv = store.create_conversation()
    answer_id = store.begin_answer(conv.id, "q")
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program writing
    try:
        with store.waiting_at_most(0.01), pytest.raises(history.HistoryWriteError, match="locked"):
            store.finish_answer(answer_id, "a", "complete")
        assert tuple(store._db.execute("PRAGMA busy_timeout").fetchone()) == (int(history.BUSY_TIMEOUT_S * 1000),)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.finish_answer(answer_id, "a", "complete").content == "a"


# Privacy: the history holds every chat, so only its owner may read it


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_the_history_and_its_journal_files_are_private(db_path):
    with HistoryStore.open(db_path) as store:
        store.add_turn(store.create_conversation().id, "a secret", "kept")
        files = [db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")]
        assert all(path.exists() for path in files)
        assert {path.name: oct(path.stat().st_mode & 0o777) for path in files} == {
            path.name: "0o600" for path in files}
    older = db_path.with_name("older.sqlite3")
    sqlite3.connect(older).close()
    older.chmod(0o644)  # written by an earlier Tandem
    with HistoryStore.open(older):
        assert older.stat().st_mode & 0o777 == 0o600


def test_a_history_that_cannot_be_created_says_why(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(HistoryError, match="Could not create the folder"):
        HistoryStore.open(blocker / "data" / "history.sqlite3")
    with pytest.raises(HistoryError, match="Could not create the chat history"):
        history_file.make_private(blocker / "history.sqlite3")  # its folder is a file
