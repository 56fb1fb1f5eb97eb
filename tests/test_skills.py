"""Skills: defskill, loading .org notes and .hy files, the registry, reload."""

from __future__ import annotations

import logging
import sys
import textwrap
import traceback
import types
from pathlib import Path

import hy
import pytest

from opencortex.events import ChatMessage, Thread
from opencortex.skills import (
    NeedsApproval, Rejection, Skill, SkillContext, SkillError, SkillRegistry,
    needs_approval, org_code_blocks, reject)

GREETER = """\
#+TITLE: Greeter
* Trigger
#+begin_src hy
(defn greeting? [ctx] (.startswith (. ctx event text) "hello"))
#+end_src
* Registration
#+begin_src hy
(defskill greeter
  :priority 20
  :description "Says hello."
  :trigger greeting?
  :probabilistic (fn [ctx] {"system" "Be brief." "messages" [{"role" "user" "content" (. ctx event text)}]})
  :deterministic (fn [action ctx] None))
#+end_src
"""

ALWAYS = "(defskill {name} :trigger (fn [ctx] True) :priority {priority})\n"


def write(path: Path, text: str) -> Path:
    """Write TEXT (dedented) to PATH as UTF-8."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(text: str, needle: str) -> int:
    """1-based number of the first line of TEXT containing NEEDLE."""
    return next(n for n, line in enumerate(text.split("\n"), 1) if needle in line)


def context(text: str = "hello there", **fields) -> SkillContext:
    return SkillContext(ChatMessage(text=text, channel="cli", chat_id="local"), **fields)


def loaded(*directories: Path) -> SkillRegistry:
    """A registry over DIRECTORIES that loaded without errors."""
    registry = SkillRegistry(list(directories))
    assert registry.load() == []
    return registry


# --- org notes ---------------------------------------------------------------

def test_org_note_loads_with_org_line_numbers(tmp_path):
    path = write(tmp_path / "greeter.org", GREETER)
    skill = loaded(tmp_path).get("greeter")
    assert skill is not None
    assert (skill.name, skill.priority, skill.description) == ("greeter", 20, "Says hello.")
    assert skill.source == path
    assert skill.line == line_of(GREETER, "(defskill greeter")
    assert skill.module.startswith("opencortex_skill_greeter_")
    assert skill.trigger(context("hello you")) and not skill.trigger(context("bye"))
    request = skill.probabilistic(context("hello you"))
    assert request == {"system": "Be brief.",
                       "messages": [{"role": "user", "content": "hello you"}]}
    assert skill.deterministic({"type": "reply"}, context()) is None


def test_blocks_any_case_tangle_no_and_other_languages(tmp_path):
    note = """\
    * Not loaded
    #+begin_src hy :tangle no
    (raise (RuntimeError "tangle no blocks are skipped"))
    #+end_src
    #+begin_src python
    raise RuntimeError("python blocks are skipped")
    #+end_src
    #+begin_example
    (defskill example-only :trigger (fn [ctx] True))
    #+end_example
    * Loaded
    #+BEGIN_SRC HY :results silent
    (defskill shouty :trigger (fn [ctx] True))
    #+END_SRC
    """
    write(tmp_path / "mixed.org", note)
    registry = loaded(tmp_path)
    assert [s.name for s in registry.skills] == ["shouty"]
    assert registry.get("shouty").line == line_of(textwrap.dedent(note), "(defskill shouty")


def test_reader_macro_defined_in_one_block_works_in_the_next(tmp_path):
    write(tmp_path / "reader.org", """\
    * Reader macro
    #+begin_src hy
    (defreader up (.upper (.parse-one-form &reader)))
    #+end_src
    Some prose between the blocks.
    #+begin_src hy
    (defskill upper :trigger (fn [ctx] True) :description #up "quiet")
    #+end_src
    """)
    assert loaded(tmp_path).get("upper").description == "QUIET"


def test_org_comma_escapes_are_removed_as_when_tangling(tmp_path):
    write(tmp_path / "escaped.org", """\
    #+begin_src hy
    (setv banner "first
    ,* looks like a heading
    ,,#+ twice escaped")
    (defskill escaped :trigger (fn [ctx] True) :description banner)
    #+end_src
    """)
    description = loaded(tmp_path).get("escaped").description
    assert description == "first\n* looks like a heading\n,#+ twice escaped"


def test_org_code_blocks_pads_to_org_lines(tmp_path):
    text = "a\n#+begin_src hy\n(one)\n#+end_src\nb\n#+begin_src hy\n(two)\n(three)\n#+end_src\n"
    blocks = org_code_blocks(tmp_path / "x.org", text)
    assert [(b.line, b.text) for b in blocks] == [(3, "(one)"), (7, "(two)\n(three)")]


def test_runtime_traceback_names_org_file_and_line(tmp_path):
    note = """\
    #+TITLE: Fragile
    * Trigger
    #+begin_src hy
    (defn fragile? [ctx]
      (raise (ValueError "boom")))
    #+end_src
    #+begin_src hy
    (defskill fragile :trigger fragile?)
    #+end_src
    """
    path = write(tmp_path / "fragile.org", note)
    skill = loaded(tmp_path).get("fragile")
    with pytest.raises(ValueError) as caught:
        skill.trigger(context())
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(caught.tb)]
    assert (str(path), line_of(textwrap.dedent(note), "(raise")) in frames


# --- .hy files ----------------------------------------------------------------

def test_hy_file_with_and_without_explicit_require(tmp_path):
    write(tmp_path / "explicit.hy", """\
    (require opencortex.skills.dsl [defskill])
    (defskill explicit :trigger (fn [ctx] True))
    """)
    path = write(tmp_path / "implicit.hy", "\n\n(defskill implicit :trigger (fn [ctx] False))\n")
    registry = loaded(tmp_path)
    assert registry.get("explicit") is not None
    assert (registry.get("implicit").source, registry.get("implicit").line) == (path, 3)


def test_module_is_in_sys_modules_while_it_runs(tmp_path):
    write(tmp_path / "present.hy", """\
    (import sys)
    (setv present (in __name__ sys.modules))
    (defskill present :trigger (fn [ctx] True) :description (str present))
    """)
    assert loaded(tmp_path).get("present").description == "True"


def test_only_skills_defined_in_the_module_are_collected(tmp_path):
    write(tmp_path / "_shared.hy", "(defskill borrowed :trigger (fn [ctx] True))\n")
    write(tmp_path / "user.hy", "(import _shared [borrowed])\n" + ALWAYS.format(name="own", priority=1))
    assert [s.name for s in loaded(tmp_path).skills] == ["own"]


# --- errors -------------------------------------------------------------------

BROKEN = {
    "missing-trigger.org": ("* x\n#+begin_src hy\n(defskill nope\n  :priority 3\n  :description \"d\")\n#+end_src\n",
                            3, "missing :trigger"),
    "unknown-option.hy": ("(defskill odd\n  :trigger (fn [ctx] True)\n  :colour \"red\")\n",
                          1, "unknown option :colour"),
    "stray-value.hy": ("\n(defskill stray (fn [ctx] True))\n", 2, "come as :keyword value pairs"),
    "not-callable.hy": ("(defskill flat :trigger 42)\n", 1, ":trigger must be a function"),
    "bad-priority.hy": ("(defskill lofty :trigger (fn [ctx] True) :priority \"high\")\n",
                        1, ":priority must be an integer"),
    "no-name.hy": ("\n\n(defskill \"quoted\" :trigger (fn [ctx] True))\n", 3, "defskill needs a name"),
    "unclosed.org": ("* x\n#+begin_src hy\n(setv a 1) ; fine\n; comment\n(defn f [x]\n  (+ x 1)\n#+end_src\n",
                     5, "missing `)`"),
    "unclosed-string.hy": ("(defn f [] 1)\n\n(setv s \"abc\n; more\n", 3, "not closed"),
    "bad-token.hy": ("(setv a 1)\n(setv b #nosuchreader 2)\n", 2, "nosuchreader"),
    "undefined.hy": ("(defn ok [] 1)\n(setv x\n  (no-such-function))\n", 3, "NameError"),
    "no-end.org": ("* x\n#+begin_src hy\n(defn f [] 1)\n", 2, "has no #+end_src"),
    "macro-fails.hy": ("(defmacro bad [] (/ 1 0))\n\n(bad)\n", 3, "in macro bad: ZeroDivisionError"),
    "exits.hy": ("(import sys)\n(sys.exit 3)\n", 2, "SystemExit"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_file_is_reported_with_line_and_others_load(tmp_path, name):
    text, line, fragment = BROKEN[name]
    write(tmp_path / "good.hy", ALWAYS.format(name="good", priority=1))
    path = write(tmp_path / name, text)
    registry = SkillRegistry([tmp_path])
    errors = registry.load()
    assert [(e.path, e.line) for e in errors] == [(path, line)], errors
    assert fragment in errors[0].message
    assert str(errors[0]) == f"{path}:{line}: {errors[0].message}"
    assert registry.errors == errors
    assert [s.name for s in registry.skills] == ["good"]
    assert not [m for m in sys.modules if m.startswith("opencortex_skill_" + path.stem.replace("-", "_"))]


def test_invalid_utf8_is_reported(tmp_path):
    path = tmp_path / "latin.hy"
    path.write_bytes(b'(defskill x :trigger (fn [ctx] True) :description "caf\xe9")\n')
    [error] = SkillRegistry([tmp_path]).load()
    assert error.path == path and error.line is None and "UTF-8" in error.message


def test_broken_helper_is_reported_at_the_require_line(tmp_path):
    write(tmp_path / "_broken.hy", "(defmacro m [] (/ 1 0))\n(m)\n")
    path = write(tmp_path / "user.hy", "(defn f [] 1)\n(require _broken)\n" + ALWAYS.format(name="u", priority=1))
    [error] = SkillRegistry([tmp_path]).load()
    assert (error.path, error.line) == (path, 2)
    assert "_broken.hy:2" in error.message and "ZeroDivisionError" in error.message


def test_duplicate_skill_names_first_file_wins(tmp_path):
    write(tmp_path / "a.hy", "(defskill dup :trigger (fn [ctx] True) :description \"from a\")\n")
    second = write(tmp_path / "b.hy", "\n(defskill dup :trigger (fn [ctx] True) :description \"from b\")\n")
    registry = SkillRegistry([tmp_path])
    [error] = registry.load()
    assert (error.path, error.line) == (second, 2) and "already defined" in error.message
    assert registry.get("dup").description == "from a"


# --- registry -----------------------------------------------------------------

def test_priority_order_with_ties_by_name_across_directories(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    write(first / "b.hy", ALWAYS.format(name="zeta", priority=5))
    write(first / "a.org", "#+begin_src hy\n" + ALWAYS.format(name="alpha", priority=5) + "#+end_src\n")
    write(second / "c.hy", ALWAYS.format(name="high", priority=50))
    write(second / "d.hy", ALWAYS.format(name="low", priority=-1))
    registry = loaded(first, second)
    assert [s.name for s in registry.skills] == ["high", "alpha", "zeta", "low"]
    assert [s.name for s in registry.matching(context())] == ["high", "alpha", "zeta", "low"]


def test_helper_and_hidden_files_are_not_skills(tmp_path):
    write(tmp_path / "_helper.hy", ALWAYS.format(name="helper", priority=1))
    write(tmp_path / ".hidden.org", "#+begin_src hy\n" + ALWAYS.format(name="hidden", priority=1) + "#+end_src\n")
    write(tmp_path / "notes.txt", "(raise (RuntimeError))\n")
    write(tmp_path / "real.hy", ALWAYS.format(name="real", priority=1))
    assert [s.name for s in loaded(tmp_path).skills] == ["real"]


def test_missing_directory_is_skipped(tmp_path):
    registry = loaded(tmp_path / "absent")
    assert registry.skills == [] and registry.get("anything") is None


def test_matching_skips_a_raising_trigger_and_logs_no_text(tmp_path, caplog):
    write(tmp_path / "skills.hy", """\
    (defskill fragile :priority 9 :trigger (fn [ctx] (raise (ValueError (. ctx event text)))))
    (defskill steady :priority 1 :trigger (fn [ctx] (in "hello" (. ctx event text))))
    """)
    registry = loaded(tmp_path)
    with caplog.at_level(logging.WARNING, logger="opencortex.skills"):
        chosen = registry.matching(context("hello private words"))
    assert [s.name for s in chosen] == ["steady"]
    assert "fragile" in caplog.text and "ValueError" in caplog.text
    assert "private words" not in caplog.text


def test_verdict_helpers_from_hy(tmp_path):
    write(tmp_path / "guard.hy", """\
    (import opencortex.skills [reject needs-approval])
    (defn check [action ctx]
      (cond (> (len (get action "text")) 10) (reject "too long; keep it under 10 characters")
            (= (get action "type") "shell") (needs-approval "runs a command")
            (= (get action "text") "hi") (| action {"text" "hello"})
            True None))
    (defskill guard :trigger (fn [ctx] True) :deterministic check)
    """)
    check = loaded(tmp_path).get("guard").deterministic
    assert check({"type": "reply", "text": "x" * 11}, context()) == Rejection(
        "too long; keep it under 10 characters")
    assert check({"type": "shell", "text": "ls"}, context()) == NeedsApproval("runs a command")
    assert check({"type": "reply", "text": "hi"}, context()) == {"type": "reply", "text": "hello"}
    assert check({"type": "reply", "text": "ok"}, context()) is None


def test_verdicts_need_a_reason():
    assert reject("why") == Rejection("why") and needs_approval("why") == NeedsApproval("why")
    with pytest.raises(ValueError, match="reason"):
        reject("  ")
    with pytest.raises(ValueError, match="reason"):
        needs_approval(None)


def test_skill_context_defaults_to_the_event_thread():
    ctx = context(attempt=2, rejections=["too long"])
    assert ctx.thread == Thread("cli", "local")
    assert (ctx.attempt, list(ctx.rejections), ctx.history, ctx.persona) == (2, ["too long"], (), "")


def test_defskill_outside_a_file_records_no_source(monkeypatch):
    module = types.ModuleType("scratch_skills")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    code = "(require opencortex.skills.dsl [defskill])\n\n(defskill scratch :trigger (fn [ctx] True))"
    for form in hy.read_many(code):
        hy.eval(form, globals=module.__dict__, module=module)
    skill = module.scratch
    assert (skill.name, skill.source, skill.line, skill.module) == ("scratch", None, 3, "scratch_skills")


def test_skill_checks_its_fields():
    with pytest.raises(TypeError, match=":trigger"):
        Skill(name="x", trigger="not a function")
    with pytest.raises(TypeError, match=":priority"):
        Skill(name="x", trigger=bool, priority=True)


# --- reload -------------------------------------------------------------------

def test_reload_reads_edits_and_drops_old_modules(tmp_path):
    path = write(tmp_path / "edit.hy", "(defskill edit :trigger (fn [ctx] True) :description \"v1\")\n")
    write(tmp_path / "gone.hy", ALWAYS.format(name="gone", priority=1))
    registry = loaded(tmp_path)
    old = registry.get("edit").module
    path.write_text("(defskill edit :trigger (fn [ctx] True) :description \"v2\")\n", encoding="utf-8")
    (tmp_path / "gone.hy").unlink()
    assert registry.reload() == []
    assert registry.get("edit").description == "v2"
    assert registry.get("gone") is None
    assert old not in sys.modules and registry.get("edit").module in sys.modules
    assert registry.get("edit").module != old


def test_reload_runs_the_after_reload_hooks_once_loaded(tmp_path):
    write(tmp_path / "one.hy", ALWAYS.format(name="one", priority=1))
    registry = loaded(tmp_path)
    seen: list[object] = []
    registry.after_reload.append(lambda: seen.append(registry.get("one")))
    registry.load()
    assert seen == []                                     # a load is not a reload
    assert registry.reload() == [] and seen == [registry.get("one")]


def test_reload_picks_up_an_edited_helper_macro_without_bytecode(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    helper = write(tmp_path / "_macros.hy", "(defmacro shout [s] (.upper s))\n")
    write(tmp_path / "loud.org", """\
    #+begin_src hy
    (require _macros [shout])
    (defskill loud :trigger (fn [ctx] True) :description (shout "hey"))
    #+end_src
    """)
    registry = loaded(tmp_path)
    assert registry.get("loud").description == "HEY"
    # Same size, same second: only reading the source again can notice this edit.
    helper.write_text("(defmacro shout [s] (.lower s))\n", encoding="utf-8")
    assert registry.reload() == []
    assert registry.get("loud").description == "hey"
    assert not list(tmp_path.rglob("*.pyc")) and not (tmp_path / "__pycache__").exists()


def test_deleted_helper_is_not_served_from_a_stale_module(tmp_path):
    write(tmp_path / "_gone.hy", "(defmacro twice [x] `(* 2 ~x))\n")
    user = write(tmp_path / "user.hy", "(require _gone [twice])\n"
                 "(defskill user :trigger (fn [ctx] True) :priority (twice 4))\n")
    assert loaded(tmp_path).get("user").priority == 8
    registry = SkillRegistry([tmp_path])
    (tmp_path / "_gone.hy").unlink()
    [error] = registry.load()
    assert (error.path, error.line) == (user, 1) and "_gone" in error.message


def test_registries_do_not_share_helper_modules(tmp_path):
    for name, body in (("one", "(+ s \"!\")"), ("two", "(+ s \"?\")")):
        write(tmp_path / name / "_macros.hy", f"(defmacro mark [s] {body})\n")
        write(tmp_path / name / "marked.hy", f"(require _macros [mark])\n"
              f"(defskill {name} :trigger (fn [ctx] True) :description (mark \"{name}\"))\n")
    first, second = loaded(tmp_path / "one"), loaded(tmp_path / "two")
    assert first.get("one").description == "one!"
    assert second.get("two").description == "two?"


def test_helper_cannot_shadow_an_installed_module(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    write(tmp_path / "colorsys.hy", "(setv shadowed True)\n")
    write(tmp_path / "uses.hy", "(import colorsys)\n(defskill uses :trigger (fn [ctx] True)"
          " :description (str (hasattr colorsys \"shadowed\")))\n")
    assert loaded(tmp_path).get("uses").description == "False"


def test_reload_is_bounded_and_stable(tmp_path):
    write(tmp_path / "stable.org", GREETER)
    registry = SkillRegistry([tmp_path])
    for _ in range(5):
        assert registry.reload() == []
    names = [m for m in sys.modules if m.startswith("opencortex_skill_stable_")]
    assert names == [registry.get("greeter").module]
