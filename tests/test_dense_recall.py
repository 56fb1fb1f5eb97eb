"""Dense recall with names in the chat, and the search of vectors in memory (issue 13).

Measured with a real model (all-MiniLM-L6-v2) on bench_memory_eval.py: a name
weighs more in a sentence embedding than the words around it, and in a chat
most messages name the person they are said to, so "Which pet did Aiko adopt?"
found what was said *to* Aiko (fused R@5 0.857, "reworded" 0.059).  The
question is now embedded without the names of the senders it asks about, what
they said leads, and each text is a candidate once (0.943, 0.588).  The toy
embedder here (`test_embeddings.trigrams`) tests that plumbing, not quality.
"""

from __future__ import annotations

import random
from array import array

import pytest

import opencortex.memory.nearest as nearest_module
from opencortex.conversation.recall import Recall
from opencortex.conversation.recallorder import said_first
from opencortex.conversation.recallwords import without_names
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage, SearchHit
from opencortex.memory.nearest import VectorBlock, nearest
from test_embeddings import dense, trigrams

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")
EMBEDDED: list[str] = []          # every text `recorded` was asked to embed
MODEL = "python:test_dense_recall:recorded"


def recorded(texts: list[str]) -> list[list[float]]:
    """`trigrams`, keeping the texts it embeds."""
    EMBEDDED.extend(texts)
    return trigrams(texts)


@pytest.fixture
def archive(tmp_path):
    EMBEDDED.clear()
    with Archive(tmp_path / "memory") as opened:
        yield opened


def said(text: str, sender: str, thread: Thread = CLI) -> NewMessage:
    return NewMessage(role="user", text=text, thread=thread, sender=sender)


def hit(id_: str, sender: str) -> SearchHit:
    return SearchHit(id=id_, role="user", text=f"text {id_}", channel="cli", chat_id="local",
                     sender=sender, timestamp=0.0, score=1.0, snippet="")


# -- names -----------------------------------------------------------------------------


def test_names_asked_about_are_left_out_of_the_question():
    assert without_names("Which pet did Aiko adopt?", ["Aiko"]) == "Which pet did adopt?"
    assert without_names("What is the name of Melanie's parrot?", ["melanie"]) == \
        "What is the name of parrot?"
    assert without_names("Did Rosa’s trip to Rosario go well?", ["Rosa"]) == \
        "Did trip to Rosario go well?"                   # a word holding the name stays
    assert without_names("Aiko?", ["Aiko"]) == "Aiko?"   # nothing else left: as it was
    assert without_names("Which pet did Aiko adopt?", []) == "Which pet did Aiko adopt?"


def test_what_the_people_asked_about_sent_leads_two_for_each_other():
    hits = [hit("a", "Caroline"), hit("b", "Melanie"), hit("c", "Caroline"),
            hit("d", "Melanie Smith"), hit("e", "Melanie")]
    assert [h.id for h in said_first(hits, ["melanie"])] == ["b", "d", "a", "e", "c"]
    assert said_first(hits, ["Tobias"]) == hits
    assert said_first(hits, []) == hits


def test_the_question_is_embedded_without_the_names_of_senders_it_asks_about(archive):
    archive.append([said("Aiko, how was your weekend?", "Jonas"),
                    said("we brought home a little tabby cat", "Aiko")])
    recall = Recall(archive, {}, dense=dense(archive, MODEL))
    recall.hits(EMACS, "hello", k=3)                  # the messages get their vectors
    EMBEDDED.clear()
    recall.hits(EMACS, "Which pet did Aiko adopt?", k=3)
    assert EMBEDDED == ["Which pet did adopt?"]
    EMBEDDED.clear()
    recall.hits(EMACS, "Which pet did Priya adopt?", k=3)      # no sender of that name
    assert EMBEDDED == ["Which pet did Priya adopt?"]


def test_in_the_dense_ranking_what_the_person_asked_about_said_leads(archive):
    [to_her] = archive.append([said("I really love parrots, Melanie", "Caroline")])
    [hers] = archive.append([said("my parrot is called Kiwi", "Melanie")])
    recall = Recall(archive, {}, dense=dense(archive, MODEL))
    ranked, _ = recall.ranked(EMACS, "What is the name of Melanie's parrot?", k=5)
    by_dense = sorted((r for r in ranked if r.dense is not None), key=lambda r: r.dense)
    assert [r.hit.id for r in by_dense] == [hers.id, to_her.id]


def test_dense_candidates_hold_each_text_once(archive):
    archive.append([said("see you tomorrow then", "Jonas") for _ in range(6)])
    [other] = archive.append([said("see you at the station tomorrow", "Aiko")])
    found = dense(archive, MODEL, max_candidates=2).rank([CLI], "see you tomorrow")
    assert [h.text for h in found] == ["see you tomorrow then", other.text]


# -- the nearest vectors -----------------------------------------------------------------


def blocks_of(rng: random.Random, sizes: list[int], dimensions: int = 16) -> list[VectorBlock]:
    """Blocks of random unit vectors, one id and epoch each (ids distinct)."""
    blocks, number = [], 0
    for size in sizes:
        block = VectorBlock()
        for _ in range(size):
            vector = [rng.gauss(0, 1) for _ in range(dimensions)]
            length = sum(x * x for x in vector) ** 0.5
            block.add(f"m{number}", float(number), array("f", [x / length for x in vector]))
            number += 1
        blocks.append(block)
    return blocks


@pytest.mark.parametrize("since, window, excluded", [
    (float("-inf"), None, 0),
    (40.0, None, 3),
    (float("-inf"), (10.0, 30.0), 2),
    (100.0, (110.0, 200.0), 5),
    (1000.0, None, 0),                       # nothing left to search
])
def test_numpy_and_plain_python_find_the_same_nearest(monkeypatch, since, window, excluded):
    pytest.importorskip("numpy")
    rng = random.Random(7)
    blocks = blocks_of(rng, [0, 90, 1, 140])
    query = array("f", [rng.gauss(0, 1) for _ in range(16)])
    exclude = {f"m{n}" for n in rng.sample(range(231), 30)[:excluded]} | {"not-a-vector"}
    for limit in (1, 7, 400):
        fast = nearest(blocks, query, limit, since=since, exclude=exclude, window=window)
        monkeypatch.setattr(nearest_module, "_numpy", False)
        plain = nearest(blocks, query, limit, since=since, exclude=exclude, window=window)
        monkeypatch.undo()
        assert [i for i, _ in fast] == [i for i, _ in plain]
        assert [s for _, s in fast] == pytest.approx([s for _, s in plain], abs=1e-6)
        assert not {i for i, _ in fast} & exclude
        assert all(int(i[1:]) >= since for i, _ in fast)
        if window is not None and fast:
            inside = [window[0] <= int(i[1:]) < window[1] for i, _ in fast]
            assert inside == sorted(inside, reverse=True)       # said within it: first


def test_a_search_leaves_its_blocks_growable():
    pytest.importorskip("numpy")
    [block] = blocks_of(random.Random(1), [20])
    nearest([block], array("f", [1.0] + [0.0] * 15), 5, since=float("-inf"), exclude=set(),
            window=(0.0, 5.0))
    block.add("late", 99.0, array("f", [1.0] + [0.0] * 15))     # no view of its data outlives
    found = nearest([block], array("f", [1.0] + [0.0] * 15), 1, since=float("-inf"),
                    exclude=set(), window=None)
    assert found[0][0] == "late"
