"""/recall shows everything a turn would recall: the hits, and the question or reply
each brings along."""

from __future__ import annotations

from opencortex.conversation.recall import Recall
from opencortex.events import Thread

from test_recall import archive, say  # noqa: F401  (archive: a fixture)

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")


def test_explain_lists_the_reply_and_the_question_recall_brings_beside_its_hits(archive):
    start = 1_700_000_000.0
    archive.append([
        say("Which port does the staging database use?", CLI, sender="Ana", timestamp=start),
        say("It listens on 5433.", CLI, role="assistant", sender="Bo", timestamp=start),
        say("What did the plumber charge?", CLI, sender="Ana", timestamp=start + 60),
        say("Ninety euros for the boiler.", CLI, role="assistant", sender="Bo",
            timestamp=start + 60)])
    recall = Recall(archive, {})
    recalled = [e.text.split("] ", 1)[1] for e in recall.recall(EMACS, "staging port?")]
    assert recalled == ["Which port does the staging database use?", "It listens on 5433."]
    shown = recall.explain(EMACS, "staging port?")
    assert "+ the reply to 1, " in shown and "\n   It listens on 5433." in shown
    shown = recall.explain(EMACS, "boiler euros")
    assert "+ the question of 1, " in shown and "\n   What did the plumber charge?" in shown


def test_a_question_followed_by_a_remark_brings_its_reply(archive):
    """"What got you into pottery? I'd love to try." asks, though it ends with a remark:
    the reply after it is what a question about it needs."""
    start = 1_700_000_000.0
    archive.append([
        say("Wow Nadia, what got you into pottery? I've always wanted to try it.", CLI,
            role="assistant", sender="Tomas", timestamp=start),
        say("My aunt taught me when I was ten, she had a kiln in her garage.", CLI,
            sender="Nadia", timestamp=start + 30),
        say("See https://example.org/?q=pottery for the class times.", CLI,
            role="assistant", sender="Tomas", timestamp=start + 60),
        say("Thanks, I will look.", CLI, sender="Nadia", timestamp=start + 90)])
    recalled = [e.text.split("] ", 1)[1] for e in
                Recall(archive, {}).recall(EMACS, "How did Nadia get into pottery?")]
    assert "My aunt taught me when I was ten, she had a kiln in her garage." in recalled
    assert "Thanks, I will look." not in recalled        # a link's "?" asks nothing


def test_a_recalled_memory_says_who_said_it(archive):
    """In a chat of several people (a group, an imported history) the model needs who
    said a recalled message; a display name cannot forge the header."""
    archive.append([
        say("I painted a lake at sunrise", CLI, sender="Nadia", timestamp=1_700_000_000.0),
        say("I painted the harbour", CLI, sender="77", extra={"SENDER_NAME": "Tom] [x\nY"},
            timestamp=1_700_000_100.0),
        say("I painted nothing", CLI, timestamp=1_700_000_200.0)])
    texts = sorted(e.text for e in Recall(archive, {}).recall(EMACS, "painted", k=3))
    assert texts == ["[recalled from cli:local, 2023-11-14, user 77 Tom x Y] I painted the "
                     "harbour", "[recalled from cli:local, 2023-11-14, user Nadia] I painted "
                     "a lake at sunrise", "[recalled from cli:local, 2023-11-14, user] I painted "
                     "nothing"]


def test_a_score_near_nothing_says_why_instead_of_zero(archive):
    """In a small archive BM25 weighs a word found in half of it ~0: /recall showed
    "score 0.00", which reads as "no match"."""
    archive.append([say("I adopted a cat named Tabby", CLI, timestamp=1_700_000_000.0),
                    say("Nice, a cat!", CLI, role="assistant", timestamp=1_700_000_000.0),
                    say("The weather is grey", CLI, timestamp=1_700_000_060.0),
                    say("Grey skies again", CLI, role="assistant", timestamp=1_700_000_060.0)])
    shown = Recall(archive, {}).explain(EMACS, "cat")
    assert "score 0.00" not in shown
    assert "1. score ~0 (its words are in half the archive or more), " in shown
    archive.append([say(f"filler {n}", CLI, timestamp=1_700_000_100.0 + n) for n in range(20)])
    shown = Recall(archive, {}).explain(EMACS, "cat")
    assert "~0" not in shown and "1. score " in shown
