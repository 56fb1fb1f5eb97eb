"""The skill compile cache: hits give the same skills, edits and corruption miss safely."""

from __future__ import annotations

import stat
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

import opencortex.skills.loader as loader
from opencortex.events import ChatMessage
from opencortex.skills import SkillContext, SkillRegistry
from opencortex.skills.compile_cache import SWITCH, CompileCache, cache_enabled
from test_skills import line_of, write

NOTE = """\
#+TITLE: Cached
* A reader macro and a macro, used in later blocks
#+begin_src hy
(defreader up (.upper (.parse-one-form &reader)))
(defmacro twice [x] `(+ ~x ~x))
#+end_src
Prose between the blocks.
#+begin_src hy
(defn cached? [ctx] (.startswith (. ctx event text) "hi"))
(defn fragile [ctx]
  (raise (ValueError "boom")))
#+end_src
#+begin_src hy
(defskill cached
  :priority (twice 21)
  :description #up "quiet"
  :trigger cached?
  :deterministic (fn [action ctx] (fragile ctx)))
#+end_src
"""


@pytest.fixture(autouse=True)
def cache_switched_on(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)


@pytest.fixture
def compiles(monkeypatch) -> list[int]:
    """One entry per form the loader compiles (none on a cache hit)."""
    counted: list[int] = []
    real = loader.compile_form

    def counting(form, *args):
        counted.append(form.start_line)
        return real(form, *args)
    monkeypatch.setattr(loader, "compile_form", counting)
    return counted




def load(skills: Path, cache: Path) -> SkillRegistry:
    """A fresh registry over SKILLS with CACHE, loaded without errors."""
    registry = SkillRegistry([skills], cache_dir=cache)
    assert registry.load() == []
    return registry


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.bin"))


def context(text: str = "hi there") -> SkillContext:
    return SkillContext(ChatMessage(text=text, channel="cli", chat_id="local"))


def test_a_hit_gives_the_same_skills_without_compiling(tmp_path, compiles):
    path = write(tmp_path / "skills" / "cached.org", NOTE)
    first = load(tmp_path / "skills", tmp_path / "cache").get("cached")
    assert compiles and len(entries(tmp_path / "cache")) == 1
    compiles.clear()
    again = load(tmp_path / "skills", tmp_path / "cache").get("cached")
    assert compiles == []
    for name in ("name", "priority", "description", "line", "source"):
        assert getattr(again, name) == getattr(first, name)
    assert (again.priority, again.description, again.source) == (42, "QUIET", path)
    assert again.line == line_of(NOTE, "(defskill cached")
    assert again.trigger(context("hi")) and not again.trigger(context("bye"))
    assert again.module != first.module and again.module in sys.modules


def test_a_runtime_traceback_from_a_hit_names_the_org_file_and_line(tmp_path):
    path = write(tmp_path / "skills" / "cached.org", NOTE)
    load(tmp_path / "skills", tmp_path / "cache")
    skill = load(tmp_path / "skills", tmp_path / "cache").get("cached")
    with pytest.raises(ValueError) as caught:
        skill.deterministic(None, context())
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(caught.tb)]
    assert (str(path), line_of(NOTE, '(raise (ValueError "boom"))')) in frames


def test_a_load_error_from_a_hit_names_the_file_and_line(tmp_path, monkeypatch):
    note = """\
    * Fails only when asked to, so that it is cached first
    #+begin_src hy
    (import os)
    (defskill moody :trigger (fn [ctx] True))
    (when (os.environ.get "OC_TEST_MOODY")
      (raise (RuntimeError "in a mood")))
    #+end_src
    """
    path = write(tmp_path / "skills" / "moody.org", note)
    load(tmp_path / "skills", tmp_path / "cache")
    monkeypatch.setenv("OC_TEST_MOODY", "1")
    [error] = SkillRegistry([tmp_path / "skills"], cache_dir=tmp_path / "cache").load()
    assert error.path == path and error.line == line_of(textwrap.dedent(note), "(raise")
    assert "RuntimeError: in a mood" in str(error)


def test_an_edited_file_is_compiled_again_and_replaces_its_entry(tmp_path, compiles):
    path = write(tmp_path / "skills" / "edit.hy", '(defskill edit :trigger (fn [ctx] True) :description "v1")\n')
    registry = load(tmp_path / "skills", tmp_path / "cache")
    [old] = entries(tmp_path / "cache")
    path.write_text('(defskill edit :trigger (fn [ctx] True) :description "v2")\n', encoding="utf-8")
    compiles.clear()
    assert registry.reload() == []
    assert registry.get("edit").description == "v2" and compiles == [1]
    [new] = entries(tmp_path / "cache")
    assert new != old
    compiles.clear()
    assert load(tmp_path / "skills", tmp_path / "cache").get("edit").description == "v2"
    assert compiles == []


def test_an_edited_helper_macro_invalidates_the_skills_that_used_it(tmp_path, compiles):
    skills = tmp_path / "skills"
    helper = write(skills / "_macros.hy", "(defmacro shout [s] (.upper s))\n")
    write(skills / "loud.org", """\
    #+begin_src hy
    (require _macros [shout])
    (defskill loud :trigger (fn [ctx] True) :description (shout "hey"))
    #+end_src
    """)
    assert load(skills, tmp_path / "cache").get("loud").description == "HEY"
    compiles.clear()
    assert load(skills, tmp_path / "cache").get("loud").description == "HEY"
    assert compiles == []                       # the skill and its helper came from the cache
    helper.write_text("(defmacro shout [s] (.lower s))\n", encoding="utf-8")
    assert load(skills, tmp_path / "cache").get("loud").description == "hey"
    assert compiles


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "garbage"])
def test_a_corrupt_entry_is_compiled_again_and_replaced(tmp_path, compiles, damage):
    write(tmp_path / "skills" / "cached.org", NOTE)
    load(tmp_path / "skills", tmp_path / "cache")
    [entry] = entries(tmp_path / "cache")
    data = entry.read_bytes()
    entry.write_bytes({"empty": b"", "truncated": data[:len(data) // 2],
                       "flipped": data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:],
                       "garbage": b"\x00" * len(data)}[damage])
    compiles.clear()
    assert load(tmp_path / "skills", tmp_path / "cache").get("cached").description == "QUIET"
    assert compiles
    assert entry.read_bytes() == data           # written again, whole
    compiles.clear()
    load(tmp_path / "skills", tmp_path / "cache")
    assert compiles == []


def test_cache_files_are_private(tmp_path):
    write(tmp_path / "skills" / "cached.org", NOTE)
    load(tmp_path / "skills", tmp_path / "cache")
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
    files = list((tmp_path / "cache").iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert not [f for f in files if f.name.startswith(".")]   # no temporary file left


def test_a_compile_time_only_binding_is_never_cached(tmp_path):
    write(tmp_path / "skills" / "early.hy", """\
    (eval-when-compile (setv ANSWER 42))
    (defskill early :trigger (fn [ctx] True) :priority ANSWER)
    """)
    assert load(tmp_path / "skills", tmp_path / "cache").get("early").priority == 42
    assert entries(tmp_path / "cache") == []
    assert load(tmp_path / "skills", tmp_path / "cache").get("early").priority == 42


def test_a_binding_made_at_compile_time_and_at_run_time_is_cached(tmp_path, compiles):
    write(tmp_path / "skills" / "both.hy", """\
    (eval-and-compile (import string))
    (defmacro letters [] (len string.ascii_lowercase))
    (defskill both :trigger (fn [ctx] True) :priority (letters) :description (string.capwords "a b"))
    """)
    assert load(tmp_path / "skills", tmp_path / "cache").get("both").priority == 26
    compiles.clear()
    again = load(tmp_path / "skills", tmp_path / "cache").get("both")
    assert (again.priority, again.description, compiles) == (26, "A B", [])


def test_the_switch_turns_the_cache_off(tmp_path, monkeypatch, compiles):
    monkeypatch.setenv(SWITCH, "0")
    write(tmp_path / "skills" / "cached.org", NOTE)
    load(tmp_path / "skills", tmp_path / "cache")
    load(tmp_path / "skills", tmp_path / "cache")
    assert not (tmp_path / "cache").exists() and len(set(compiles)) < len(compiles)
    assert not cache_enabled({SWITCH: "off"}) and cache_enabled({})


def test_the_key_covers_text_path_hy_and_the_kernel_dsl(tmp_path, monkeypatch):
    import hy
    import opencortex.skills.compile_cache as compile_cache
    cache = CompileCache(tmp_path)
    key = cache.key(tmp_path / "a.org", "(setv x 1)")
    assert cache.key(tmp_path / "a.org", "(setv x 2)") != key
    assert cache.key(tmp_path / "b.org", "(setv x 1)") != key
    monkeypatch.setattr(hy, "__version__", "0.0.0-other")
    assert cache.key(tmp_path / "a.org", "(setv x 1)") != key
    monkeypatch.undo()
    monkeypatch.setattr(compile_cache, "kernel_fingerprint", lambda: b"another dsl.hy")
    assert cache.key(tmp_path / "a.org", "(setv x 1)") != key


def test_every_kernel_hy_file_is_in_the_fingerprint():
    from opencortex.skills.compile_cache import KERNEL_SKILLS, kernel_fingerprint
    assert list(KERNEL_SKILLS.glob("*.hy"))              # dsl.hy at least
    assert kernel_fingerprint() == kernel_fingerprint()  # computed once per process


def test_an_unwritable_cache_only_costs_the_cache(tmp_path, caplog):
    write(tmp_path / "skills" / "cached.org", NOTE)
    write(tmp_path / "skills" / "other.hy", "(defskill other :trigger (fn [ctx] True))\n")
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    registry = load(tmp_path / "skills", tmp_path / "cache")
    assert registry.get("cached").description == "QUIET" and registry.get("other")
    assert len([r for r in caplog.records if "cannot be written" in r.getMessage()]) == 1
