"""Recall of questions that name a person: a message that matches the name alone is
no answer (issue 13, "greetings fill the hits when only a name matches")."""

from __future__ import annotations

from opencortex.conversation.recall import Recall
from opencortex.events import Thread

from test_recall import archive, say  # noqa: F401  (archive: a fixture)

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")
GREETINGS = ["Bye Caroline!", "Thanks Caroline", "Morning Caroline, slept well?",
             "haha Caroline that is hilarious", "Miss you Caroline"]


def chat(archive, turns, start=1_700_000_000.0):
    """Archive TURNS, (sender, text) pairs a minute apart, in CLI; their records."""
    return archive.append([say(text, CLI, sender=sender, timestamp=start + 60 * n)
                           for n, (sender, text) in enumerate(turns)])


def caroline_and_melanie(archive, *more):
    """A chat where Melanie greets Caroline a lot and Caroline talks of other things."""
    turns = []
    for n in range(12):
        turns += [("Melanie", f"{GREETINGS[n % len(GREETINGS)]} {n}"),
                  ("Caroline", f"the bus was late again today, Melanie {n}")]
    return chat(archive, turns + list(more))


def test_a_question_whose_other_words_match_nothing_recalls_no_greetings(archive):
    """"What does Caroline think about quantum physics?" recalled "Thanks Caroline",
    "Bye Caroline!": the name was the only word any message held."""
    caroline_and_melanie(archive)
    recall = Recall(archive, {})
    assert recall.recall(EMACS, "What does Caroline think about quantum physics?", k=5) == []
    assert "Nothing recalled." in recall.explain(EMACS, "What does Caroline think about "
                                                        "quantum physics?")


def test_a_message_with_more_than_the_name_is_recalled_not_the_greetings(archive):
    records = caroline_and_melanie(
        archive, ("Melanie", "Caroline's garden is full of tomatoes this year"),
        ("Tobias", "the garden party is on Sunday"))
    recalled = Recall(archive, {}).recall(EMACS, "What grows in Caroline's garden?", k=5)
    texts = [entry.text.split("] ", 1)[1] for entry in recalled]
    assert {entry.id for entry in recalled} == {records[-2].id, records[-1].id}
    assert not any(text.startswith(tuple(GREETINGS)) for text in texts), texts


def test_a_name_alone_is_still_searched_as_a_word(archive):
    """With no other word to match, the name is the question: its messages come."""
    caroline_and_melanie(archive)
    assert Recall(archive, {}).recall(EMACS, "Caroline?", k=3)
