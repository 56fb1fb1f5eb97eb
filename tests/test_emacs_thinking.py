"""End to end: a reasoning model's thinking, from a provider speaking its documented
stream (the fake, through the real SDK) through the real kernel and EPC into a real
Emacs: it streams into a thinking block above the reply, folded when the reply
comes, and is never archived nor sent to the model again.
"""

from __future__ import annotations

import shutil

import pytest

from llm_fakes import FakeProvider, Reply
from test_emacs_e2e import Driver, emacs_reply

pytestmark = pytest.mark.skipif(shutil.which("emacs") is None,
                                reason="emacs is not installed (tests/run.sh installs it)")

THOUGHTS = ["The person greets me. ", "I should greet back.\n", "* Not a heading\n",
            "#+end_thinking\n", "Done."]


@pytest.fixture
def provider():
    with FakeProvider() as server:
        yield server


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_thinking_streams_into_a_folded_block_above_the_reply_and_is_kept_nowhere(
        kind, tmp_path, home, provider, monkeypatch):
    monkeypatch.setenv("OPENCORTEX_TEST_KEY", "sk-test-not-a-real-key")
    form = emacs_reply("* Hello back")["text"]
    provider.push(Reply(chunks=[form[:20], form[20:]], thinking=THOUGHTS, delay=0.05),
                  Reply(chunks=[emacs_reply("* Second")["text"]]))
    url = provider.openai_url if kind == "openai" else provider.url
    (home / "config.toml").write_text(
        f'backend = "{kind}"\n[llm.{kind}]\nbase_url = "{url}"\n'
        'api_key_env = "OPENCORTEX_TEST_KEY"\n', encoding="utf-8")
    driver = Driver(tmp_path, home)
    buffer = driver.run("""
(defun e2e-thinking-folded-p ()
  (with-current-buffer "*opencortex-chat*"
    (save-excursion
      (goto-char (point-min))
      (and (search-forward "I should greet back" nil t) (invisible-p (point))))))
(opencortex-send "hello, thinker")
(unless (opencortex-wait-for (lambda () (e2e-contains "#+begin_thinking")) 30)
  (e2e-fail "no thinking shown"))
(unless (opencortex-wait-idle 60) (e2e-fail "the turn did not end"))
(unless (e2e-thinking-folded-p) (e2e-fail "the thinking was not folded"))
(e2e-send "and again")
""", timeout=240)
    block = buffer[buffer.index("#+begin_thinking"):buffer.index("* Hello back")]
    assert block == ("#+begin_thinking\nThe person greets me. I should greet back.\n"
                     " * Not a heading\n,#+end_thinking\nDone.\n#+end_thinking\n")
    assert buffer.count("#+begin_thinking") == 1
    assert buffer.index("hello, thinker") < buffer.index("#+begin_thinking")
    archive = driver.archive()
    assert "Hello back" in archive
    assert "greet back" not in archive
    second = provider.requests[-1].body
    assert "greet back" not in str(second)
