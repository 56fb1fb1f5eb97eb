"""The org archive and its SQLite index: exact round trips, torn writes, search, rebuilds."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import uuid

import orgparse
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opencortex.events import Thread
from opencortex.memory import (Archive, MessageRecord, NewMessage, SearchHit, decode_body,
                               decode_value, encode_body, encode_value, safe_name)
from opencortex.memory.orgformat import (EntryError, complete_length, parse_entry,
                                         render_entry, render_header)
from opencortex.memory.records import RESERVED_KEYS

LOCAL = Thread("cli", "local")

# Fragments that org or orgparse would read as structure, dates, or line breaks.
ORGISH = [
    "*", "* ", "** x", ",", ",,", ",*", ",,#+", " ", "\t", "\n", "\n\n", "\r", "\r\n",
    "#+", "#+TODO: user assistant | DONE", "  #+begin_src hy", "#+end_src", ":PROPERTIES:",
    ":END:", ":end:", ":LOGBOOK:", "::", ":ID: x", "CLOCK: [2020-01-01 Wed 10:00]",
    "CLOCK: [2020-13-01 10:00]", "[2020-02-30 Sun]", "<2020-01-01 Mon 25:99>",
    '- State "DONE" from "TODO" [2020-01-01 Mon 10:00]', "SCHEDULED: <2020-01-01 Wed>",
    "DEADLINE: <2021-99-01>", "%", "%25", "%0A", "%E2%80", "[[link][desc]]", "[[x]]",
    "\u2028", "\u2029", "\x0c", "\x0b", "\x85", "\x1c", "\x1e", "\x00", "\x7f", "é", "🙂",
    "👩‍👩‍👧", "٢٠٢٠", "[", "<", "]", ">", "-", "State", "\\", '"', "\u3000", "\ufeff",
]
org_text = st.lists(st.one_of(st.sampled_from(ORGISH), st.text(max_size=4)),
                    max_size=24).map("".join)
any_text = st.one_of(st.text(), org_text)
extra_keys = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda key: key not in RESERVED_KEYS)


def make_record(text: str = "hi", *, thread: Thread = LOCAL, sender: str | None = None,
                extra: dict[str, str] | None = None, timestamp: float = 1795312503.123456,
                parent: str | None = None) -> MessageRecord:
    return MessageRecord(id=str(uuid.uuid4()), role="user", text=text, channel=thread.channel,
                         chat_id=thread.chat_id, sender=sender, timestamp=timestamp,
                         parent=parent, extra=extra or {})


def orgparse_records(path_or_text, *, from_text: bool = False) -> list[MessageRecord]:
    """Decode every heading of an archive file read with plain orgparse."""
    root = orgparse.loads(path_or_text) if from_text else orgparse.load(path_or_text)
    out = []
    for node in root[1:]:
        props = {key: str(value) for key, value in node.properties.items()}
        body = node.get_body(format="raw").split("\n")
        out.append(MessageRecord(
            id=props["ID"], role=props["ROLE"], channel=props["CHANNEL"],
            chat_id=decode_value(props["CHAT_ID"]),
            text=decode_body(body, props.get("BODY_ENCODING") == "percent"),
            sender=decode_value(props["SENDER"]) if "SENDER" in props else None,
            timestamp=float(props["EPOCH"]), parent=props["PARENT"] or None,
            turn_type=props["TURN_TYPE"],
            extra={k: decode_value(v) for k, v in props.items() if k not in RESERVED_KEYS}))
    return out


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


def say(text: str, thread: Thread = LOCAL, role: str = "user", **fields) -> NewMessage:
    return NewMessage(role=role, text=text, thread=thread, **fields)


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


# -- torn writes -------------------------------------------------------------------------


def entry_ends(archive, thread):
    """Offsets where each complete entry of THREAD's file ends."""
    data = archive.thread_file(thread).read_bytes()
    starts = [i + 1 for i in range(len(data)) if data[i:i + 2] == b"\n*"]
    return starts[1:] + [len(data)]


def torn_files(path):
    return sorted(path.parent.glob(path.name + ".torn-*"))


def test_a_crash_at_any_byte_of_the_last_write_loses_nothing(archive):
    (first,) = archive.append([say("first")])
    path = archive.thread_file(LOCAL)
    before = path.stat().st_size
    later = archive.append([say("line one\n* two\n\nthree 🙂\n", role="assistant"),
                            say("déjà vu [2020-02-30 Sun]\r")])
    full = path.read_bytes()
    ends = entry_ends(archive, LOCAL)
    for cut in range(before, len(full)):
        path.write_bytes(full[:cut])
        complete = [first] + [r for r, end in zip(later, ends[1:]) if end <= cut]
        assert archive.read_thread(LOCAL) == complete
        boundary = max(end for end in [before, *ends] if end <= cut)
        reports = archive.repair()
        assert len(reports) == (cut != boundary)
        assert path.read_bytes() == full[:boundary]
        fragments = torn_files(path)
        assert [f.read_bytes() for f in fragments] == ([full[boundary:cut]] if reports else [])
        for fragment in fragments:
            fragment.unlink()
        assert archive.history(LOCAL) == complete


def test_a_crash_inside_the_first_write_leaves_an_empty_file(archive):
    archive.append([say("only")])
    path = archive.thread_file(LOCAL)
    full = path.read_bytes()
    for cut in range(1, len(full)):
        path.write_bytes(full[:cut])
        assert archive.read_thread(LOCAL) == []
        assert len(archive.repair()) == 1
        assert path.read_bytes() == b"" and torn_files(path)[0].read_bytes() == full[:cut]
        torn_files(path)[0].unlink()
    assert archive.threads() == []
    (again,) = archive.append([say("again")])
    assert archive.read_thread(LOCAL) == [again] and again.parent is None


def test_append_moves_a_torn_tail_aside_before_writing(archive):
    first, second = archive.append([say("keep"), say("torn")])
    path = archive.thread_file(LOCAL)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    (third,) = archive.append([say("after")])
    assert third.parent == first.id
    assert archive.read_thread(LOCAL) == [first, third]
    assert len(torn_files(path)) == 1


def test_opening_repairs_torn_tails(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        (kept,) = archive.append([say("kept")])
        archive.append([say("torn")])
        path = archive.thread_file(LOCAL)
    path.write_bytes(path.read_bytes()[:-10])
    with Archive(root) as reopened:
        assert reopened.read_thread(LOCAL) == [kept]
        assert reopened.history(LOCAL) == [kept]
        assert len(torn_files(path)) == 1


def test_two_processes_appending_to_one_file_keep_a_single_chain(tmp_path):
    root = tmp_path / "memory"
    Archive(root).close()
    script = textwrap.dedent(f"""
        import sys
        from opencortex.events import Thread
        from opencortex.memory import Archive, NewMessage
        with Archive({str(root)!r}) as archive:
            for i in range(25):
                archive.append([NewMessage(role="user", text=f"{{sys.argv[1]}} {{i}}\\nmore",
                                           thread=Thread("cli", "local"))])
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script, name]) for name in "AB"]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    with Archive(root) as archive:
        records = archive.read_thread(LOCAL)
        assert len(records) == 50
        assert [r.parent for r in records] == [None] + [r.id for r in records[:-1]]
        assert archive.history(LOCAL, limit=50) == records
        assert sorted(r.text for r in records) == sorted(
            f"{n} {i}\nmore" for n in "AB" for i in range(25))


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
        first, _ = archive.append([say("stays"), say("removed by hand")])
        path = archive.thread_file(LOCAL)
        keep = entry_ends(archive, LOCAL)[0]
    path.write_bytes(path.read_bytes()[:keep])
    with Archive(root) as reopened:
        assert reopened.history(LOCAL) == [first]
        assert reopened.search("removed") == []


def test_complete_length_of_header_only_and_empty_files():
    header = render_header(LOCAL).encode("utf-8")
    entry = render_entry(make_record("x")).encode("utf-8")
    assert complete_length(b"") == 0
    assert complete_length(header) == 0
    assert complete_length(header + entry) == len(header + entry)
    assert complete_length(header + entry + entry[:-1]) == len(header + entry)
    with pytest.raises(EntryError):
        parse_entry(entry[:-1])
