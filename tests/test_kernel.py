"""The loop, end to end, with the real chat skill, reader, archive and actuators."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest

from opencortex.events import EventError, Thread, chat_message
from opencortex.llm import Backend, EchoBackend, PromptRequest, ScriptBackend, Usage
from opencortex.llm.base import LLMError
from opencortex.kernel import TurnObserver
from opencortex.runtime import build_kernel

from conftest import RecordingActuator

CLI = Thread("cli", "local")


def script(tmp_path: Path, *replies: str) -> ScriptBackend:
    path = tmp_path / "replies.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in replies) + "\n")
    return ScriptBackend(path)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def make(config, backend=None, frontends=()):
    printed: list[str] = []
    kernel = build_kernel(config, backend=backend or EchoBackend(), writer=printed.append)
    for frontend in frontends:
        kernel.actuators.register(frontend)
    return kernel, printed


def test_echo_turn_is_shown_and_archived(config):
    kernel, printed = make(config)
    result = run(kernel.handle(chat_message("hello there")))
    assert result.status == "done", result.errors
    assert result.text == "[Echo] hello there"
    assert printed == ["[Echo] hello there"]
    assert result.skill == "chat"
    assert any("echo mode" in w for w in result.warnings)
    records = kernel.archive.read_thread(CLI)
    assert [r.role for r in records] == ["user", "assistant"]
    assert [r.text for r in records] == ["hello there", "[Echo] hello there"]
    assert [r.id for r in records] == result.ids
    assert records[1].parent == records[0].id
    assert records[1].extra.get("SKILL") == "chat"


def test_echo_in_emacs_answers_with_an_org_subtree(config):
    emacs = RecordingActuator("emacs")
    kernel, _ = make(config, frontends=[emacs])
    result = run(kernel.handle(chat_message("hi", "emacs", "main")))
    assert result.status == "done", result.errors
    assert emacs.delivered == [("*opencortex-chat*", "* [Echo] hi")]
    assert result.action["buffer"] == "*opencortex-chat*"


def test_history_reaches_the_next_prompt_and_turns_chain(config, tmp_path):
    seen: list[PromptRequest] = []

    class Recording(EchoBackend):
        async def stream(self, request):
            seen.append(request)
            async for item in super().stream(request):
                yield item

    kernel, _ = make(config, Recording())
    run(kernel.handle(chat_message("first")))
    run(kernel.handle(chat_message("second")))
    second = seen[1]
    assert [m.content for m in second.messages] == ["first", "[Echo] first", "second"]
    assert "exactly one property list" in second.system.lower() or "EXACTLY ONE" in second.system
    assert ":target :cli" in second.system
    records = kernel.archive.read_thread(CLI)
    assert [r.parent for r in records[1:]] == [r.id for r in records[:-1]]


def test_rejected_reply_is_sent_back_with_the_reason_then_accepted(config, tmp_path):
    backend = script(tmp_path, "Sure! Here you go: hello",
                     '(:type :REQUEST :target :cli :text "fixed")')
    seen: list[PromptRequest] = []
    original = backend.stream

    async def recording(request):
        seen.append(request)
        async for item in original(request):
            yield item

    backend.stream = recording  # type: ignore[method-assign]
    kernel, printed = make(config, backend)
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "done" and result.attempts == 2
    assert printed == ["fixed"]
    retry = seen[1].messages
    assert retry[-2].role == "assistant" and retry[-2].content.startswith("Sure!")
    assert "rejected" in retry[-1].content and "plist" in retry[-1].content


def test_giving_up_tells_the_channel_and_archives_the_error(config, tmp_path):
    bad = '(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*scratch*" :text "x")'
    kernel, printed = make(config, script(tmp_path, bad, bad))
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "rejected"
    assert len(printed) == 1
    assert printed[0].startswith("System Error: Chat agent returned invalid action: (:type")
    records = kernel.archive.read_thread(CLI)
    assert [r.role for r in records] == ["user", "system"]


def test_allowed_buffers_are_configurable(home, tmp_path):
    (home / "config.toml").write_text('[chat]\nallowed_buffers = ["*notes*"]\n')
    from opencortex.config import load_config
    emacs = RecordingActuator("emacs")
    reply = '(:type :REQUEST :target :emacs :action :insert-at-end :buffer "*notes*" :text "n")'
    kernel, _ = make(load_config(home), script(tmp_path, reply), [emacs])
    result = run(kernel.handle(chat_message("note", "emacs", "main")))
    assert result.status == "done", result.errors
    assert emacs.delivered == [("*notes*", "n")]


def test_unreadable_reply_gives_a_read_error_the_person_can_act_on(config, tmp_path):
    kernel, printed = make(config, script(tmp_path, '(:type :REQUEST :text "unterminated',
                                          '(:type :REQUEST :text "unterminated'))
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "rejected"
    assert "could not be read" in printed[0]


def test_shell_needs_approval_and_is_not_run(config, tmp_path):
    """A channel that cannot ask denies the command; the model hears so and answers."""
    reply = '(:type :REQUEST :target :shell :cmd ("touch" "/tmp/never") :reason "demo")'
    kernel, printed = make(config, script(tmp_path, reply,
                                          '(:type :REQUEST :target :cli :text "could not")'))
    result = run(kernel.handle(chat_message("make a file")))
    assert result.status == "done" and result.text == "could not"
    assert printed[0].startswith("⚙ step 1: shell touch /tmp/never → denied")
    assert not Path("/tmp/never").exists()
    step = result.steps[0]
    assert "cannot ask the owner" in step.result
    records = kernel.archive.read_thread(CLI)
    assert [r.turn_type for r in records] == ["speech", "action", "action", "speech"]
    assert records[1].extra["STEP"] == "1" and records[1].extra["STEP_OUTCOME"] == "denied"


def test_failing_llm_tells_the_person_and_archives_nothing(config):
    class Down(Backend):
        name = "down"

        async def stream(self, request) -> AsyncIterator[str | Usage]:
            raise LLMError("LLM_UNAVAILABLE", "provider unreachable")
            yield ""  # pragma: no cover

    kernel, printed = make(config, Down())
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "failed"
    assert printed[0].startswith("System Error: LLM_UNAVAILABLE: provider unreachable")
    assert "send the message again" in printed[0]
    assert kernel.archive.read_thread(CLI) == []
    # the kernel keeps running
    kernel.backend = EchoBackend()
    assert run(kernel.handle(chat_message("again"))).status == "done"


def test_stalled_stream_times_out(config):
    class Stall(Backend):
        name = "stall"

        async def stream(self, request):
            yield "(:type"
            await asyncio.sleep(30)

    kernel, printed = make(config.model_copy(update={"llm_timeout": 0.2}), Stall())
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "failed"
    assert "STREAM_TIMEOUT" in printed[0]
    assert kernel.archive.read_thread(CLI) == []


def test_invalid_event_is_refused_and_changes_nothing(config):
    kernel, printed = make(config)
    with pytest.raises(EventError):
        run(kernel.handle({"text": "", "channel": "cli", "chat_id": "local"}))
    assert printed == [] and kernel.archive.threads() == []


def test_reply_to_a_channel_without_actuator_is_reported_and_kept(config):
    kernel, _ = make(config)
    result = run(kernel.handle(chat_message("hi", "telegram", "42")))
    assert result.status == "failed"
    assert any("no actuator is registered for target :telegram" in e for e in result.errors)
    records = kernel.archive.read_thread(Thread("telegram", "42"))
    assert records[1].extra.get("DELIVERY") == "failed"


def test_tool_call_runs_a_registered_tool(config, tmp_path):
    """The tool's result goes back to the model, which then answers the person."""
    reply = '(:type :REQUEST :target :tool :action :call :tool "clock")'
    kernel, printed = make(config, script(tmp_path, reply,
                                          '(:type :REQUEST :target :cli :text "noon")'))
    result = run(kernel.handle(chat_message("what time is it")))
    assert result.status == "done", result.errors
    assert printed == ["⚙ step 1: tool clock → done", "noon"]
    assert result.steps[0].result.startswith("20")
    records = kernel.archive.read_thread(CLI)
    assert [r.turn_type for r in records] == ["speech", "action", "action", "speech"]
    assert records[2].text.startswith("20") and records[3].text == "noon"


def test_response_goes_back_to_the_originating_channel_and_log_is_a_thought(config, tmp_path):
    kernel, printed = make(config, script(tmp_path, '(:type :RESPONSE :text "plain")',
                                          '(:type :LOG :text "note to self")'))
    assert run(kernel.handle(chat_message("a"))).text == "plain"
    result = run(kernel.handle(chat_message("b")))
    assert result.status == "done" and printed == ["plain"]
    assert kernel.archive.read_thread(CLI)[-1].turn_type == "thought"


def test_chunks_stream_to_listeners_and_add_up_to_the_reply(config):
    kernel, _ = make(config, EchoBackend(chunk_size=3))
    got: list[str] = []

    class Collect(TurnObserver):
        def on_chunk(self, text):
            got.append(text)

    result = run(kernel.handle(chat_message("stream me"), Collect()))
    assert len(got) > 5
    from opencortex.reader import read_plist
    assert read_plist("".join(got))["text"] == result.text


def test_a_slow_thread_does_not_block_another(config):
    release = asyncio.Event()

    class Gate(EchoBackend):
        async def stream(self, request):
            if request.reply_to.chat_id == "slow":
                await release.wait()
            async for item in super().stream(request):
                yield item

    async def scenario():
        kernel, _ = make(config, Gate())
        slow = asyncio.create_task(kernel.handle(chat_message("wait", "cli", "slow")))
        fast = await asyncio.wait_for(kernel.handle(chat_message("go", "cli", "fast")), 5)
        assert fast.status == "done" and not slow.done()
        release.set()
        assert (await asyncio.wait_for(slow, 5)).status == "done"

    run(scenario())


def test_turns_of_one_thread_keep_their_order(config):
    async def scenario():
        kernel, printed = make(config, EchoBackend(chunk_size=1))
        await asyncio.gather(*(kernel.handle(chat_message(f"m{i}")) for i in range(5)))
        return kernel

    kernel = run(scenario())
    texts = [r.text for r in kernel.archive.read_thread(CLI) if r.role == "user"]
    assert texts == [f"m{i}" for i in range(5)]


def write_skill(directory: Path, name: str, body: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(body)


def test_a_higher_priority_skill_wins_and_its_verifier_applies(home, tmp_path):
    skills = tmp_path / "myskills"
    write_skill(skills, "shout.hy", '''
(import opencortex.skills [reject])
(defskill shout
  :priority 50
  :trigger (fn [ctx] (.startswith ctx.event.text "!"))
  :probabilistic (fn [ctx] {"system" "shout" "messages" [{"role" "user" "content" (.upper ctx.event.text)}]})
  :deterministic (fn [action ctx]
                   (when (= (.get action "target") "tool") (reject "shout allows no tools"))))
''')
    (home / "config.toml").write_text(f'skill_dirs = ["{skills}"]\n')
    from opencortex.config import load_config
    kernel, printed = make(load_config(home))
    assert run(kernel.handle(chat_message("!hey"))).skill == "shout"
    assert printed == ["[Echo] !HEY"]
    assert run(kernel.handle(chat_message("calm"))).skill == "chat"


def test_a_broken_prompt_phase_fails_the_turn_without_a_trace(home, tmp_path):
    skills = tmp_path / "broken"
    write_skill(skills, "bad.hy", '''
(defskill bad :priority 99 :trigger (fn [ctx] True) :probabilistic (fn [ctx] (/ 1 0)))
''')
    (home / "config.toml").write_text(f'skill_dirs = ["{skills}"]\n')
    from opencortex.config import load_config
    kernel, printed = make(load_config(home))
    result = run(kernel.handle(chat_message("hi")))
    assert result.status == "failed"
    assert "ZeroDivisionError" in printed[0]
    assert kernel.archive.read_thread(CLI) == []


@pytest.fixture
def slow_skill(tmp_path):
    """A skills folder whose skill `slow` (for chat "slow") blocks building its prompt
    until the gate given with it is set (at the end of the test at the latest)."""
    import threading
    gate = threading.Event()
    skills = tmp_path / "slow"
    write_skill(skills, "slow.hy", '''
(import opencortex-test-gate [gate])
(defskill slow
  :priority 60
  :trigger (fn [ctx] (= ctx.event.chat-id "slow"))
  :probabilistic (fn [ctx]
                   (assert (.wait gate 20) "the test never opened the gate")
                   {"system" "slow" "messages" [{"role" "user" "content" ctx.event.text}]}))
''')
    module = type(sys)("opencortex_test_gate")
    module.gate = gate
    sys.modules["opencortex_test_gate"] = module
    yield skills, gate
    gate.set()
    del sys.modules["opencortex_test_gate"]


def test_a_skill_slow_to_build_its_prompt_holds_up_its_own_turn_alone(home, slow_skill):
    """Triggers and the probabilistic phase run on a reading thread, not on the loop: a
    skill that blocks there (here until the other turn is done) stops no other thread."""
    skills, gate = slow_skill
    (home / "config.toml").write_text(f'skill_dirs = ["{skills}"]\n')
    from opencortex.config import load_config

    async def scenario():
        kernel, _ = make(load_config(home))
        slow = asyncio.create_task(kernel.handle(chat_message("wait", "cli", "slow")))
        fast = await asyncio.wait_for(kernel.handle(chat_message("go", "cli", "fast")), 10)
        assert fast.status == "done" and not slow.done()
        gate.set()
        done = await asyncio.wait_for(slow, 10)
        assert (done.status, done.skill) == ("done", "slow")
        await kernel.aclose()
    run(scenario())


def test_a_skill_that_never_builds_its_prompt_fails_its_turn_in_bounded_time(home,
                                                                              slow_skill):
    skills, gate = slow_skill
    (home / "config.toml").write_text(f'prepare_timeout = 0.5\nskill_dirs = ["{skills}"]\n')
    from opencortex.config import load_config

    async def scenario():
        kernel, printed = make(load_config(home))
        stuck = await asyncio.wait_for(kernel.handle(chat_message("wait", "cli", "slow")), 10)
        assert stuck.status == "failed" and "prepare_timeout" in stuck.errors[0]
        assert "took longer than 0.5 s" in printed[0]
        assert kernel.archive.read_thread(Thread("cli", "slow")) == []
        gate.set()                           # the skill's call ends; the thread is free again
        fine = await asyncio.wait_for(kernel.handle(chat_message("go", "cli", "fast")), 10)
        assert fine.status == "done"
        await kernel.aclose()
    run(scenario())


def test_running_figures_are_kept_for_the_most_recent_threads_only(config, monkeypatch):
    """Each thread's turns, tokens and latency (/metrics) were kept for every thread ever
    seen: a kernel strangers reach met new threads without end (4,000 chats: 4,000
    entries, never let go)."""
    from opencortex import turn
    monkeypatch.setattr(turn, "MAX_THREAD_STATS", 3)
    kernel, _ = make(config)

    async def talk() -> None:
        for n in (1, 2, 3, 1, 4, 5):
            result = await kernel.handle(chat_message(f"hello {n}", "cli", f"chat{n}"))
            assert result.status == "done", result.errors
        await kernel.aclose()
    run(talk())
    assert list(kernel.stats) == [Thread("cli", f"chat{n}") for n in (1, 4, 5)]
    assert kernel.stats[Thread("cli", "chat1")].turns == 2
