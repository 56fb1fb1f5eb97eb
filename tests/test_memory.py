"""The org archive and its SQLite index: exact round trips, escapes, search, rebuilds.

Torn writes and crash safety: tests/test_archive_torn.py, tests/test_archive_crash.py.
"""

from __future__ import annotations

import math
import re
import unicodedata
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from archive_helpers import LOCAL, entry_ends, make_record, orgparse_records, say
from opencortex.events import Thread
from opencortex.memory import (Archive, NewMessage, SearchHit, decode_body, decode_value,
                               encode_body, encode_value, safe_name)
from opencortex.memory.orgformat import LINE_BREAKS, parse_entry, render_entry, render_header
from opencortex.memory.ranking import RankedSearch
from opencortex.memory.records import RESERVED_KEYS

# Fragments that org or orgparse would read as structure, dates, or line breaks.
ORGISH = [
    "*", "* ", "** x", ",", ",,", ",*", ",,#+", " ", "\t", "\n", "\n\n", "\r", "\r\n",
    "#+", "#+TODO: user assistant | DONE", "  #+begin_src hy", "#+end_src", ":PROPERTIES:",
    ":END:", ":end:", ":LOGBOOK:", "::", ":ID: x", "CLOCK: [2020-01-01 Wed 10:00]",
    "CLOCK: [2020-13-01 10:00]", "[2020-02-30 Sun]", "<2020-01-01 Mon 25:99>",
    '- State "DONE" from "TODO" [2020-01-01 Mon 10:00]', "SCHEDULED: <2020-01-01 Wed>",
    "DEADLINE: <2021-99-01>", "%", "%25", "%0A", "%E2%80", "[[link][desc]]", "[[x]]",
    "\x1b[31m", "\x1b]0;title\x07", "\x9b2J", "\x08", "\x1b",
    "\u2028", "\u2029", "\x0c", "\x0b", "\x85", "\x1c", "\x1e", "\x00", "\x7f", "é", "🙂",
    "👩‍👩‍👧", "٢٠٢٠", "[", "<", "]", ">", "-", "State", "\\", '"', "\u3000", "\ufeff",
]
org_text = st.lists(st.one_of(st.sampled_from(ORGISH), st.text(max_size=4)),
                    max_size=24).map("".join)
any_text = st.one_of(st.text(), org_text)
extra_keys = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda key: key not in RESERVED_KEYS)


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


# -- the org text: exact round trips ------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(any_text)
def test_body_round_trips_through_orgparse_and_strict_parser(text):
    record = make_record(text)
    entry = render_entry(record)
    follower = make_record("next")
    document = render_header(LOCAL) + entry + render_entry(follower)
    assert orgparse_records(document, from_text=True) == [record, follower]
    assert parse_entry(entry.encode("utf-8")) == record
    lines, percent = encode_body(text)
    assert decode_body(lines, percent) == text


@settings(max_examples=200, deadline=None)
@given(sender=any_text, chat_id=any_text.filter(bool),
       extra=st.dictionaries(extra_keys, any_text, max_size=3))
def test_property_values_stay_one_line_and_round_trip(sender, chat_id, extra):
    thread = Thread("matrix", chat_id)
    record = make_record("body", thread=thread, sender=sender, extra=extra)
    entry = render_entry(record)
    drawer = entry.split("\n:END:\n", 1)[0].split("\n")
    assert len(drawer) == 2 + 9 + 1 + len(extra)   # heading, :PROPERTIES:, 9 standard, SENDER
    assert orgparse_records(render_header(thread) + entry, from_text=True) == [record]
    assert parse_entry(entry.encode("utf-8")) == record
    assert decode_value(encode_value(sender)) == sender


@settings(max_examples=400, deadline=None)
@given(any_text)
def test_a_value_is_encoded_exactly_where_org_would_misread_it(value):
    """`encode_value` (which leaves plain values alone at once) percent-encodes exactly
    `%`, `[`, `<`, line breaks, control characters and blanks at either end."""
    def needs_encoding(i: int, char: str) -> bool:
        return (char in "%[<" or char in LINE_BREAKS or unicodedata.category(char) == "Cc"
                or (char.isspace() and i in (0, len(value) - 1)))
    expected = "".join("".join(f"%{byte:02X}" for byte in char.encode("utf-8"))
                       if needs_encoding(i, char) else char for i, char in enumerate(value))
    assert encode_value(value) == re.sub(r"(?i):(?=(?:end|properties):)", "%3A", expected)


def test_structure_lines_get_one_more_comma():
    lines, percent = encode_body("* a\n,* b\n#+TITLE: x\n:END:\nplain, text\n")
    assert lines == [",* a", ",,* b", ",#+TITLE: x", ",:END:", "plain, text", ""]
    assert not percent


def test_texts_orgparse_would_mangle_are_percent_encoded():
    lines, percent = encode_body("50% at [2020-02-30 Sun]\r\n")
    assert percent and lines == ["50%25 at %5B2020-02-30 Sun]%0D", ""]
    plain, percent = encode_body("50% of [links](x) stay literal")
    assert not percent and plain == ["50% of [links](x) stay literal"]


def test_entry_layout_matches_the_contract():
    record = make_record("hello", sender="alice", extra={"SKILL": "greeter"})
    lines = render_entry(record).split("\n")
    assert lines[0].startswith("* user [")
    assert lines[1] == ":PROPERTIES:"
    assert f":ID:       {record.id}" in lines
    assert ":EPOCH:    1795312503.123456" in lines
    assert ":PARENT:" in lines and ":SKILL:    greeter" in lines
    assert lines[-3:] == [":END:", "hello", ""]


# -- the archive: append, read back, history ------------------------------------------


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=any_text, sender=st.none() | st.text(max_size=8))
@example(text="nul \x00, cr \r, lone cr\r* x\u2028\n\n", sender="\x00 :END: ")
@example(text="", sender="")
def test_any_text_round_trips_through_the_archive(archive, text, sender):
    thread = Thread("cli", f"hyp-{uuid.uuid4()}")
    first, second = archive.append([say(text, thread, sender=sender),
                                    say(text + "!", thread, role="assistant")])
    assert second.parent == first.id
    assert archive.read_thread(thread) == [first, second]
    assert archive.history(thread) == [first, second]
    assert orgparse_records(archive.thread_file(thread)) == [first, second]


def test_parent_chains_within_a_batch_and_across_calls_per_thread(archive):
    other = Thread("telegram", "42")
    a, b, c = archive.append([say("a"), say("b", other), say("c", role="assistant")])
    assert (a.parent, b.parent, c.parent) == (None, None, a.id)
    (d,) = archive.append([say("d")])
    assert d.parent == c.id
    assert [r.text for r in archive.read_thread(LOCAL)] == ["a", "c", "d"]
    assert archive.threads() == [LOCAL, other]
    assert archive.append([]) == []


def test_one_write_per_thread_puts_a_header_once(archive):
    archive.append([say("one"), say("two")])
    archive.append([say("three")])
    text = archive.thread_file(LOCAL).read_text(encoding="utf-8")
    assert text.count("#+CHAT_ID: local") == 1 and text.count("\n* user ") == 3


def test_timestamps_are_exact_and_default_to_now(archive):
    exact = 1795312503.1234567
    (given_time, now) = archive.append([say("x", timestamp=exact), say("y")])
    assert given_time.timestamp == exact
    assert math.isfinite(now.timestamp) and now.timestamp > 1.7e9
    assert [r.timestamp for r in archive.read_thread(LOCAL)] == [exact, now.timestamp]
    assert [r.timestamp for r in archive.history(LOCAL)] == [exact, now.timestamp]


def test_history_is_the_last_n_oldest_first(archive):
    archive.append([say(f"m{i}") for i in range(30)])
    assert [r.text for r in archive.history(LOCAL, limit=3)] == ["m27", "m28", "m29"]
    assert len(archive.history(LOCAL)) == 20
    assert archive.history(LOCAL, limit=0) == []
    assert archive.history(Thread("cli", "nobody")) == []


def test_odd_chat_ids_get_safe_reversible_files(archive):
    odd = ["a/b", "..", ".hidden", "!room:matrix.org", "x" * 600, "名前 🙂", "C:\\dos", "%41"]
    for chat_id in odd:
        archive.append([say("hi", Thread("matrix", chat_id))])
    names = {archive.thread_file(Thread("matrix", c)).name for c in odd}
    assert len(names) == len(odd)
    for name in names:
        assert "/" not in name and not name.startswith(".") and len(name) <= 200
    assert archive.threads() == sorted(Thread("matrix", c) for c in odd)
    assert safe_name("!room:matrix.org") == "%21room%3Amatrix.org"


def test_listing_threads_reads_each_files_header_once(archive, monkeypatch):
    """Recall with dense embeddings lists the threads after every new chat: each list
    read every file's header (O(chats) opened files per new chat); now only the
    files new since the last list, or replaced by another file."""
    chats = [Thread("telegram", str(n)) for n in range(5)]
    archive.append([say("hi", chat) for chat in chats])
    opened: list[str] = []
    real = Path.open

    def counting(path, *args, **kwargs):
        opened.append(path.name)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(Path, "open", counting)
    assert archive.threads() == chats
    assert len(opened) == 5
    archive.append([say("hi", Thread("telegram", "new"))])
    opened.clear()
    assert archive.threads() == sorted([*chats, Thread("telegram", "new")])
    assert opened == ["new.org"]
    path = archive.thread_file(chats[0])               # replaced by another file
    copy = path.with_name("copy")
    copy.write_bytes(path.read_bytes().replace(b"#+CHAT_ID: 0", b"#+CHAT_ID: zero"))
    copy.replace(path)
    archive.thread_file(chats[1]).unlink()
    opened.clear()
    assert archive.threads() == sorted([Thread("telegram", "zero"), *chats[2:],
                                        Thread("telegram", "new")])
    assert opened == ["0.org"]


def test_a_channel_directory_removed_while_running_is_made_again(archive):
    """A write makes its channel's directory only when opening the file finds none (a
    new channel, or one removed meanwhile), not on every write; a file written from
    empty keeps nothing the index held of a file removed before (it did, whenever the
    new file's size happened to equal the old one's); a thread's file path is
    remembered, and a bad thread is refused every time it is asked for."""
    import shutil
    archive.append([say("first", Thread("signal", "+15550100"))])
    shutil.rmtree(archive.root / "signal")
    [again] = archive.append([say("second", Thread("signal", "+15550100"))])
    assert archive.search("first") == []      # the removed file's messages left the index
    assert archive.thread_records(Thread("signal", "+15550100")) == [again]
    assert archive.thread_file(Thread("signal", "+15550100")) is \
        archive.thread_file(Thread("signal", "+15550100"))
    for _ in range(2):
        with pytest.raises(ValueError, match="archive directory"):
            archive.thread_file(Thread("../etc", "x"))


def test_bad_input_is_refused_with_a_clear_message(archive):
    with pytest.raises(ValidationError, match="UPPER_CASE"):
        say("x", extra={"skill": "a"})
    with pytest.raises(ValidationError, match="reserved"):
        say("x", extra={"PARENT": "a"})
    with pytest.raises(ValidationError, match="surrogate"):
        say("bad \ud800 text")
    with pytest.raises(ValidationError, match="epoch seconds"):
        say("x", timestamp=float("nan"))
    with pytest.raises(ValidationError, match="archive directory"):
        say("x", Thread("../etc", "x"))
    with pytest.raises(ValidationError, match="empty chat id"):
        say("x", Thread("cli", ""))
    with pytest.raises(ValueError, match="limit"):
        archive.history(LOCAL, limit=-1)
    with pytest.raises(ValueError, match=r"Thread\(channel, chat_id\)"):
        archive.history("cli:local")
    with pytest.raises(ValueError, match="surrogate"):
        archive.search("bad \udc80 query")


# Control characters as model text may hold them: ANSI colour and title sequences, C1 CSI.
CONTROL_TEXTS = ["\x1b[31mred\x1b[0m", "bell\x07 nul\x00 del\x7f", "csi \x9b2J c1 \x80\x9f",
                 "backspace a\x08b\tkept tab\nkept newline", "title \x1b]0;x\x07"]


def file_controls(path) -> set[str]:
    """The control characters other than newline and tab in a file's text."""
    return {c for c in path.read_text(encoding="utf-8")
            if unicodedata.category(c) == "Cc" and c not in "\n\t"}


@pytest.mark.parametrize("text", CONTROL_TEXTS)
def test_control_characters_are_stored_escaped_and_read_back_exactly(archive, text):
    thread = Thread("cli", "controls")
    written = archive.append([say(text, thread, sender=text, extra={"NOTE": text}),
                              say(text, thread, role="assistant")])
    path = archive.thread_file(thread)
    assert file_controls(path) == set()
    body = path.read_text(encoding="utf-8")
    assert ":BODY_ENCODING: percent" in body and ("%1B" in body or "%07" in body
                                                   or "%C2%9B" in body or "%08" in body)
    assert archive.read_thread(thread) == archive.history(thread) == written
    assert orgparse_records(path) == written


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(codec="utf-8", categories=["Cc", "Ll", "Zs"]), max_size=40))
def test_any_control_characters_stay_out_of_the_org_text(text):
    record = make_record(text, sender=text, extra={"NOTE": text})
    entry = render_entry(record)
    assert {c for c in entry if unicodedata.category(c) == "Cc"} <= {"\n", "\t"}
    assert parse_entry(entry.encode("utf-8")) == record
    assert orgparse_records(render_header(LOCAL) + entry, from_text=True) == [record]


def test_a_surrogate_is_refused_before_anything_is_written(archive):
    other = Thread("cli", "other")
    bad = NewMessage.model_construct(role="assistant", text="reply \udcff", thread=LOCAL,
                                     sender=None, turn_type="speech", timestamp=None,
                                     extra={}, parent="auto")
    changed = say("fine", other, extra={"NOTE": "fine"})
    changed.extra["NOTE"] = "bad \ud800"
    for turn in ([say("question"), bad], [say("first thread", other), bad], [changed]):
        with pytest.raises(ValueError, match="unpaired surrogate") as caught:
            archive.append(turn)
        assert "reply" not in str(caught.value) and "bad" not in str(caught.value)
        assert not archive.thread_file(LOCAL).exists()
        assert not archive.thread_file(other).exists()
    assert archive.threads() == [] and archive.search("question") == []


# -- the index -------------------------------------------------------------------------


def test_search_ranks_matches_and_filters_by_thread(archive):
    other = Thread("signal", "+4912345")
    archive.append([say("the quick brown fox"), say("lazy dogs sleep"),
                    say("a fox in another thread", other)])
    hits = archive.search("fox")
    assert {h.text for h in hits} == {"the quick brown fox", "a fox in another thread"}
    assert all(isinstance(h, SearchHit) and "[fox]" in h.snippet for h in hits)
    assert [h.text for h in archive.search("fox", thread=other)] == ["a fox in another thread"]
    assert archive.search("fox", thread=Thread("cli", "nobody")) == []
    best = archive.search("lazy dogs", limit=1)
    assert [h.text for h in best] == ["lazy dogs sleep"]
    assert archive.search("   ") == []


def test_a_search_passing_over_its_best_matches_finds_the_next_best(archive, monkeypatch):
    """Recall leaves out the messages already in the context, and a long context holds
    many of the best matches: the ranked matches are read a few at a time, as far as
    the search goes (no longer all it might have needed), and the next best still
    come, in order."""
    fetched = []
    joined = RankedSearch._joined

    def counted(self, found, count):
        """`_joined`, counting the ranked rows it takes from FOUND."""
        class Counting:
            def fetchmany(self, size):
                rows = found.fetchmany(size)
                fetched.append(len(rows))
                return rows
        return joined(self, Counting(), count)
    monkeypatch.setattr(RankedSearch, "_joined", counted)
    archive.append([say("fox " + " ".join(f"w{n}x{i}" for i in range(n)))
                    for n in range(250)])                 # shorter: better (BM25)
    archive.append([say(f"filler {n}") for n in range(300)])   # fox stays rare enough
    ranked = [hit.id for hit in archive.search("fox", limit=250, snippets=False)]
    assert len(ranked) == 250
    hits = archive.search("fox", limit=5, exclude_ids=set(ranked[:200]), snippets=False)
    assert [hit.id for hit in hits] == ranked[200:205]
    last = archive.search("fox", limit=5, exclude_ids=set(ranked[:248]), snippets=False)
    assert [hit.id for hit in last] == ranked[248:]
    fetched.clear()           # 200 left out, none of them among the best: 5 rows read, not 205
    best = archive.search("fox", limit=5, exclude_ids=set(ranked[50:]), snippets=False)
    assert [hit.id for hit in best] == ranked[:5] and sum(fetched) == 5


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.one_of(st.text(), st.lists(st.sampled_from(
    ['"', "*", "^", ":", "(", ")", "AND", "OR", "NOT", "NEAR(", "thread:", "text:", "-", "+",
     "{", "}", "\x00", "fox", " "]), max_size=12).map("".join)))
def test_search_never_fails_on_user_text(archive, query):
    if not archive.history(LOCAL, limit=1):
        archive.append([say("fox AND (dogs) NEAR thread:x \"quoted\" * ^")])
    for thread in (None, LOCAL):
        assert isinstance(archive.search(query, thread=thread), list)


def test_reindex_rebuilds_everything_from_the_org_files(archive):
    archive.append([say("alpha"), say("beta", Thread("emacs", "main"))])
    assert archive.reindex() == 2
    assert [r.text for r in archive.history(LOCAL)] == ["alpha"]
    assert [h.text for h in archive.search("beta")] == ["beta"]


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_a_missing_or_corrupt_index_is_rebuilt_on_open(tmp_path, damage):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        written = archive.append([say("remember me"), say("and me")])
    index = root / "index.sqlite"
    for suffix in ("-wal", "-shm"):
        (root / f"index.sqlite{suffix}").unlink(missing_ok=True)
    if damage == "garbage":
        index.write_bytes(b"this is not a database" * 100)
    else:
        index.unlink()
    with Archive(root) as reopened:
        assert reopened.history(LOCAL) == written
        assert [h.id for h in reopened.search("remember")] == [written[0].id]


def test_opening_indexes_entries_another_process_wrote_but_did_not_index(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        (first,) = archive.append([say("indexed")])
        path = archive.thread_file(LOCAL)
    unindexed = make_record("written, then the writer died", parent=first.id)
    with path.open("ab") as stream:
        stream.write(render_entry(unindexed).encode("utf-8"))
    with Archive(root) as reopened:
        assert reopened.history(LOCAL) == [first, unindexed]
        assert [h.id for h in reopened.search("writer")] == [unindexed.id]


def test_opening_notices_a_file_cut_short_by_hand(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        (first,) = archive.append([say("stays")])
        archive.append([say("removed by hand")])
        path = archive.thread_file(LOCAL)
        keep = entry_ends(archive, LOCAL)[0]
    path.write_bytes(path.read_bytes()[:keep])
    with Archive(root) as reopened:
        assert reopened.history(LOCAL) == [first]
        assert reopened.search("removed") == []
