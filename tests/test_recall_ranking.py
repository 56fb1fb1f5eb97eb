"""Recall ranking: per-owner statistics, stemming, dates, neighbours, /recall's reasons,
and the index schema migration (issue 13)."""

from __future__ import annotations

import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta

import pytest

from opencortex.conversation.branches import MERGED_FROM, unique
from opencortex.conversation.recall import Recall
from opencortex.conversation.recalldates import date_hint
from opencortex.events import Thread
from opencortex.memory import Archive
from opencortex.memory import ranking
from opencortex.memory.index import SCHEMA_VERSION
from opencortex.memory.query import query_words
from opencortex.memory.retention import forget

from test_recall import archive, control, say  # noqa: F401  (archive: a fixture)

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")
ALICE = Thread("telegram", "1001")
BOB = Thread("telegram", "1002")
DAY = 86400.0


def test_a_name_frequent_in_the_owners_chats_does_not_crowd_out_the_answer(archive):
    archive.append([say(f"hey Caroline, how are you {i}", CLI) for i in range(40)])
    [answer] = archive.append([say("Caroline: I gave my old bikes to the animal shelter "
                                   "yesterday, it took the whole afternoon", CLI)])
    archive.append([say(f"the shelter is closed today, friend {i}", ALICE) for i in range(200)])
    recall = Recall(archive, {})
    [best, *_] = recall.recall(EMACS, "What did Caroline give the shelter?", k=5)
    assert best.id == answer.id


def test_each_owner_has_its_own_table_and_a_configured_owner_moves_there(archive):
    archive.append([say("walrus notes for the local user", CLI)])
    [mine] = archive.append([say("walrus notes mapped to local", ALICE)])
    archive.append([say("walrus notes of bob", BOB)])
    db = sqlite3.connect(archive.root / "index.sqlite")
    parts = dict(db.execute("SELECT chat_id, part FROM thread_parts"))
    assert parts == {"local": "local", "1001": "telegram:1001", "1002": "telegram:1002"}
    recall = Recall(archive, {"telegram:1001": "local"})
    parts = dict(db.execute("SELECT chat_id, part FROM thread_parts"))
    assert parts["1001"] == "local"
    texts = {e.id for e in recall.recall(CLI, "walrus", k=5)}
    assert mine.id in texts and len(texts) == 2          # bob's never comes
    assert [h.text for h in archive.search("walrus", thread=BOB)] == ["walrus notes of bob"]
    db.close()


# -- who said it -------------------------------------------------------------------


def chat(archive, thread, turns, start=1_700_000_000.0):
    """Archive TURNS, (sender, text) pairs a minute apart; their records."""
    return archive.append([say(text, thread, sender=sender, timestamp=start + 60 * n)
                           for n, (sender, text) in enumerate(turns)])


def test_what_the_person_named_said_comes_before_messages_that_greet_them(archive):
    greetings = [("Melanie", f"Bye Caroline, say hi to the shelter folks {n}")
                 for n in range(30)]
    records = chat(archive, CLI, greetings + [
        ("Caroline", "I gave my old bikes to the shelter this morning"),
        ("Melanie", "the shelter near me is closing, Caroline")])
    answer = records[-2]
    recall = Recall(archive, {})
    [best, *_] = recall.recall(EMACS, "What did Caroline give the shelter?", k=5)
    assert best.id == answer.id
    assert archive.speakers("What did Caroline's friend say?") == ["Caroline"]
    assert archive.speakers("what about the shelter") == []


def test_a_named_person_and_now_bring_their_newest_statement(archive):
    talk = [("Rosa", "Sorry Tobias, was busy with work all week")] * 12
    old, new = "Tobias, I started working as a nurse at Brightwell", \
        "Big news Tobias: I switched jobs, working as a carpenter at Castellan now"
    records = chat(archive, CLI, [("Rosa", old)] + talk + [("Rosa", new)] +
                   [("Tobias", f"Sorry Rosa, was busy with work all week {n}")
                    for n in range(12)])
    recalled = Recall(archive, {}).recall(EMACS, "Where does Rosa work now?", k=3)
    assert recalled[0].id == records[13].id
    texts = [e.text.split("] ", 1)[1] for e in recalled]
    assert len(texts) == len(set(texts))           # the repeated small talk came once


def test_a_named_persons_common_words_are_recalled_when_asked_not_in_a_remark(archive):
    chat(archive, CLI, [("Bob", f"thanks, the trip was fine {n}") for n in range(60)] +
         [("Ann", f"thanks, the trip was great {n}") for n in range(60)])
    recall = Recall(archive, {})
    assert recall.recall(EMACS, "thanks bob the trip", k=3) == []      # says nothing
    asked = recall.recall(EMACS, "what did Bob say about the trip?", k=3)
    assert [e.text.split("] ", 1)[1] for e in asked[:2]] == [
        "thanks, the trip was fine 59", "thanks, the trip was fine 58"]   # his newest


def test_a_question_naming_the_wrong_person_still_finds_what_was_said(archive):
    records = chat(archive, CLI, [("Tobias", f"Rosa, the flea market was busy again {n}")
                                  for n in range(6)] +
                   [("Rosa", "Tobias, I sold my old bikes at the flea market")])
    recalled = Recall(archive, {}).recall(EMACS, "What did Tobias sell at the flea market?",
                                          k=3)
    assert records[-1].id in [e.id for e in recalled]          # third, after two of his


def test_a_sender_word_names_them_only_within_the_owners_scope(archive):
    chat(archive, ALICE, [("Zorro", "the cave map is under the stone")])
    chat(archive, CLI, [("me", "the cave trip was fun"), ("me", "a map of the cave")])
    recall = Recall(archive, {})
    assert archive.speakers("what did Zorro say about the cave", owners={"local"}) == []
    recalled = recall.recall(CLI, "What did Zorro say about the cave map?", k=5)
    assert recalled and all(e.id and "Zorro" not in e.text and "stone" not in e.text
                            for e in recalled)
    assert "people named" not in recall.explain(CLI, "What did Zorro say about the cave map?")
    assert recall.recall(ALICE, "What did Zorro say about the cave?", k=1)[0].text.endswith(
        "the cave map is under the stone")


def test_a_matrix_id_is_named_by_its_localpart_and_explain_says_so(archive):
    chat(archive, CLI, [("@alice:example.org", "my locker code is 4711"),
                        ("@bob:example.org", "alice, what is your locker code again?"),
                        ("@bob:example.org", "my locker code is 1234")])
    recall = Recall(archive, {})
    [best, *_] = recall.recall(EMACS, "what is alice's locker code", k=3)
    assert best.text.endswith("my locker code is 4711")
    text = recall.explain(EMACS, "what is alice's locker code")
    assert "people named: alice (what they said leads)" in text
    assert "user @alice:example.org; matched: locker, code" in text


def test_a_forgotten_thread_names_its_senders_no_more_and_a_moved_one_takes_them(archive):
    chat(archive, EMACS, [("Zorro", "the cave map is under the stone")])
    chat(archive, CLI, [("Dev", "the cave trip was fun")])
    chat(archive, ALICE, [("Ines", "my cave photos are online")])
    assert archive.speakers("Zorro Dev Ines", owners={"local"}) == ["Zorro", "Dev"]
    assert forget(archive, EMACS) == 1
    assert archive.speakers("Zorro Dev Ines", owners={"local"}) == ["Dev"]
    Recall(archive, {"telegram:1001": "local"})          # Alice's chat becomes the local owner's
    assert archive.speakers("Zorro Dev Ines", owners={"local"}) == ["Dev", "Ines"]
    assert archive.speakers("Ines", owners={"telegram:1001"}) == []
    assert archive.reindex() == 2                        # a rebuilt index knows them again
    assert archive.speakers("Zorro Dev Ines", owners={"local"}) == ["Dev", "Ines"]


def test_a_display_name_names_its_sender_through_moves_and_forgetting(archive):
    archive.append([say("my cave photos are online", ALICE, sender="111",
                        extra={"SENDER_NAME": "Inés Ortiz"})])
    assert archive.speakers("what did ines say", owners={"telegram:1001"}) == ["ines"]
    Recall(archive, {"telegram:1001": "local"})          # moved to the local owner's table
    assert archive.speakers("what did Ortiz or 111 say", owners={"local"}) == ["Ortiz", "111"]
    assert forget(archive, ALICE) == 1
    assert archive.speakers("what did Ortiz say", owners={"local"}) == []


@pytest.mark.parametrize("sender", ['"', '""', "a\"b", "*", "NEAR(a b)", "x:y", "^x",
                                    "AND", "🙂", "-"])
def test_a_hostile_sender_or_name_is_plain_text_everywhere(archive, sender):
    archive.append([say("hello walrus", ALICE, sender=sender, extra={"SENDER_NAME": sender})])
    recall = Recall(archive, {})
    assert recall.recall(ALICE, f"what did {sender} say about the walrus?", k=3)
    assert "hello walrus" in recall.explain(ALICE, f"what did {sender} say about walrus?")
    assert forget(archive, ALICE) == 1
    assert archive.speakers(f"what did {sender} say", threads=[ALICE]) == []


def test_a_reading_connection_knows_a_new_sender_at_once(archive):
    chat(archive, CLI, [("Dev", "the cave trip was fun")])
    with ThreadPoolExecutor(1) as reader, archive.lock:     # held: searches use a reader
        ask = lambda: reader.submit(archive.speakers, "Zorro Dev").result(timeout=10)  # noqa
        assert ask() == ["Dev"]
        chat(archive, CLI, [("Zorro", "the cave map is under the stone")])
        assert ask() == ["Zorro", "Dev"]


def test_verb_forms_only_with_the_english_stemmer(tmp_path):
    with Archive(tmp_path / "plain", tokenizer="unicode61") as plain:
        plain.append([say("I ran the Berlin marathon", CLI)])
        assert plain.search("run") == []
        assert [h.text for h in plain.search("ran")] == ["I ran the Berlin marathon"]


def test_a_text_said_by_the_person_named_and_by_another_is_recalled_once(archive):
    chat(archive, CLI, [("Ann", "see you at the gym, buddy"), ("Bob", "see you at the gym, buddy"),
                        ("Ann", "the gym closes early on Sundays")])
    texts = [e.text.split("] ", 1)[1] for e in
             Recall(archive, {}).recall(EMACS, "What did Bob say about the gym?", k=5)]
    assert sorted(texts) == ["see you at the gym, buddy", "the gym closes early on Sundays"]


def test_a_match_whose_message_row_is_gone_is_passed_over(archive):
    records = archive.append([say(f"the walrus sang song {n}", CLI) for n in range(12)])
    db = sqlite3.connect(archive.root / "index.sqlite")
    db.executemany("DELETE FROM messages WHERE id = ?", [(r.id,) for r in records[::4]])
    db.commit()
    db.close()
    found = {h.id for h in archive.search("walrus", limit=12)}
    assert found == {r.id for n, r in enumerate(records) if n % 4}


def test_repeated_small_talk_is_recalled_once(archive):
    chat(archive, CLI, [("Dev", "see you at the pottery class!")] * 12 +
         [("Dev", "the pottery class moved to Thursdays")])
    texts = [e.text.split("] ", 1)[1] for e in
             Recall(archive, {}).recall(EMACS, "pottery class", k=5)]
    assert sorted(texts) == ["see you at the pottery class!",
                             "the pottery class moved to Thursdays"]
    assert len(archive.search("pottery class", limit=5)) == 5          # search keeps them
    assert len(archive.search("pottery class", limit=5, distinct=True)) == 2


@pytest.mark.parametrize("question, text", [
    ("what did she donate", "she donated two coats"),
    ("where did they hike", "we went hiking up the ridge"),
    ("Caroline's bikes?", "Caroline sold the bike"),
    # an irregular verb finds its other forms
    ("When did she run the marathon?", "I ran the Berlin marathon in April"),
    ("What did he buy?", "finally bought a second-hand cello"),
    ("Who did they meet at the fair", "we met my old teacher at the fair"),
    ("what was written there", "she wrote the address on a napkin"),
])
def test_stems_possessives_and_irregular_verbs_meet(archive, question, text):
    archive.append([say(text, CLI), say("unrelated small talk about nothing", CLI)])
    assert [h.text for h in archive.search(question)] == [text]


def test_query_words_drop_punctuation_and_possessives():
    assert query_words("Caroline's dog? Bob’s (cat) don't") == ["Caroline", "dog", "Bob",
                                                                 "cat", "don't"]


@pytest.mark.parametrize("version, layout", [
    (1, "CREATE VIRTUAL TABLE fts USING fts5 (text, thread)"),        # one shared table
    (2, "CREATE VIRTUAL TABLE fts_1 USING fts5 (text, thread)"),      # no sender column
])
def test_an_index_of_an_older_schema_is_rebuilt_on_open(tmp_path, caplog, version, layout):
    caplog.set_level(logging.INFO, logger="opencortex.memory.index")
    root = tmp_path / "memory"
    with Archive(root) as archive:
        archive.append([say("the donated piano", CLI, sender="Caroline")])
    db = sqlite3.connect(root / "index.sqlite")
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE name GLOB 'fts_[0-9]*' "
                              "AND sql LIKE 'CREATE VIRTUAL%'").fetchall():
        db.execute(f"DROP TABLE {name}")
    db.execute(layout)
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()
    with Archive(root) as reopened:
        assert [h.text for h in reopened.search("donate")] == ["the donated piano"]
        assert reopened.speakers("what did Caroline donate") == ["Caroline"]
    assert f"is of layout {version}, not {SCHEMA_VERSION}; it is rebuilt" in caplog.text
    db = sqlite3.connect(root / "index.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'fts'").fetchone()[0] == 0
    db.close()


def test_another_tokenizer_rebuilds_the_index(tmp_path):
    root = tmp_path / "memory"
    with Archive(root) as archive:
        archive.append([say("the donated piano", CLI)])
        assert archive.search("donate")
    with Archive(root, tokenizer="unicode61") as plain:
        assert plain.search("donate") == []
        assert [h.text for h in plain.search("donated")] == ["the donated piano"]
    with pytest.raises(ValueError, match="unknown tokenizer"):
        Archive(root, tokenizer="klingon")


def test_a_date_in_the_question_searches_that_period_first(archive):
    now = time.time()
    last_thursday = date.today().weekday() + 4             # Thursday of last week
    archive.append([say(f"I baked a {cake}", CLI, timestamp=now - days * DAY)
                    for cake, days in (("carrot cake", 200), ("apple pie", 90),
                                       ("banana bread", last_thursday), ("flatbread", 0))])
    recall = Recall(archive, {})
    [best, *_] = recall.recall(EMACS, "What did I bake last week?", k=3)
    assert "banana bread" in best.text
    month = datetime.fromtimestamp(now - 90 * DAY).strftime("%B %Y")
    [best, *_] = recall.recall(EMACS, f"What did I bake in {month}?", k=3)
    assert "apple pie" in best.text


def test_a_question_about_a_period_alone_recalls_what_was_said_then(archive):
    """"What did we talk about yesterday?" searched "talk" in yesterday's messages and
    recalled nothing when no message held it: it recalls yesterday's messages, newest
    first, of this owner only."""
    noon = datetime.combine(date.today() - timedelta(days=1), datetime.min.time()).timestamp() \
        + 12 * 3600                                                   # yesterday, 12:00
    archive.append([say(text, CLI, timestamp=noon + hours * 3600) for text, hours in (
        ("the sky was blue", -1), ("we planned the garden beds", 0),
        ("notes from last month", -30 * 24))])
    archive.append([say("another owner's secret", ALICE, timestamp=noon)])
    for question in ("What did we talk about yesterday?", "what did we do yesterday?"):
        entries = Recall(archive, {}).recall(EMACS, question, k=5)
        assert [e.text.split("] ")[1] for e in entries] == ["we planned the garden beds",
                                                            "the sky was blue"]
    # /recall says what recall searched: nothing here ("yesterday" names the period)
    explained = Recall(archive, {}).explain(EMACS, "what did we do yesterday?")
    assert "searched for: nothing (only common words)" in explained


def test_now_puts_the_newer_of_two_matches_first(archive):
    now = time.time()
    archive.append([say("I work as a nurse at Brightwell", CLI, timestamp=now - 300 * DAY),
                    say("I work as a carpenter at Nordlicht", CLI, timestamp=now - 10 * DAY)])
    [best, _] = Recall(archive, {}).recall(EMACS, "Where does she work now?", k=2)
    assert "carpenter" in best.text


def test_a_recalled_question_brings_its_reply_and_shows_its_date(archive):
    archive.append([say("which port does staging use?", CLI),
                    say("5433, since the move", CLI, role="assistant"),
                    say("thanks", CLI)])
    entries = Recall(archive, {}).recall(EMACS, "staging port", k=1)
    assert len(entries) == 2
    assert entries[1].text.endswith("next to a recalled message] 5433, since the move")
    assert datetime.now().strftime("%Y-%m-%d") in entries[0].text


@pytest.mark.parametrize("question, answer", [
    ("where does Ann live? 🙂", "In Lisbon."), ("what is the gate code?!", "It is 7788."),
    ("东京的邮编是多少？", "100-0001"), ("ما هو الرمز؟", "7788"), ("which port (staging)?)", "5433")])
def test_a_question_is_a_question_whatever_mark_or_emoji_ends_it(archive, question, answer):
    """Only a text ending exactly in "?" counted as a question, so the reply to "…? 🙂",
    "…?!", "…？" or "…؟" never came with it, nor the question with its reply."""
    archive.append([say(question, CLI), say(answer, CLI, role="assistant"), say("ok", CLI)])
    recall = Recall(archive, {})
    by_answer = [e.text for e in recall.recall(EMACS, answer, k=1)]
    assert len(by_answer) == 2 and by_answer[1].endswith(question)
    by_question = [e.text for e in recall.recall(EMACS, question, k=1)]
    assert len(by_question) == 2 and by_question[1].endswith(answer)


def test_a_question_at_the_end_of_a_long_message_is_searched(archive):
    """Only the first 32 words of a message were searched, so a question after a pasted
    paragraph recalled nothing; the first and the last words count now, and a message
    of megabytes is read at its start and end only."""
    [fact] = archive.append([say("The wifi password is hunter2", CLI)])
    archive.append([say(f"filler number {i}", CLI) for i in range(20)])
    recall = Recall(archive, {})
    prefix = " ".join(f"alpha{i}" for i in range(40))
    assert [e.id for e in recall.recall(EMACS, f"{prefix} what is the wifi password?",
                                        k=1)] == [fact.id]
    page = " ".join(f"word{i % 5000}" for i in range(200_000))    # ~1.8 MB
    assert [e.id for e in recall.recall(EMACS, f"{page} what is the wifi password?",
                                        k=1)] == [fact.id]
    assert len(query_words(page)) == 32


def test_chinese_and_japanese_are_found_by_the_words_in_them(archive):
    """A run of Chinese characters or kana, written without spaces, was one "word" to
    the tokenizer: "东京" never found "我住在东京".  Pairs of characters are terms."""
    [tokyo, weather, cat] = archive.append([
        say("我住在东京，很喜欢拉面", CLI), say("東京の天気は晴れです", CLI),
        say("我的猫叫小白", CLI)])
    archive.append([say(f"filler {i} 今天很好", CLI) for i in range(10)])
    assert [h.id for h in archive.search("东京", thread=CLI)] == [tokyo.id]
    assert [h.id for h in archive.search("猫", thread=CLI)] == [cat.id]
    [best, *_] = archive.search("東京の天気はどう？", thread=CLI)
    assert best.id == weather.id and "天気" in best.matched
    recall = Recall(archive, {})
    [first, *_] = recall.recall(EMACS, "我的猫叫什么名字？", k=2)
    assert first.text.endswith("我的猫叫小白")
    text = recall.explain(EMACS, "东京的拉面怎么样？")
    assert "matched: 东京, 拉面" in text
    assert query_words("东京的邮编？ ok") == ["东京", "京的", "的邮", "邮编", "ok"]
    [wide] = archive.append([say("ＡＢＣ Corp is hiring ｶﾀｶﾅ", CLI)])     # full width
    assert [h.id for h in archive.search("ABC", thread=CLI)] == [wide.id]
    assert [h.id for h in archive.search("カタカナ", thread=CLI)] == [wide.id]


def test_the_neighbours_of_several_messages_come_from_one_read(archive):
    """Each known id's conversation neighbours in its own thread, as `neighbours` gives
    them one at a time: control records are passed over, an unknown id is left out, the
    message after is looked for only where asked, and the one before (when asked) only
    if it holds a question mark (recall reads no other: see `_partner`)."""
    first, second = archive.append([say("which port?", CLI), say("5433", CLI, role="assistant")])
    archive.append([control(CLI, first.id, "Pinned the port question")])
    [third] = archive.append([say("thanks", CLI)])
    [alone] = archive.append([say("hello", EMACS)])
    ids = [first.id, second.id, third.id, alone.id, "no-such-id"]
    near = archive.neighbours_of(ids)
    assert set(near) == set(ids) - {"no-such-id"}
    assert [(b and b.id, a and a.id) for b, a in (near[i] for i in ids[:4])] == [
        (None, second.id), (first.id, third.id), (second.id, None), (None, None)]
    assert all(near[i] == archive.neighbours(i) for i in ids[:4])
    assert archive.neighbours("no-such-id") == (None, None)
    only_first = archive.neighbours_of(ids[:2], after_of=[first.id])   # the next one: of first
    assert only_first == {first.id: near[first.id], second.id: (near[second.id][0], None)}
    asking = archive.neighbours_of(ids[:3], before_with="?")     # a question before, only
    assert asking == {first.id: near[first.id], second.id: near[second.id],
                      third.id: (None, None)}


def test_a_recalled_reply_brings_the_question_it_answers(archive):
    archive.append([say("where do the backups go?", CLI),
                    say("to the tape library, nightly", CLI, role="assistant"),
                    say("ok", CLI)])
    entries = Recall(archive, {}).recall(EMACS, "tape library", k=1)
    assert [entry.text.split("] ", 1)[1] for entry in entries] == [
        "to the tape library, nightly", "where do the backups go?"]


def test_merged_copies_among_the_best_hits_leave_k_distinct_messages(archive):
    """Recall reads only the K best hits first; when merged copies of a message are
    among them, it ranks as many candidates as usual, so K distinct messages remain."""
    [original] = archive.append([say("otter otter otter", CLI)])
    archive.append([say("otter otter otter", CLI, extra={MERGED_FROM: original.id})
                    for _ in range(2)])
    archive.append([say(f"an otter, number {i}", CLI) for i in range(3)])
    recall = Recall(archive, {})
    everything = unique(archive.search("otter", threads=recall.scope(EMACS), limit=20))
    hits, _ = recall.hits(EMACS, "otter", k=3)
    assert [hit.id for hit in hits] == [hit.id for hit in everything[:3]]
    assert hits[0].id == original.id and all(h.text.startswith("an otter") for h in hits[1:])


def test_explain_says_what_matched_when_and_the_period(archive):
    archive.append([say("the walrus sang yesterday", CLI, timestamp=time.time() - DAY)])
    text = Recall(archive, {}).explain(EMACS, "what did the walrus sing yesterday?")
    assert "matched: walrus" in text and "score" in text
    assert "dates:" in text and '("yesterday")' in text
    assert Recall(archive, {}).explain(EMACS, "zebra").endswith("Nothing recalled.")


def test_explain_names_only_the_words_matched_not_brackets_of_the_text(archive):
    """The words matched are marked apart from the text: an echo's "[Echo]", an org
    link or a checkbox of the text is no match (they used to be listed as matched),
    while the search output keeps its bracketed snippet."""
    archive.append([say("[Echo] my cats, see [[file:cats.org][the list]] [x] done", CLI)])
    text = Recall(archive, {}).explain(EMACS, "cat")
    assert "matched: cats\n" in text
    [hit] = archive.search("cat", thread=CLI)
    assert hit.matched == ["cats"] and "[cats]" in hit.snippet


@pytest.mark.parametrize("question, start, end", [
    ("what happened yesterday", "2026-11-19", "2026-11-20"),
    ("anything last week?", "2026-11-09", "2026-11-16"),      # Monday to Sunday before
    ("what did I buy last month?", "2026-10-01", "2026-11-01"),
    ("last year", "2025-01-01", "2026-01-01"),
    ("in the past week", "2026-11-14", "2026-11-21"),         # the seven days to today
    ("this week", "2026-11-16", "2026-11-21"),
    ("in March?", "2026-03-01", "2026-04-01"),
    ("in December", "2025-12-01", "2026-01-01"),
    ("on 2026-02-14 then", "2026-02-14", "2026-02-15"),
    ("three days ago", "2026-11-16", "2026-11-19"),
    ("a week ago", "2026-11-10", "2026-11-17"),                # around then, never today
    ("a year ago", "2025-05-22", "2026-05-22"),
    ("the day before yesterday", "2026-11-18", "2026-11-19"),
    ("during 2024", "2024-01-01", "2025-01-01"),
    ("in March of 2025", "2025-03-01", "2025-04-01"),
    ("on the 3rd of March", "2026-03-03", "2026-03-04"),
    ("3 March 2025", "2025-03-03", "2025-03-04"),
    ("sept 5", "2026-09-05", "2026-09-06"),
    ("last March", "2026-03-01", "2026-04-01"),
    ("last November", "2025-11-01", "2025-12-01"),             # not this one
    ("what did June say on June 3", "2026-06-03", "2026-06-04"),
    ("last Monday", "2026-11-16", "2026-11-17"),                # the last one before today
    ("what did we do on Friday?", "2026-11-13", "2026-11-14"),
    ("this morning", "2026-11-20", "2026-11-21"),
    ("last night", "2026-11-19", "2026-11-21"),
    ("a couple of days ago", "2026-11-17", "2026-11-20"),
    ("a few weeks ago", "2026-10-27", "2026-11-03"),
    ("seven days ago", "2026-11-12", "2026-11-15"),
    ("since 2024", "2024-01-01", "2026-11-21"),
    ("since March", "2026-03-01", "2026-11-21"),
    ("on Wednesday", "2026-11-18", "2026-11-19"),
    ("last Wednesday", "2026-11-18", "2026-11-19"),
    ("Wednesday morning", "2026-11-18", "2026-11-19"),
    ("what did we do wednesday?", "2026-11-18", "2026-11-19"),
    ("What did we do Wednesday? Bob forgot", "2026-11-18", "2026-11-19"),
    ("Wednesday Morning Standup", "2026-11-18", "2026-11-19"),
    ("Wednesday I went to the gym", "2026-11-18", "2026-11-19"),
    ("Wednesday, Alice said", "2026-11-18", "2026-11-19"),
    ("On Wednesday Alice said", "2026-11-18", "2026-11-19"),
    ("Wednesday November 18", "2026-11-18", "2026-11-19"),
])
def test_date_expressions_become_windows(question, start, end):
    now = datetime(2026, 11, 20, 15, 0).timestamp()          # a Friday
    hint = date_hint(question, now)
    days = [datetime.fromtimestamp(t).strftime("%Y-%m-%d") for t in hint.window]
    assert days == [start, end]


def test_no_date_and_may_as_a_verb_give_no_window():
    now = datetime(2026, 11, 20).timestamp()
    assert date_hint("what instrument is she learning", now).window is None
    assert date_hint("I may go", now).window is None
    assert date_hint("this may be wrong", now).window is None
    assert date_hint("where does she live now", now).recent


@pytest.mark.parametrize("question", [
    "What did Jan say about the trip?", "Where does June live?", "Where does April work",
    "August Rush is a film", "the march on Washington"])
def test_a_month_word_alone_is_a_name_not_a_date(question):
    """A month word with no day, year or "in" before it names someone more often than a
    month: it is searched for, and no period is."""
    hint = date_hint(question, datetime(2026, 11, 20).timestamp())
    assert hint.window is None and hint.text == question


@pytest.mark.parametrize("question", [
    "What did Wednesday Addams say?", "Wednesday Addams", "Tuesday Weld starred in it",
    "is Friday Harbor far?"])
def test_a_weekday_alone_before_a_name_is_a_name_not_a_date(question):
    """A weekday word alone followed by a capitalised word that is not a date word
    ("Wednesday Addams") was taken for last Wednesday: the period was searched first
    and the name's first word was not searched for at all."""
    hint = date_hint(question, datetime(2026, 11, 20).timestamp())
    assert hint.window is None and hint.text == question


def test_a_name_that_starts_with_a_weekday_is_recalled_by_it(archive):
    now = time.time()
    last_wednesday = (date.today().weekday() - 2) % 7 or 7
    archive.append([say(text, CLI, timestamp=now - days * DAY) for text, days in (
        ("Wednesday Addams dances alone in the school hall", 200),
        ("Addams family reunion photos are in the shared album", 150),
        ("we repainted the kitchen", last_wednesday))])
    [best, *_] = Recall(archive, {}).recall(EMACS, "What does Wednesday Addams do?", k=3)
    assert "dances alone" in best.text


@pytest.mark.parametrize("question", [
    "The pyramids were built about 4500 years ago, right?", "what happened on 9999-12-31",
    "0001-01-01 ann", "1000000 years ago", "999999999999 days ago", "December 31 9999"])
def test_a_date_outside_the_calendar_is_no_window(question):
    """Dates past what the calendar holds used to raise OverflowError, failing the turn
    (the message was not archived); they are no period, and the words still count."""
    hint = date_hint(question, datetime(2026, 11, 20).timestamp())
    assert hint.window is None and hint.text == question


def test_a_word_in_half_the_owners_messages_is_not_matched_while_a_rarer_one_is(
        archive, monkeypatch):
    # BM25 gives such a word no weight (its idf is clamped to ~0): matching it would only
    # cost time, ranking every message that holds it.
    monkeypatch.setattr(ranking, "WEIGHTLESS_FLOOR", 10)
    archive.append([say(f"meeting notes {i}", CLI) for i in range(30)])
    [answer] = archive.append([say("the okapi meeting moved to friday", CLI)])
    archive.append([say(f"okapi {i}", ALICE) for i in range(50)])    # another owner's table
    hits = archive.search("okapi meeting", thread=CLI, limit=10)
    assert [h.id for h in hits] == [answer.id] and hits[0].snippet.startswith("the [okapi]")
    assert len(archive.search("meeting okapi", thread=CLI, limit=40)) == 1
    newest = archive.search("meeting", thread=CLI, limit=3)     # nothing rarer: the newest
    assert [h.text for h in newest] == [answer.text, "meeting notes 29", "meeting notes 28"]
    monkeypatch.setattr(ranking, "WEIGHTLESS_FLOOR", 200)    # 31 messages: all ranked
    ranked = archive.search("okapi meeting", thread=CLI, limit=40)
    assert ranked[0].id == answer.id and len(ranked) == 31


def test_recall_brings_nothing_for_a_message_of_only_very_common_words(archive, monkeypatch):
    """What weightless words match says nothing of the message: recall adds nothing to the
    prompt then (it used to add the newest matches, ranked by nothing, every turn), while
    a search asked for by a person still shows the newest, and a question naming a period
    still gets that period's newest."""
    monkeypatch.setattr(ranking, "WEIGHTLESS_FLOOR", 10)
    now = time.time()
    archive.append([say(f"meeting notes {i}", CLI, timestamp=now - (30 - i) * DAY)
                    for i in range(30)])             # the newest, 29, said yesterday
    recall = Recall(archive, {})
    assert recall.recall(EMACS, "meeting notes?", k=5) == []
    assert recall.hits(EMACS, "the meeting", k=5)[0] == []
    assert [h.text for h in archive.search("meeting", thread=CLI, limit=2)] == [
        "meeting notes 29", "meeting notes 28"]
    [best] = recall.recall(EMACS, "the meeting notes of yesterday?", k=3)
    assert best.text.endswith("meeting notes 29")
    archive.append([say("the meeting about the okapi enclosure", CLI)])
    [best, *_] = recall.recall(EMACS, "meeting about the okapi", k=3)
    assert best.text.endswith("the meeting about the okapi enclosure")


def test_a_word_is_not_taken_for_very_common_on_a_stale_message_count(archive, monkeypatch):
    """The owner's message count is remembered for a while (SIZE_TTL); a burst of
    messages since must not make a word look as if it were in half of them (then recall
    brought nothing: bench_core's turns came faster than the count was renewed)."""
    monkeypatch.setattr(ranking, "SIZE_TTL", 3600.0)
    archive.append([say(f"kiwi note {i}", CLI) for i in range(64)])
    recall = Recall(archive, {})
    assert recall.recall(EMACS, "kiwi?", k=5) == []        # in every message: weightless
    archive.append([say(f"other chatter {i}", CLI) for i in range(600)])
    found = recall.recall(EMACS, "kiwi?", k=5)             # now in 64 of 664
    assert len(found) == 5 and all("kiwi note" in entry.text for entry in found)


def test_recall_leaves_snippets_to_explain(archive):
    archive.append([say("the walrus sings at dawn", CLI), say("small talk", CLI)])
    assert [h.snippet for h in archive.search("walrus", thread=CLI, snippets=False)] == [""]
    recall = Recall(archive, {})
    assert recall.hits(CLI, "walrus")[0][0].snippet == ""
    assert "matched: walrus" in recall.explain(CLI, "walrus")


def test_the_owners_message_count_is_not_trusted_once_a_word_outnumbers_it(
        archive, monkeypatch):
    monkeypatch.setattr(ranking, "WEIGHTLESS_FLOOR", 1)
    archive.append([say(f"alpha {i}", CLI) for i in range(4)])
    assert len(archive.search("alpha", thread=CLI)) == 4          # 4 messages, counted
    archive.append([say(f"gamma {i}", CLI) for i in range(30)])
    archive.append([say(f"beta {i}", CLI) for i in range(100)])
    hits = archive.search("gamma beta", thread=CLI, limit=50)    # gamma: 30 of 134, ranked
    assert len(hits) == 30 and all(h.text.startswith("gamma") for h in hits)


def test_a_named_search_ranks_the_words_alone_and_filters_by_sender_apart(archive):
    """A sender or thread filter weighs nothing in BM25 (its column's weight is 0), but
    BM25 counted every message it matched, once per search: "What did Dev bake?"
    counted every message Dev ever sent (2.1 ms at 100k messages, a quarter of them
    Dev's).  The words are ranked alone now, among the messages the whole match
    finds: the same messages in the same order, and nothing counts Dev's messages."""
    archive.append([say(f"Dev here, nothing much today {i}", CLI, sender="Dev")
                    for i in range(300)])
    archive.append([say("I bake bread" + " and more bread" * i, CLI,    # no two score alike
                        sender="Dev" if i % 2 else "Ann") for i in range(12)])
    statements: list[str] = []
    with archive._reading() as index:
        index._db.set_trace_callback(statements.append)
        try:
            hits = archive.search("bake bread", thread=CLI, senders=["Dev"], limit=10,
                                  snippets=False)
        finally:
            index._db.set_trace_callback(None)
        table = index._parts.known_table(CLI)
        reference = [row[0] for row in index._db.execute(
            f"SELECT m.id FROM {table} f JOIN messages m ON m.seq = f.rowid WHERE f.{table} "
            f"MATCH ? ORDER BY bm25({table}, {ranking.BM25_WEIGHTS}), f.rowid",
            (f'{ranking.TEXT}:("bake" OR "bread") AND sender:("Dev")',))]
    assert [hit.id for hit in hits] == reference[:10] and len(hits) == 6
    assert all(hit.sender == "Dev" for hit in hits)
    ranked = [statement for statement in statements if "bm25(" in statement]
    assert ranked and all("sender:" not in statement.split("MATCH '", 1)[1].split("'", 1)[0]
                          for statement in ranked)


def test_a_filtered_search_scans_its_words_matches_not_one_lookup_per_filter_match(archive):
    """The filter of a named (or thread-filtered) search is a set of rowids the ranked
    query checks each of its matches against.  SQLite may instead drive the query from
    that set, one FTS5 lookup per rowid, and BM25 then counts each phrase's messages
    again for every one of them ("Where does Rosa work now?": 8.4 ms instead of 0.4 at
    ~5,000 messages).  Neither plan of a ranked statement looks rows up by rowid."""
    archive.append([say(f"Dev here, nothing much today {i}", CLI, sender="Dev")
                    for i in range(50)])
    archive.append([say(f"I bake bread {i}", CLI, sender="Dev" if i % 2 else "Ann")
                    for i in range(20)])
    statements: list[str] = []
    day = 86400.0
    with archive._reading() as index:
        index._db.set_trace_callback(statements.append)
        try:
            named = archive.search("bake bread", thread=CLI, senders=["Dev"], limit=5,
                                   snippets=False)
            dated = archive.search("bake bread", thread=CLI, senders=["Dev"], limit=5,
                                   snippets=False, window=(time.time() - day, time.time() + day))
        finally:
            index._db.set_trace_callback(None)
        ranked = [statement for statement in statements if "bm25(" in statement]
        plans = [[row[3] for row in index._db.execute(f"EXPLAIN QUERY PLAN {statement}")]
                 for statement in ranked]
    assert len(named) == 5 and len(dated) == 5
    assert len(ranked) == 2 and all(" IN (SELECT rowid" in statement for statement in ranked)
    strategies = [detail.split(" INDEX ", 1)[1] for plan in plans for detail in plan
                  if "VIRTUAL TABLE INDEX" in detail]      # FTS5's: "0:M4", "0:=M4" by rowid
    assert len(strategies) == 4 and all("M" in strategy and "=" not in strategy
                                        for strategy in strategies), plans
