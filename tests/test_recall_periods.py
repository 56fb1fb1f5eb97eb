"""Recall and words of time: "recently" in any history (imported or old), and what a
person named said in a period named."""

from __future__ import annotations

import time
from datetime import datetime

from opencortex.conversation.recall import Recall
from opencortex.conversation.recalldates import date_hint
from opencortex.events import Thread

from test_recall import archive, say  # noqa: F401  (archive: a fixture)

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")
DAY = 86400.0


def test_recently_and_lately_ask_for_the_newer_match_as_now_does():
    now = datetime(2026, 11, 20).timestamp()
    for question in ("what did Tom paint recently?", "what has she read lately"):
        hint = date_hint(question, now)
        assert hint.recent and hint.window is not None      # the last month, searched first


def test_recently_puts_the_newer_statement_first_in_a_history_older_than_a_month(archive):
    """An imported chat from last year: "recently" means its newest, not none of it (the
    last month held nothing, and the older, shorter message used to win)."""
    start = time.time() - 400 * DAY
    archive.append([
        say("I painted a lake at sunrise.", CLI, timestamp=start),
        say("Finally done: I painted a portrait of my daughter holding sunflowers in "
            "the garden, it took weeks.", CLI, timestamp=start + 30 * DAY)])
    for question in ("What did Tom paint recently?", "What has Tom painted lately?"):
        best, _ = Recall(archive, {}).recall(EMACS, question, k=2)
        assert "portrait" in best.text


def test_what_a_person_said_on_a_day_is_what_they_said_not_greetings_to_them(archive):
    """"What did Nadia do on 8 May 2025?": the words left name only Nadia; her messages
    of that day are the answer, not the ones that greet her ("Bye Nadia!")."""
    day = datetime(2025, 5, 8, 13, 0).timestamp()
    talk = [("Tomas", "Hey Nadia! How are you?"),
            ("Nadia", "Hi Tomas! I went to a pottery class this morning, made a bowl."),
            ("Tomas", "Haha Nadia that's great"), ("Nadia", "Also booked flights to Oslo."),
            ("Tomas", "Bye Nadia!")]
    archive.append([say(text, CLI, sender=who, timestamp=day + 60 * n)
                    for n, (who, text) in enumerate(talk)])
    archive.append([say(f"Nadia and Tomas on the weather {n}", CLI, sender="Tomas",
                        timestamp=day + 5 * DAY + n) for n in range(10)])
    recall = Recall(archive, {})
    for question, person in [("What did Nadia do on 8 May 2025?", "Nadia"),
                             ("What did Nadia say on May 8, 2025?", "Nadia"),
                             ("What did Tomas say on 8 May 2025?", "Tomas")]:
        hits, _ = recall.hits(EMACS, question, k=2)
        assert [hit.sender for hit in hits] == [person, person], question
        assert all(hit.timestamp < day + DAY for hit in hits)


def test_now_ranks_the_statement_that_says_now_above_shorter_ones_never_alone(archive):
    """"Where does Rosa work now?" recalled her remarks about work ("someone at work
    said Porto is expensive", shorter, some newer) before "I'm working as a carpenter
    at Castellan now": "now" was a function word, not matched."""
    start = time.time() - 300 * DAY
    cities = ["Porto", "Lisbon", "Glasgow", "Bergen", "Utrecht", "Leipzig"]

    def rosa(text: str, day: float) -> object:
        return say(text, CLI, sender="Rosa", timestamp=start + day * DAY)
    records = archive.append(
        [rosa("Tobias, I started working as a nurse at Brightwell this month", 0)] +
        [rosa(f"Tobias, someone at work said {city} is expensive", 10 + 40 * n)
         for n, city in enumerate(cities)] +
        [rosa("Big news Tobias: I switched jobs, I'm working as a carpenter at Castellan "
              "now", 150), rosa("gotta go now Tobias", 290), rosa("right now? sure", 291)])
    recall = Recall(archive, {})
    recalled = recall.recall(EMACS, "Where does Rosa work now?", k=3)
    assert recalled[0].id == records[7].id
    assert not {records[8].id, records[9].id} & {e.id for e in recall.recall(
        EMACS, "Where does Rosa work now?", k=10)}          # "now" alone matches nothing
    assert "and those saying 'now' ranked higher" in recall.explain(
        EMACS, "Where does Rosa work now?")


def test_a_period_nothing_was_said_in_is_not_searched_word_by_word(archive, monkeypatch):
    """Every match of the words was ranked only to keep none of them (40 ms at 100k
    messages): one seek in the index on time now tells the period is empty, and the
    words are searched in the whole history as when no period is named."""
    archive.append([say(f"the harbour ferry leaves at {hour}", CLI,
                        timestamp=time.time() - 400 * DAY + hour) for hour in range(30)])
    windows = []
    matches = type(archive._index)._matches
    monkeypatch.setattr(type(archive._index), "_matches", lambda self, *args, **kwargs:
                        windows.append(args[4]) or matches(self, *args, **kwargs))
    hits, hint = Recall(archive, {}).hits(EMACS, "when does the harbour ferry leave last week?")
    assert hint.window is not None and hits and "harbour ferry" in hits[0].text
    assert windows and all(window is None for window in windows)


def test_a_period_is_looked_for_in_any_number_of_threads(archive):
    """Threads are given to SQLite as one JSON list: 20,000 of them (past SQLite's 32,766
    parameters at two a thread) are no error."""
    archive.append([say("the harbour ferry leaves at noon", CLI, timestamp=1000.0)])
    threads = [CLI, *(Thread("emacs", f"chat{n}") for n in range(20_000))]
    hits = archive.said_within((999.0, 1001.0), limit=5, threads=threads)
    assert [hit.text for hit in hits] == ["the harbour ferry leaves at noon"]
    assert archive.said_within((5000.0, 6000.0), limit=5, threads=threads) == []
