"""Recall of questions that name a person: a message that matches the name alone is
no answer (issue 13, "greetings fill the hits when only a name matches")."""

from __future__ import annotations

from opencortex.conversation.recall import Recall
from opencortex.conversation.recallorder import reranked
from opencortex.events import Thread
from opencortex.memory import SearchHit

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


def test_of_statements_alike_the_one_naming_the_person_asked_about_leads(archive):
    """A name in most of an owner's messages weighs ~nothing in BM25: "Did you hear Dev
    broke an arm?" (shorter) ranked above "... Rosa broke an arm ..." for "What did Rosa
    break?".  Naming the person asked about breaks the tie."""
    turns = []
    for n in range(60):
        greeting = GREETINGS[n % len(GREETINGS)].replace("Caroline", "Rosa")
        turns += [("Tobias", f"{greeting} {n}"),
                  ("Rosa", f"the bus was late again today {n}")]
    records = chat(archive, turns + [
        ("Tobias", "Did you hear Dev broke an arm?"),
        ("Tobias", "Did you hear Ann broke an arm?"),
        ("Tobias", "Did you hear Rosa broke an arm skiing?")])
    recall = Recall(archive, {})
    assert recall.named(EMACS, "What did Rosa break?") == ["Rosa"]
    assert [entry.id for entry in recall.recall(EMACS, "What did Rosa break?", k=1)] == \
        [records[-1].id]


def test_the_bonus_for_naming_the_person_asked_about_is_bounded():
    """It breaks ties, and a clearly better match of the other words still leads;
    the sender counts as named, case and diacritics aside."""
    def hit(n, text, score, sender="Tobias"):
        return SearchHit(id=str(n), role="user", text=text, channel="cli", chat_id="local",
                         sender=sender, timestamp=1_700_000_000.0 + n, score=score, snippet="")
    close = [hit(1, "Dev broke an arm", 1.0), hit(2, "José broke an arm", 0.9)]
    assert [h.id for h in reranked(close, ["jose"])] == ["2", "1"]
    assert [h.id for h in reranked(close, ["Dev"])] == ["1", "2"]
    by = [hit(1, "an arm broke", 1.0), hit(2, "broke an arm", 0.9, sender="Rosa")]
    assert [h.id for h in reranked(by, ["Rosa"])] == ["2", "1"]
    far = [hit(1, "Dev broke an arm", 1.0), hit(2, "José broke a leg", 0.7)]
    assert [h.id for h in reranked(far, ["José"])] == ["1", "2"]
    assert reranked(far, []) == far
