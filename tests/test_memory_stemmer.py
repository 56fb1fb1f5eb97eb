"""`[memory] stemmer`: the index's stemming is the archive's setting, used by every command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from conftest import cli_env
from opencortex.memory.embedding_settings import MemorySettings


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
