"""The `opencortex` command, run as a person runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env


def oc(home: Path, *args: str, stdin: str | None = None, **env: str):
    return subprocess.run([sys.executable, "-m", "opencortex", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, env=cli_env(home, **env))


def test_one_shot_chat_json(home):
    run = oc(home, "chat", "--message", "hello", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["text"] == "[Echo] hello"
    assert data["action"] == {"type": ":request", "target": ":cli", "text": "[Echo] hello"}
    assert data["backend"] == "echo" and data["thread"] == "cli:local"
    assert len(data["ids"]) == 2
    assert any("LLM unavailable, running in echo mode" in w for w in data["warnings"])
    org = (home / "memory" / "cli").glob("*.org")
    assert "hello" in next(org).read_text()


def test_one_shot_chat_plain_shows_warning_and_reply(home):
    run = oc(home, "chat", "-m", "hi there", "--thread", "me")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[Echo] hi there"
    assert "running in echo mode" in run.stderr


def test_home_option_before_the_command(tmp_path):
    home = tmp_path / "elsewhere"
    run = subprocess.run([sys.executable, "-m", "opencortex", "--home", str(home), "chat", "-m",
                          "x", "--json"], capture_output=True, text=True, timeout=120,
                         env=cli_env(tmp_path / "unused"))
    assert run.returncode == 0, run.stderr
    assert (home / "memory").is_dir()


def test_interactive_chat_reads_lines_until_eof(home):
    run = oc(home, "chat", stdin="one\n\ntwo\n")
    assert run.returncode == 0, run.stderr
    assert "[Echo] one" in run.stdout and "[Echo] two" in run.stdout


def test_script_backend_and_failure_exit_code(home, tmp_path):
    replies = tmp_path / "r.txt"
    replies.write_text("no plist here\n%%\nstill none\n")
    run = oc(home, "chat", "-m", "hi", "--script", str(replies), "--json")
    assert run.returncode == 1
    data = json.loads(run.stdout)
    assert data["status"] == "rejected" and data["attempts"] == 2
    assert data["text"].startswith("System Error:")


def test_skills_list_and_check(home, tmp_path):
    run = oc(home, "skills", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    chat = next(s for s in data["skills"] if s["name"] == "chat")
    assert chat["phases"] == ["trigger", "probabilistic", "deterministic"]
    assert chat["source"].split(":")[0].endswith("skills/chat.org")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "oops.hy").write_text("(defskill ok :trigger (fn [ctx] True))\n(defn f [\n")
    run = oc(home, "skills", "--check", OPENCORTEX_SKILL_DIRS=str(broken))
    assert run.returncode == 1
    assert "oops.hy:2" in run.stderr or "oops.hy:" in run.stderr
    assert "chat" in run.stdout


@pytest.mark.parametrize("reply, verdict, code", [
    ('Here: (:type :REQUEST :target :cli :text "hi") done', "accepted", 0),
    ('(:type :REQUEST :target :printer :text "hi")', "rejected", 1),
    ('(:type :REQUEST :target :shell :cmd "ls")', "needs-approval", 1),
    ('(:type :REQUEST :target :cli :text "hi" :approved t)', "rejected", 1),
])
def test_read_action_dry_run(home, reply, verdict, code):
    run = oc(home, "read-action", "-", "--json", stdin=reply)
    assert run.returncode == code, run.stderr
    data = json.loads(run.stdout)
    assert data["verdict"] == verdict
    assert set(data) >= {"verdict", "action", "errors", "ignored"}
    if verdict == "accepted":
        assert data["ignored"] and "Here:" in data["ignored"]
    if verdict == "rejected":
        assert data["errors"]


def test_read_action_channel_decides_the_chat_verifier(home, tmp_path):
    reply = tmp_path / "reply.el"
    reply.write_text('(:type :REQUEST :target :emacs :action :insert-at-end '
                     ':buffer "*scratch*" :text "x")')
    run = oc(home, "read-action", str(reply), "--channel", "emacs", "--json")
    data = json.loads(run.stdout)
    assert run.returncode == 1 and "Chat agent returned invalid action" in data["errors"][0]


def test_memory_search_and_reindex(home):
    assert oc(home, "chat", "-m", "the quick brown fox").returncode == 0
    assert oc(home, "chat", "-m", "something else", "--thread", "other").returncode == 0
    run = oc(home, "memory", "search", "fox", "--json")
    hits = json.loads(run.stdout)
    assert run.returncode == 0 and {h["role"] for h in hits} == {"user", "assistant"}
    run = oc(home, "memory", "search", "fox", "--thread", "cli:other", "--json")
    assert json.loads(run.stdout) == []
    (home / "memory" / "index.sqlite").unlink()
    run = oc(home, "memory", "reindex")
    assert run.returncode == 0 and "reindexed 4 messages" in run.stdout
    assert len(json.loads(oc(home, "memory", "search", "fox", "--json").stdout)) == 2


def test_doctor_names_what_is_missing_with_fixes(home):
    run = oc(home, "doctor")
    assert "python: sexpdata" in run.stdout
    assert "key: ANTHROPIC_API_KEY: not set" in run.stdout
    assert "fix:" in run.stdout
    assert run.returncode == 0, run.stdout


def test_bad_input_gets_a_clear_error(home):
    run = oc(home, "chat", "-m", "   ")
    assert run.returncode == 1 and "text is blank" in run.stderr
    run = oc(home, "chat", "-m", "x", "--thread", "irc:1")
    assert run.returncode == 1 and "unknown channel 'irc'" in run.stderr
    (home / "config.toml").write_text("backend = 3\n")
    run = oc(home, "chat", "-m", "x")
    assert run.returncode == 1 and "config.toml" in run.stderr
