"""Recall and words of time that hold for any history, imported or old: "recently"."""

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
