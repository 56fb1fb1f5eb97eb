"""`[memory] stemmer`: the index's stemming is the archive's setting, used by every command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from conftest import cli_env
from opencortex.conversation.recall import Recall
from opencortex.events import Thread
from opencortex.memory import Archive
from opencortex.memory.embedding_settings import MemorySettings
from test_recall import say

CLI = Thread("cli", "local")
EMACS = Thread("emacs", "notes")


def oc(home, *args):
    return subprocess.run([sys.executable, "-m", "opencortex", *args], capture_output=True,
                          text=True, timeout=120, env=cli_env(home))


def found(home, words: str) -> list[str]:
    run = oc(home, "memory", "search", words, "--json")
    assert run.returncode == 0, run.stderr
    return [hit["text"] for hit in json.loads(run.stdout)["hits"]]


def test_the_stemmer_is_configured_per_archive_and_changing_it_rebuilds_the_index(
        home, tmp_path):
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({"thread": "cli:old", "role": "user", "timestamp": 1.7e9,
                                   "text": "I donated my bikes"}) + "\n")
    assert oc(home, "memory", "import", str(history)).returncode == 0
    assert found(home, "donate") == ["I donated my bikes"]          # porter by default
    assert "porter stemming" in oc(home, "doctor").stdout
    (home / "config.toml").write_text('[memory]\nstemmer = "none"\n')
    assert found(home, "donate") == [] and found(home, "donated") == ["I donated my bikes"]
    assert "no stemming ([memory] stemmer)" in oc(home, "doctor").stdout


def test_an_unknown_stemmer_is_refused():
    with pytest.raises(ValidationError):
        MemorySettings(stemmer="snowball")
    assert MemorySettings().tokenizer == "porter"
    assert MemorySettings(stemmer="none").tokenizer == "unicode61"
    assert MemorySettings(stemmer=" German ").tokenizer == "snowball-german"
    assert MemorySettings(stemmer="english").tokenizer == "snowball-english"
    with pytest.raises(ValidationError):
        MemorySettings(stemmer="porter2")


# -- Snowball stemmers (PyStemmer): archives in other languages -----------------------

def texts(hits) -> list[str]:
    return [hit.text for hit in hits]


def test_a_snowball_stemmer_finds_the_other_forms_of_a_word_in_its_language(tmp_path):
    with Archive(tmp_path / "de", tokenizer="snowball-german") as german:
        german.append([say("Wir haben drei Häuser gekauft", CLI),
                       say("Das Wetter ist schön", CLI)])
        for question in ("Haus", "hauses", "Wo sind die Häuser?"):
            assert texts(german.search(question)) == ["Wir haben drei Häuser gekauft"], question
        [hit] = german.search("Haus", snippets=True)
        assert hit.snippet == "Wir haben drei Häuser gekauft"     # the text as written
        assert hit.matched == ["haus"]                              # the stem it matched
    with Archive(tmp_path / "ru", tokenizer="snowball-russian") as russian:
        russian.append([say("Я купил новые книги вчера", CLI)])
        assert texts(russian.search("книга")) == ["Я купил новые книги вчера"]
        assert texts(russian.search("Какую книгу я купил?")) == ["Я купил новые книги вчера"]
    with Archive(tmp_path / "plain", tokenizer="unicode61") as plain:    # no stemmer: as written
        plain.append([say("Я купил новые книги вчера", CLI)])
        assert plain.search("книга") == []


def test_with_a_snowball_stemmer_each_part_of_a_joined_word_is_searched(tmp_path):
    with Archive(tmp_path / "de", tokenizer="snowball-german") as german:
        german.append([say("Der Verkauf der Häuser beginnt morgen", CLI)])
        assert texts(german.search("Häuser-Verkauf")) == ["Der Verkauf der Häuser beginnt morgen"]


def test_recall_with_a_snowball_stemmer_and_the_english_one_keeps_verb_forms(tmp_path):
    with Archive(tmp_path / "es", tokenizer="snowball-spanish") as spanish:
        spanish.append([say("Mis hermanas viven en Sevilla", CLI), say("hola", CLI)])
        recalled = Recall(spanish, {}).recall(EMACS, "¿Dónde vive tu hermana?", k=5)
        assert [e.text.split("] ", 1)[1] for e in recalled] == ["Mis hermanas viven en Sevilla"]
    with Archive(tmp_path / "en", tokenizer="snowball-english") as english:
        english.append([say("I ran the Berlin marathon", CLI)])
        assert texts(english.search("run")) == ["I ran the Berlin marathon"]   # verb forms
        assert texts(english.search("marathons")) == ["I ran the Berlin marathon"]


def test_a_snowball_stemmer_is_configured_by_language_and_the_index_follows_it(home, tmp_path):
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({"thread": "cli:old", "role": "user", "timestamp": 1.7e9,
                                   "text": "Я купил новые книги вчера"}) + "\n")
    (home / "config.toml").write_text('[memory]\nstemmer = "russian"\n')
    assert oc(home, "memory", "import", str(history)).returncode == 0
    assert found(home, "книга") == ["Я купил новые книги вчера"]
    assert "Snowball stemming (russian)" in oc(home, "doctor").stdout
    (home / "config.toml").write_text('[memory]\nstemmer = "porter"\n')   # rebuilt: as written
    assert found(home, "книга") == [] and found(home, "книги") == ["Я купил новые книги вчера"]
    (home / "config.toml").write_text('[memory]\nstemmer = "klingon"\n')
    run = oc(home, "memory", "search", "книга")
    assert run.returncode != 0 and "unknown stemmer 'klingon'" in run.stderr
    assert "russian" in run.stderr                                   # the languages offered


def test_a_snowball_stemmer_without_pystemmer_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "Stemmer", None)                 # not installed
    with pytest.raises(ValidationError, match="install.sh stemming"):
        MemorySettings(stemmer="german")
    assert MemorySettings(stemmer="porter").tokenizer == "porter"     # not needed then


def test_snowball_stems_are_the_same_for_composed_and_decomposed_accents_and_in_any_thread():
    from concurrent.futures import ThreadPoolExecutor
    import unicodedata
    from opencortex.memory.stems import query_stemmer, stems_of, terms_function, word_stemmer
    terms, searched = terms_function("snowball-german"), query_stemmer("snowball-german")
    composed = "Die Häuser der Straßen"
    decomposed = unicodedata.normalize("NFD", composed)          # as some keyboards send it
    stem = word_stemmer("german")
    assert stems_of(decomposed, stem) == stems_of(composed, stem) == ["haus", "strass"]
    assert searched([unicodedata.normalize("NFD", "Häuser")]) == ["haus"]
    words = [f"Häuser{n % 7} Bäuerinnen laufenden Straßen" for n in range(2000)]
    alone = [terms(text) for text in words]
    with ThreadPoolExecutor(4) as pool:        # each thread stems with an object of its own
        assert list(pool.map(terms, words)) == alone
