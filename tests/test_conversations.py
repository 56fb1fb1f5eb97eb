"""Conversations through the kernel: commands, branches, restarts, compression, isolation."""

from __future__ import annotations

import asyncio
import threading

from hypothesis import HealthCheck, given, settings, strategies as st

import pytest

from opencortex.config import load_config
from opencortex.conversation.commands import is_command
from opencortex.events import Thread, chat_message
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

from conftest import RecordingActuator

CLI = Thread("cli", "local")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


class Recording(EchoBackend):
    """Echo, keeping every prompt it was sent, by thread."""

    def __init__(self):
        super().__init__()
        self.prompts: list[tuple[Thread, object]] = []

    async def stream(self, request):
        self.prompts.append((Thread(request.reply_to.channel, request.reply_to.chat_id), request))
        async for item in super().stream(request):
            yield item


def kernel_for(home, backend=None, **conversation):
    if conversation:
        lines = "\n".join(f"{key} = {value!r}".replace("'", '"') for key, value in
                          conversation.items())
        (home / "config.toml").write_text(f"[conversation]\n{lines}\n")
    printed: list[str] = []
    kernel = build_kernel(load_config(home), backend=backend or EchoBackend(),
                          writer=printed.append)
    frontends = RecordingActuator("emacs", "telegram", "signal", "matrix")
    kernel.actuators.register(frontends)
    return kernel, printed, frontends


async def say(kernel, text, channel="cli", chat_id="local"):
    return await kernel.handle(chat_message(text, channel, chat_id))


def test_commands_answer_on_the_channel_and_are_not_archived_as_turns(home):
    kernel, printed, _ = kernel_for(home)

    async def scenario():
        for text in ("first question", "second question", "third question"):
            await say(kernel, text)
        history = await say(kernel, "/history 2")
        context = await say(kernel, "/context")
        helps = await say(kernel, "/help")
        return history, context, helps

    history, context, helps = run(scenario())
    assert history.status == "done" and "second question" in history.text
    assert "first question" not in history.text
    assert "pressure" in context.text and "REQUIRED" in context.text
    assert "ACTUATOR IDENTITY" not in context.text  # a view, never the prompt
    for name in ("/history", "/context", "/metrics", "/reset", "/fork", "/rewind", "/merge",
                 "/pin", "/unpin", "/save", "/load", "/sessions", "/recall", "/persona",
                 "/strategy", "/help", "/branches", "/switch", "/reload", "/quit"):
        assert name in helps.text
    users = [r.text for r in kernel.archive.read_thread(CLI) if r.role == "user"]
    assert users == ["first question", "second question", "third question"]


def test_a_fork_fills_its_context_off_the_loop(home, monkeypatch):
    """Refilling a context adds up to a window of messages and compresses them: on the
    loop, a /fork or /switch of a long thread held every conversation 27-67 ms."""
    from opencortex.conversation.context import WorkingContext
    filled_on: list[str] = []
    real = WorkingContext.add

    async def noting(self, *entries):
        filled_on.append(threading.current_thread().name)
        return await real(self, *entries)
    kernel, _, _ = kernel_for(home, budget=300)

    async def scenario():
        for number in range(30):
            await say(kernel, f"fact number {number}: the heron nests by the lake")
        monkeypatch.setattr(WorkingContext, "add", noting)
        forked = await say(kernel, "/fork")
        switched = await say(kernel, "/switch main")
        return forked, switched
    forked, switched = run(scenario())
    assert "Forked" in forked.text and "Switched" in switched.text
    assert filled_on and threading.main_thread().name not in filled_on
    run(kernel.aclose())


def test_fork_rewind_merge_and_restart(home):
    kernel, printed, _ = kernel_for(home)

    async def build():
        for text in ("one", "two", "three"):
            await say(kernel, text)
        assert "Forked branch b2 at turn 1" in (await say(kernel, "/fork 1")).text
        await say(kernel, "two prime")
        assert "b2" in (await say(kernel, "/context")).text
        merged = await say(kernel, "/merge main")
        return merged

    merged = run(build())
    assert "Merged" in merged.text
    history = run(say(kernel, "/history 10")).text
    assert history.count("user      one") == 1  # the shared turn is not duplicated
    assert "two prime" in history and "three" in history
    run(kernel.aclose())

    again, _, _ = kernel_for(home)
    assert run(say(again, "/history 10")).text == history  # rebuilt from the org archive
    rewound = run(say(again, "/rewind 1")).text
    assert "Rewound" in rewound
    assert run(say(again, "/history 10")).text.count("\n") == 1  # just turn 1: two lines
    run(again.aclose())


def test_pin_keeps_a_turn_through_compression_and_the_person_is_told(home):
    kernel, printed, _ = kernel_for(home, budget=300, threshold=0.8, target=0.5)
    facts = "The launch code is 4471 and the rendezvous is at dock nine"

    async def scenario():
        await say(kernel, facts)
        assert "Pinned turn 1" in (await say(kernel, "/pin 1")).text
        for i in range(30):
            await say(kernel, f"filler message number {i} with a few more words to take room")
        conversation = await kernel.conversations.open(CLI)
        return conversation

    conversation = run(scenario())
    assert any("Context compressed" in line for line in printed)
    assert conversation.context.pressure <= 0.8
    texts = [entry.text for entry in conversation.context.entries]
    assert facts in texts and "[Echo] " + facts in texts
    assert all(e.retention == "PRESERVED" for e in conversation.context.entries
               if e.text in (facts, "[Echo] " + facts))


def test_a_session_collapses_at_its_turn_limit_and_reset_revives_it(home):
    kernel, printed, _ = kernel_for(home, max_turns=2)

    async def scenario():
        await say(kernel, "a")
        await say(kernel, "b")
        blocked = await say(kernel, "c")
        reset = await say(kernel, "/reset")
        after = await say(kernel, "d")
        return blocked, reset, after

    blocked, reset, after = run(scenario())
    assert blocked.status == "failed" and "collapsed" in blocked.errors[0]
    assert any("collapsed" in p and "/reset" in p for p in printed)
    assert "afresh" in reset.text and after.status == "done"


def test_the_view_for_frontends_has_no_prompt(home):
    kernel, _, _ = kernel_for(home)
    run(say(kernel, "hello", "emacs", "main"))
    view = run(kernel.view(Thread("emacs", "main")))
    assert view["turn"] == 1 and view["can-send"] is True and view["session"] == "ready"
    assert 0 < view["context-percent"] < 100
    assert not any("ACTUATOR" in str(value) or "opencortex, a personal" in str(value)
                   for value in view.values())


def test_recall_is_visible_and_marked_in_the_prompt(home):
    backend = Recording()
    kernel, _, _ = kernel_for(home, backend)

    async def scenario():
        await say(kernel, "the wifi password is zebra-crossing-42", "emacs", "main")
        await say(kernel, "what was the wifi password?", "cli", "local")

    run(scenario())
    _, request = backend.prompts[-1]
    first = request.messages[0].content
    assert first.startswith("[Recalled from earlier conversations")
    assert "zebra-crossing-42" in first
    context = run(say(kernel, "/context")).text
    assert "Recalled for the latest turn" in context and "zebra-crossing-42" in context


OWNERS = {Thread("telegram", "1001"): "telegram:1001", Thread("telegram", "1002"): "telegram:1002",
          Thread("telegram", "-100500"): "telegram:-100500", Thread("emacs", "main"): "local",
          Thread("cli", "local"): "local"}


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted(OWNERS, key=str)), min_size=2, max_size=10))
def test_no_thread_leaks_into_another_except_same_owner_recall(tmp_path_factory, order):
    home = tmp_path_factory.mktemp("home")
    backend = Recording()
    kernel, _, _ = kernel_for(home, backend)
    canaries: dict[str, Thread] = {}

    async def scenario():
        for index, thread in enumerate(order):
            canary = f"canary{index}x{abs(hash(thread)) % 997}"
            canaries[canary] = thread
            await say(kernel, f"remember {canary} please", thread.channel, thread.chat_id)
            await say(kernel, f"what do you remember about canary{index}x", thread.channel,
                      thread.chat_id)
        await kernel.aclose()

    run(scenario())
    recalled_into: dict[Thread, set[str]] = {}
    for thread, request in backend.prompts:
        seen = recalled_into.setdefault(thread, set())
        for position, message in enumerate(request.messages):
            for canary, origin in canaries.items():
                if origin == thread or canary not in message.content:
                    continue
                assert OWNERS[origin] == OWNERS[thread], (canary, origin, thread)
                if position == 0 and message.content.startswith("[Recalled"):
                    seen.add(canary)
                else:  # only what recall brought into this thread before
                    assert canary in seen, (canary, origin, thread)
        assert not any(canary in request.system for canary in canaries)


def test_saved_sessions_belong_to_their_owner(home):
    kernel, printed, _ = kernel_for(home)

    async def scenario():
        await say(kernel, "plans for the garden")
        saved = await say(kernel, "/save garden")
        mine = await say(kernel, "/sessions", "emacs", "main")      # same owner: local
        theirs = await say(kernel, "/sessions", "telegram", "42")   # another owner
        stolen = await say(kernel, "/load garden", "telegram", "42")
        return saved, mine, theirs, stolen

    saved, mine, theirs, stolen = run(scenario())
    assert "Saved as 'garden'" in saved.text
    assert "garden" in mine.text
    assert "garden" not in (theirs.text or "") and stolen.status == "failed"


def test_a_save_beyond_the_per_owner_limit_says_which_name_was_let_go(home):
    kernel, _, _ = kernel_for(home)
    saved = kernel.conversations.saved
    saved.per_owner = saved._index.per_owner = 2

    async def scenario():
        await say(kernel, "plans for the garden")
        answers = [await say(kernel, f"/save {name}") for name in ("one", "two", "three")]
        return answers, await say(kernel, "/sessions")

    answers, listed = run(scenario())
    assert "let go" not in answers[0].text + answers[1].text
    assert "'one' was let go: you keep the 2 names saved most recently." in answers[2].text
    assert "one" not in listed.text and "two" in listed.text and "three" in listed.text


def test_the_system_prompt_is_byte_identical_across_turns(home):
    backend = Recording()
    kernel, _, _ = kernel_for(home, backend)

    async def scenario():
        await say(kernel, "first, about the garden")
        await say(kernel, "second, about the garden again")
        await say(kernel, "/fork 1")
        await say(kernel, "third, on a branch")

    run(scenario())
    systems = {request.system for _, request in backend.prompts}
    assert len(backend.prompts) == 3 and len(systems) == 1


def test_idle_conversations_beyond_the_limit_are_let_go_and_rebuilt(home, monkeypatch):
    from opencortex.conversation import conversations as module
    monkeypatch.setattr(module, "OPEN_CONVERSATIONS", 2)
    kernel, _, _ = kernel_for(home)

    async def scenario():
        for chat in ("a", "b", "c"):
            await say(kernel, f"hello from {chat} with a fact {chat}42", "cli", chat)
        assert list(kernel.conversations._open) == [Thread("cli", "b"), Thread("cli", "c")]
        return (await say(kernel, "/history", "cli", "a")).text

    assert "fact a42" in run(scenario())


@pytest.mark.parametrize("text, command", [
    ("/help", True), ("  /history 3", True), ("/HELP", True), ("/no-such-thing", True),
    ("/nonexistent with words", True), ("/etc/hosts is weird", False), ("/5 apples", False),
    ("//help", False), ("/café", False), ("/", False), ("a /help", False), ("", False),
])
def test_what_counts_as_a_command(text, command):
    assert is_command(text) is command


def test_branches_switch_and_the_way_back_after_a_rewind(home):
    kernel, _, _ = kernel_for(home)

    async def scenario():
        for text in ("one", "two", "three"):
            await say(kernel, text)
        rewound = await say(kernel, "/rewind 1")
        listed = await say(kernel, "/branches")
        switched = await say(kernel, "/switch b2")
        history = await say(kernel, "/history")
        missing = await say(kernel, "/switch nowhere")
        again = await say(kernel, "/rewind 3")
        return rewound, listed, switched, history, missing, again

    rewound, listed, switched, history, missing, again = run(scenario())
    assert rewound.text == ("Rewound branch main to turn 1. The later turns are on branch b2: "
                            "/switch b2 gets back to them.")
    lines = listed.text.splitlines()
    assert lines[0].startswith("* main") and "1 turns, head at turn 1" in lines[0]
    assert lines[1].startswith("  b2") and "3 turns, head at turn 3" in lines[1]
    assert "'three'" in lines[1]
    assert switched.text == "Switched to branch b2 (3 turns)."
    assert "three" in history.text
    assert missing.status == "failed" and "no branch 'nowhere'" in missing.errors[0]
    assert "ends at turn 3 already" in again.text


def test_quit_answers_on_every_channel_and_reload_is_the_owners(home):
    """A guest's /reload reloaded every skill, and other chats' turns prepared meanwhile
    found no skill ("no skill handles this message": 229 of 602 failed while a guest
    sent /reload back to back)."""
    kernel, _, frontends = kernel_for(home)

    async def scenario():
        return [await say(kernel, text, "telegram", "7") for text in ("/quit", "/reload")] + [
            await say(kernel, "/reload")]

    quit_, refused, reload_ = run(scenario())
    assert quit_.status == "done" and "/quit means nothing on telegram" in quit_.text
    assert refused.status == "failed" and "only its owner may run it" in refused.errors[0]
    assert reload_.status == "done"
    assert reload_.text.startswith(f"Reloaded {len(kernel.skills.skills)} skills.")
    assert [text for _, text in frontends.delivered] == [quit_.text, refused.errors[0]]
    from opencortex.bridges.service import command_menu
    assert "reload" not in dict(command_menu()) and "recall" in dict(command_menu())


def test_a_reload_never_leaves_the_skills_empty_for_a_turn_meanwhile(home):
    kernel, _, _ = kernel_for(home)
    registry = kernel.skills
    seen: list[int] = []
    load_file = registry._load_file

    def watching(*args, **kwargs):
        seen.append(len(registry.skills))          # what a turn on another thread finds
        return load_file(*args, **kwargs)
    registry._load_file = watching
    registry.reload()
    assert seen and min(seen) > 0


def test_the_strategy_survives_a_restart(home):
    kernel, _, _ = kernel_for(home)
    assert "forget" in run(say(kernel, "/strategy forget")).text
    assert run(say(kernel, "/strategy forget")).status == "done"      # no second record
    run(say(kernel, "hello"))
    run(kernel.aclose())
    again, _, _ = kernel_for(home)
    conversation = run(again.conversations.open(CLI))
    assert conversation.context.strategy == "forget"
    controls = [r for r in again.archive.thread_records(CLI) if "VALUE" in r.extra]
    assert len(controls) == 1
    run(say(again, "/fork 1"))                                       # a refill keeps it
    assert run(again.conversations.open(CLI)).context.strategy == "forget"


def test_load_continues_the_saved_branch_instead_of_forking(home):
    kernel, _, _ = kernel_for(home)

    async def scenario():
        for text in ("start", "more", "/save plan", "extra"):
            await say(kernel, text)
        loaded = await say(kernel, "/load plan")
        await say(kernel, "/rewind 1")                 # the save's turn 2 leaves main
        await say(kernel, "other")
        forked = await say(kernel, "/load plan")
        conversation = await kernel.conversations.open(CLI)
        return loaded, forked, conversation

    loaded, forked, conversation = run(scenario())
    assert loaded.text == ("Loaded 'plan': you are on branch main with 3 turns. It was saved "
                           "at turn 2; /rewind 2 goes back there.")
    assert forked.text == "Loaded 'plan': you are on branch b3 with 2 turns."
    assert list(conversation.log.branches()) == ["main", "b2", "b3"]
    assert [t.user.text for t in conversation.log.turns()] == ["start", "more"]


def test_a_date_past_the_calendar_in_a_message_costs_nothing(home):
    """"4500 years ago" made recall raise OverflowError: the turn failed and the message
    was not archived.  The turn is answered and kept, and /recall explains it."""
    kernel, _, _ = kernel_for(home)

    async def scenario():
        await say(kernel, "the pyramids of Giza took decades to build")
        turn = await say(kernel, "The pyramids were built about 4500 years ago, right?")
        explained = await say(kernel, "/recall pyramids 4500 years ago on 9999-12-31")
        conversation = await kernel.conversations.open(CLI)
        return turn, explained, conversation

    turn, explained, conversation = run(scenario())
    assert turn.status == "done" and turn.ids
    assert conversation.log.turns()[-1].user.text.endswith("4500 years ago, right?")
    assert explained.status == "done" and "pyramids of Giza" in explained.text


def test_free_text_commands_take_the_line_as_typed(home):
    """/recall, /save, /load and /sessions take the rest of the line: an apostrophe is
    text ("cannot read the command: No closing quotation" before), and the words
    searched are the ones a turn would search."""
    kernel, _, _ = kernel_for(home)

    async def scenario():
        await say(kernel, "Caroline's dog is called Biscuit")
        recalled = await say(kernel, "/recall where's Caroline's dog?")
        saved = await say(kernel, "/save Ann's  plan")
        listed = await say(kernel, "/sessions Ann's")
        loaded = await say(kernel, '/load "Ann\'s plan"')
        return recalled, saved, listed, loaded

    recalled, saved, listed, loaded = run(scenario())
    assert recalled.status == "done"
    assert "searched for: Caroline's dog" in recalled.text and "Biscuit" in recalled.text
    assert saved.text.startswith("Saved as \"Ann's plan\"")
    assert listed.text.startswith("Ann's plan")
    assert loaded.text.startswith("Loaded \"Ann's plan\"")
