"""Optional dense recall (issue 13): a local embedding model fused with the lexical ranking.

The only model here is `trigrams` below, a deterministic bag-of-character-
trigrams hashing embedder: it tests the plumbing (lazy loading, bounded
filling, fusion, owner scope, fallbacks), not recall quality.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest

from opencortex.config import ConfigError, load_config
from opencortex.conversation.dense import DenseRecall
from opencortex.conversation.fusion import fuse
from opencortex.conversation.recall import Recall
from opencortex.doctor import _recall as doctor_recall
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
from opencortex.memory.embedders import Embedder, EmbedderError
from opencortex.memory.embedding_settings import EmbeddingSettings
from opencortex.memory.retention import forget
from opencortex.memory.vectors import VECTORS_NAME

REPO = Path(__file__).resolve().parents[1]
CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")
ALICE = Thread("telegram", "1001")
BOB = Thread("telegram", "1002")
DIMENSIONS = 256
CALLS: list[int] = []          # texts per call of `trigrams`
MODEL = "python:test_embeddings:trigrams"


def trigrams(texts: list[str]) -> list[list[float]]:
    """Each text as hashed counts of its lower-case character trigrams, unit length."""
    CALLS.append(len(texts))
    vectors = []
    for text in texts:
        vector = [0.0] * DIMENSIONS
        padded = f"  {text.lower()}  "
        for i in range(len(padded) - 2):
            vector[zlib.crc32(padded[i:i + 3].encode()) % DIMENSIONS] += 1.0
        length = math.sqrt(sum(x * x for x in vector)) or 1.0
        vectors.append([x / length for x in vector])
    return vectors


def one_short(texts: list[str]) -> list[list[float]]:
    """A broken model: one vector too few."""
    return trigrams(texts)[:-1]


def explodes(texts: list[str]) -> list[list[float]]:
    """A broken model: it raises, quoting its input (which must not reach the log)."""
    raise RuntimeError(f"cannot embed {texts!r}")


@pytest.fixture
def archive(tmp_path):
    with Archive(tmp_path / "memory") as opened:
        yield opened


@pytest.fixture(autouse=True)
def fresh_calls():
    CALLS.clear()


def say(text: str, thread: Thread, **fields) -> NewMessage:
    return NewMessage(role="user", text=text, thread=thread, **fields)


def dense(archive: Archive, model: str = MODEL, **settings) -> DenseRecall:
    settings = {"min_similarity": 0.0, **settings}
    return DenseRecall(archive, EmbeddingSettings(model=model, **settings))


def vector_count(archive: Archive) -> int:
    import sqlite3
    db = sqlite3.connect(archive.root / VECTORS_NAME)
    try:
        return db.execute("SELECT count(*) FROM vectors").fetchone()[0]
    finally:
        db.close()


# -- never required ------------------------------------------------------------------


def test_without_a_model_nothing_is_imported_or_created(tmp_path):
    script = f"""
import sys
from opencortex.config import load_config
from opencortex.conversation.conversations import Conversations
from opencortex.events import Thread
from opencortex.memory import Archive, NewMessage
config = load_config({str(tmp_path / 'home')!r})
assert config.memory.embeddings.model is None
with Archive(config.memory_dir) as archive:
    archive.append([NewMessage(role="user", text="walrus on port 5433", thread=Thread("cli", "a"))])
    recall = Conversations(archive, config.conversation).recall
    assert recall.dense is None
    assert [e.id for e in recall.recall(Thread("emacs", "b"), "walrus", k=3)]
    print("searched for" in recall.explain(Thread("emacs", "b"), "walrus"))
print(sorted(m for m in sys.modules if m.startswith(("sentence_transformers", "numpy",
      "torch", "opencortex.memory.vectors", "opencortex.memory.embedders"))))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["True", "[]"]
    files = [p.name for p in (tmp_path / "home" / "memory").iterdir() if p.is_file()]
    assert "index.sqlite" in files and not any(name.startswith("vectors") for name in files)


def test_the_recall_explanation_is_unchanged_without_a_model(archive):
    assert DenseRecall.from_settings(archive, EmbeddingSettings()) is None
    archive.append([say("the staging database is on port 5433", CLI)])
    text = Recall(archive, {}).explain(EMACS, "staging database")
    assert "ranking:" not in text and "fused" not in text
    assert "1. score " in text and "matched: staging, database" in text


def test_settings_name_a_local_model_or_a_python_function(home):
    assert EmbeddingSettings().model is None
    assert EmbeddingSettings(model="  ").model is None
    assert EmbeddingSettings(model="sentence-transformers:/opt/m").model == \
        "sentence-transformers:/opt/m"
    for bad in ("sentence-transformers:models/minilm", "sentence-transformers:",
                "python:not a path", "python:module", "hub:all-MiniLM-L6-v2", "all-MiniLM"):
        with pytest.raises(ValueError, match="embedding model"):
            EmbeddingSettings(model=bad)
    (home / "config.toml").write_text('[memory.embeddings]\nmodel = "python:pkg.mod:fn"\n'
                                      'k = 30\nweight = 0.5\n')
    embeddings = load_config(home).memory.embeddings
    assert (embeddings.model, embeddings.k, embeddings.weight) == ("python:pkg.mod:fn", 30, 0.5)
    (home / "config.toml").write_text('[memory.embeddings]\nmodel = "sentence-transformers:x"\n')
    with pytest.raises(ConfigError, match="absolute path of a local model directory"):
        load_config(home)


# -- providers -----------------------------------------------------------------------


def test_a_python_model_is_loaded_lazily_and_its_vectors_checked():
    embedder = Embedder(MODEL)
    assert CALLS == []
    first, second = embedder.embed(["hello there", "hello there"])
    assert first.typecode == "f" and len(first) == DIMENSIONS == embedder.dimensions
    assert abs(sum(x * x for x in first) - 1.0) < 1e-5 and first == second
    for spec, message in (("python:test_embeddings:one_short", "1 vector"),
                          ("python:test_embeddings:explodes", "failed on 2 text"),
                          ("python:no_such_module_here:f", "cannot import"),
                          ("python:test_embeddings:DIMENSIONS", "has no function")):
        with pytest.raises(EmbedderError, match=message) as caught:
            Embedder(spec).embed(["secret words", "more"])
        assert "secret" not in str(caught.value)


@pytest.mark.parametrize("output, message", [
    ([[1.0, 0.0], [1.0]], "dimensions"),
    ([[1.0, float("nan")], [0.0, 1.0]], "finite"),
    ([["a", "b"], [0.0, 1.0]], "lists of numbers"),
    ("no", "returned str"),
])
def test_unusable_vectors_are_refused(monkeypatch, output, message):
    module = types.ModuleType("fake_model")
    module.embed = lambda texts: output
    monkeypatch.setitem(sys.modules, "fake_model", module)
    with pytest.raises(EmbedderError, match=message):
        Embedder("python:fake_model:embed").embed(["a", "b"])


def test_a_sentence_transformers_model_is_read_from_its_local_directory(monkeypatch, tmp_path):
    missing = Embedder(f"sentence-transformers:{tmp_path / 'nowhere'}")
    with pytest.raises(EmbedderError, match="no such directory"):
        missing.load()
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)    # not installed
    with pytest.raises(EmbedderError, match="pip install sentence-transformers"):
        Embedder(f"sentence-transformers:{tmp_path}").load()
    loaded = []

    class SentenceTransformer:            # the documented API, standing in for the package
        def __init__(self, path):
            loaded.append(path)

        def encode(self, texts, normalize_embeddings=False):
            assert normalize_embeddings is True
            return [[3.0, 4.0] for _ in texts]

    module = types.ModuleType("sentence_transformers")
    module.SentenceTransformer = SentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", module)
    embedder = Embedder(f"sentence-transformers:{tmp_path}")
    assert loaded == []
    [vector] = embedder.embed(["x"])
    assert loaded == [str(tmp_path)] and list(vector) == pytest.approx([0.6, 0.8])


# -- fusion --------------------------------------------------------------------------


def test_reciprocal_rank_fusion_adds_the_votes_of_both_lists(archive):
    records = archive.append([say(f"message {n}", CLI) for n in range(4)])
    hits = [h for r in records for h in archive.search(r.text.split()[1], thread=CLI)]
    a, b, c, d = hits
    fused = fuse([a, b, c], [c, d], k=60)
    assert [r.hit.id for r in fused] == [c.id, a.id, b.id, d.id]
    assert fused[0].fused == pytest.approx(1 / 63 + 1 / 61)
    assert (fused[0].lexical, fused[0].dense) == (3, 1)
    assert (fused[3].lexical, fused[3].dense) == (None, 2)
    assert [r.hit.id for r in fuse([a, b], [b, a], k=60)] == [a.id, b.id]   # a tie: lexical order
    assert [r.hit.id for r in fuse([a], [d], k=60, weight=2.0)] == [d.id, a.id]
    with pytest.raises(ValueError):
        fuse([a], [b], k=0)


# -- dense recall --------------------------------------------------------------------


def test_a_dense_match_without_a_shared_word_is_recalled(archive):
    archive.append([say("the staging database is on port 5433", CLI),
                    say("we should buy more coffee beans", CLI)])
    [target] = archive.append([say("photography exhibition in kwazulu", CLI)])
    assert archive.search("photographs", thread=CLI) == []        # stems differ: no lexical hit
    assert Recall(archive, {}).recall(EMACS, "photographs", k=3) == []
    recall = Recall(archive, {}, dense=dense(archive))
    entries = recall.recall(EMACS, "photographs", k=1)
    assert [e.id for e in entries] == [target.id]
    assert entries[0].text.startswith("[recalled from cli:local, ")
    hits, _ = recall.hits(EMACS, "photographs", k=1)
    assert hits[0].score == pytest.approx(1 / 61)                   # the fused score


def test_recall_explains_which_ranking_found_each_hit(archive):
    [both] = archive.append([say("photographs of the staging database", CLI)])
    [dense_only] = archive.append([say("photography exhibition in kwazulu", CLI)])
    recall = Recall(archive, {}, dense=dense(archive))
    text = recall.explain(EMACS, "photographs")
    assert f"ranking: lexical + dense ({MODEL}), fused by RRF (k=60, dense weight 1)" in text
    lines = text.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith("1. "))
    assert lines[first].startswith(f"1. fused {1 / 61 + 1 / 61:.4f} (lexical #1, dense #1), ")
    assert "matched: photographs" in lines[first]
    assert lines[first + 1].strip() == both.text
    assert lines[first + 2].startswith(f"2. fused {1 / 62:.4f} (lexical -, dense #2), ")
    assert lines[first + 3].strip() == dense_only.text


def test_vectors_are_filled_lazily_in_bounded_batches(archive):
    archive.append([say(f"note number {n} about walruses", CLI) for n in range(10)])
    archive.append([NewMessage(role="system", text="pin", thread=CLI, turn_type="silence",
                               parent=None, extra={"CONTROL": "pin", "TARGET": "x",
                                                   "BRANCH": "main"})])
    ranking = dense(archive, batch=4)
    recall = Recall(archive, {}, dense=ranking)
    assert not (archive.root / VECTORS_NAME).exists() and CALLS == []
    counts = []
    for _ in range(4):
        recall.recall(EMACS, "walruses", k=2)
        counts.append(vector_count(archive))
    assert counts == [4, 8, 10, 10]                 # control records are never embedded
    assert max(CALLS) <= 4 and sum(CALLS) == 10 + 4  # each message once, plus one question each
    newest_first = ranking.store.pending([CLI], 4)
    assert newest_first.rows == []
    CALLS.clear()
    again = Recall(archive, {}, dense=dense(archive, batch=4))     # a restart: vectors kept
    again.recall(EMACS, "walruses", k=2)
    assert CALLS == [1]
    [later] = archive.append([say("a new walrus note", CLI)])
    again.recall(EMACS, "walruses", k=2)
    assert CALLS == [1, 1, 1] and vector_count(archive) == 11
    assert later.id in {h.id for h in again.hits(EMACS, "walrus", k=1)[0]}


def test_each_batch_embeds_the_newest_messages_first(archive):
    records = archive.append([say(f"walrus fact {n}", CLI) for n in range(6)])
    ranking = dense(archive, batch=2)
    pending = ranking.store.pending([CLI], 2)
    assert [row[1] for row in pending.rows] == [records[5].id, records[4].id]


def test_dense_recall_never_crosses_owners(archive):
    canary = "canary zebra-quokka 7731 photography"
    archive.append([say(canary, ALICE), say("alice talks about lunch", ALICE)])
    archive.append([say("bob likes photographs of trains", BOB)])
    [mine] = archive.append([say("my own photography notes", CLI)])
    ranking = dense(archive)
    recall = Recall(archive, {}, dense=ranking)
    for asking in (BOB, CLI, EMACS):
        for k in (1, 5, 20):
            texts = [e.text for e in recall.recall(asking, canary, k=k)]
            assert not any("canary" in text for text in texts), asking
        shown = recall.explain(asking, canary, k=20).splitlines()[1:]
        assert not any("canary" in line for line in shown)
    hits, _ = recall.hits(CLI, canary, k=20)
    assert {h.thread for h in hits} == {CLI} and mine.id in {h.id for h in hits}
    import sqlite3
    db = sqlite3.connect(archive.root / VECTORS_NAME)
    embedded = {tuple(row) for row in db.execute("SELECT DISTINCT channel, chat_id FROM vectors")}
    db.close()
    assert embedded == {tuple(BOB), tuple(CLI)}        # alice's messages were never embedded
    shared = Recall(archive, {}, ["telegram:1001"], dense=ranking)
    assert any("canary" in e.text for e in shared.recall(BOB, canary, k=1))


def test_dense_recall_follows_a_configured_owner_mapping(archive):
    archive.append([say("kwazulu photography from alice", ALICE)])
    ranking = dense(archive)
    mapped = Recall(archive, {"telegram:1001": "local"}, dense=ranking)
    assert [e.thread for e in (mapped.hits(EMACS, "photographs", k=1)[0])] == [ALICE]
    unmapped = Recall(archive, {}, dense=ranking)
    assert unmapped.hits(EMACS, "photographs", k=1)[0] == []


def test_forgotten_messages_lose_their_vectors(archive):
    old = archive.append([say("photography exhibition in kwazulu", CLI, timestamp=1000.0)])
    archive.append([say("a newer note on walruses", CLI, timestamp=2000.0)])
    recall = Recall(archive, {}, dense=dense(archive))
    assert [e.id for e in recall.recall(EMACS, "photographs", k=1)] == [old[0].id]
    assert vector_count(archive) == 2
    assert forget(archive, CLI, before=1500.0) == 1
    assert old[0].id not in [e.id for e in recall.recall(EMACS, "photographs", k=5)]
    assert vector_count(archive) == 1


def test_another_model_starts_the_vectors_again(archive):
    archive.append([say("walrus", CLI)])
    Recall(archive, {}, dense=dense(archive)).recall(EMACS, "walrus")
    assert vector_count(archive) == 1
    CALLS.clear()
    other = dense(archive, model="python:test_embeddings:trigrams_again")
    Recall(archive, {}, dense=other).recall(EMACS, "walrus")
    assert CALLS == [1, 1] and vector_count(archive) == 1


trigrams_again = trigrams


def test_only_the_newest_max_vectors_are_searched(archive, caplog):
    [old] = archive.append([say("photography exhibition in kwazulu", CLI, timestamp=1000.0)])
    archive.append([say(f"walrus {n}", CLI, timestamp=2000.0 + n) for n in range(3)])
    recall = Recall(archive, {}, dense=dense(archive, max_vectors=3))
    with caplog.at_level(logging.WARNING):
        found = [h.id for h in recall.hits(EMACS, "photographs", k=5)[0]]
        recall.hits(EMACS, "photographs", k=5)
    assert old.id not in found and len(found) == 3
    assert len([r for r in caplog.records if "over max_vectors = 3" in r.getMessage()]) == 1


# -- broken providers ------------------------------------------------------------------


@pytest.mark.parametrize("model, off", [
    ("python:no_such_module_here:embed", True),
    ("python:test_embeddings:one_short", False),
    ("python:test_embeddings:explodes", False),
])
def test_a_broken_model_leaves_recall_lexical_with_one_warning(archive, caplog, model, off):
    [fact] = archive.append([say("the secret staging database is on port 5433", CLI)])
    archive.append([say("photography exhibition in kwazulu", CLI)])
    ranking = dense(archive, model=model)
    recall = Recall(archive, {}, dense=ranking)
    with caplog.at_level(logging.DEBUG, logger="opencortex"):
        for _ in range(3):
            assert [e.id for e in recall.recall(EMACS, "staging database", k=3)] == [fact.id]
        text = recall.explain(EMACS, "staging database")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "dense recall" in warnings[0].getMessage()
    assert "secret" not in caplog.text and "5433" not in caplog.text
    assert (ranking.off is not None) == off
    assert "1. score " in text
    assert ("is off" in text) if off else ("failed this time" in text)


# -- doctor and the evaluation -------------------------------------------------------------


def test_doctor_says_how_recall_ranks(home):
    check = doctor_recall(load_config(home))
    assert check.ok and check.detail.startswith("lexical: per-owner FTS5")
    (home / "config.toml").write_text(f'[memory.embeddings]\nmodel = "{MODEL}"\n')
    check = doctor_recall(load_config(home))
    assert check.ok and check.detail.startswith(
        f"lexical + dense ({MODEL}, {DIMENSIONS} dimensions), fused by RRF")
    (home / "config.toml").write_text('[memory.embeddings]\nmodel = "python:no_such_mod:f"\n')
    check = doctor_recall(load_config(home))
    assert not check.ok and "cannot import no_such_mod" in check.detail
    assert check.detail.startswith("lexical only") and "[memory.embeddings]" in check.fix


def test_the_memory_evaluation_measures_a_python_embedder():
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_memory_eval.py"), "--quick",
         "--embedder", MODEL], capture_output=True, text=True, timeout=300, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO / "tests")})
    assert run.returncode == 0, run.stderr
    assert f"fused with {MODEL}" in run.stdout and "R@5" in run.stdout
