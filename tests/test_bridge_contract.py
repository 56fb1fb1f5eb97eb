"""The bridge contract, tested once for every platform: access, flood, splitting,
formatting, approvals, the durable inbox."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from hypothesis import given, settings, strategies as st

from opencortex.approvals import ApprovalRequest, action_digest
from opencortex.bridges.access import Gate
from opencortex.bridges.approvals import BridgeApprover, parse_answer, short_digest
from opencortex.bridges.contract import BridgeError, Unreadable
from opencortex.bridges.inbound import Inbound
from opencortex.bridges.inbox import Inbox
from opencortex.bridges.outbound import Pacer, RetryAfter, split_text, with_retry_after
from opencortex.bridges.render import to_html
from opencortex.bridges.settings import BridgeSettings
from opencortex.events import Thread


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(sender="1", chat=None, text="hi", position=1, **kw) -> Inbound:
    return Inbound(position=position, chat_id=chat or sender, sender_id=sender,
                   message_id=str(position), text=text, **kw)


# -- access ---------------------------------------------------------------------

def test_allowed_sender_passes_and_a_stranger_is_refused_once_per_interval():
    clock = Clock()
    gate = Gate(BridgeSettings(allow=["1"], refusal_interval=60), clock)
    assert gate.decide(message("1")).decision == "allow"
    assert gate.decide(message("666")).decision == "refuse"
    assert gate.decide(message("666")).decision == "ignore"
    clock.now += 61
    assert gate.decide(message("666")).decision == "refuse"
    assert gate.counts["stranger"] == 3


def test_silence_for_strangers_and_ids_written_as_numbers():
    gate = Gate(BridgeSettings.model_validate({"allow": [1], "strangers": "silence"}))
    assert gate.decide(message("1")).decision == "allow"
    assert gate.decide(message("2")).decision == "ignore"


def test_a_sender_vouched_for_by_an_allowed_alias_is_let_in_and_remembered():
    settings = BridgeSettings(allow=["+15550000020"])
    gate = Gate(settings)
    assert not gate.may_speak(message("uuid-a"))
    vouched = message("uuid-a", sender_aliases=("+15550000020",))
    assert gate.may_speak(vouched)
    assert gate.decide(vouched).decision == "allow"
    # later messages without the alias (a number hidden since) are still the friend's
    assert gate.decide(message("uuid-a", position=2)).decision == "allow"
    assert gate.is_allowed("uuid-a")
    # an alias nobody allowed lets nobody in, and the configuration is never changed
    assert gate.decide(message("uuid-b", sender_aliases=("+1666",))).decision == "refuse"
    assert settings.allow == ["+15550000020"]


def test_groups_need_the_group_the_sender_and_a_mention():
    gate = Gate(BridgeSettings(allow=["1"], groups=["-100"]))
    group = {"chat": "-100", "is_group": True}
    assert gate.decide(message("1", addressed_to_bot=True, **group)).decision == "allow"
    assert gate.decide(message("1", addressed_to_bot=False, **group)).decision == "ignore"
    assert gate.decide(message("2", addressed_to_bot=True, **group)).decision == "ignore"
    other = {"chat": "-200", "is_group": True}
    assert gate.decide(message("1", addressed_to_bot=True, **other)).decision == "ignore"


def test_flood_control_notices_once_then_drops_until_the_window_passes():
    clock = Clock()
    gate = Gate(BridgeSettings(allow=["1"], messages_per_minute=3), clock)
    decisions = [gate.decide(message("1")).decision for _ in range(6)]
    assert decisions == ["allow"] * 3 + ["flood-notice", "ignore", "ignore"]
    clock.now += 60
    assert gate.decide(message("1")).decision == "allow"


# -- splitting and formatting ---------------------------------------------------

@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(alphabet=st.sampled_from(list("ab .!?\n\t*_")), max_size=3000),
       st.integers(min_value=40, max_value=500))
def test_split_pieces_fit_and_lose_nothing_but_the_breaks(text, limit):
    pieces = split_text(text, limit)
    assert all(len(p) <= limit for p in pieces)
    assert "".join("".join(pieces).split()) == "".join(text.split())


def test_an_item_a_platform_cannot_read_is_skipped_but_a_platform_failure_is_not(caplog):
    """One odd item (a defect reading it) is left out with a line naming it and the
    error's type, not its text; the platform failing still fails the fetch (retried)."""
    caplog.set_level(logging.DEBUG)
    unreadable, taken = Unreadable("somewhere"), []
    for number in (1, 2, 3):
        with unreadable.skipped(f"item {number}"):
            if number == 2:
                raise TypeError("it quoted the secret text")
            taken.append(number)
    assert taken == [1, 3]
    assert "somewhere: skipped an incoming item it could not read (item 2: TypeError)" \
        in caplog.text
    assert "secret text" not in caplog.text
    with pytest.raises(BridgeError):
        with unreadable.skipped("item 4"):
            raise BridgeError("the network is down")


def test_split_prefers_paragraphs_and_reopens_a_cut_code_block():
    prose = "First paragraph. " * 8 + "\n\n" + "Second one. " * 6
    assert [p.rstrip() for p in split_text(prose, 200)] == \
        [p.rstrip() for p in prose.split("\n\n")]
    code = "```python\n" + "".join(f"x{i} = {i}\n" for i in range(100)) + "```"
    pieces = split_text(code, 200)
    assert len(pieces) > 1
    assert all(p.startswith("```") and p.rstrip().endswith("```") for p in pieces)


def test_org_becomes_platform_html_and_nothing_else_is_markup():
    html = to_html('* Title <b>\n*bold* /it/ =a<b= [[https://e.org/?a=1&b][site]] '
                   '[[elisp:(kill-emacs)][click]] <script>\n\x1b]0;x\x07')
    assert html.startswith("<b>Title &lt;b&gt;</b>")
    assert "<b>bold</b> <i>it</i> <code>a&lt;b</code>" in html
    assert '<a href="https://e.org/?a=1&amp;b">site</a>' in html
    assert "elisp" not in html and "&lt;script&gt;" in html
    assert "\x1b" not in html and "\x07" not in html


@pytest.mark.parametrize("text", ["https://bank.example", "www.bank.example",
                                  "bank.example/login", "mailto:help@bank.example"])
def test_a_link_whose_text_names_another_address_shows_where_it_goes(text):
    """Model text on a phone: `[[https://evil.example][https://bank.example]]` would show
    the bank and open the other; the real address is written beside such a text."""
    html = to_html(f"pay at [[https://evil.example/x][{text}]] today")
    assert f'<a href="https://evil.example/x">{text}</a> (https://evil.example/x)' in html
    same = to_html("[[https://bank.example][https://bank.example]] "
                   "[[https://b.example][the bank]]")
    assert same == ('<a href="https://bank.example">https://bank.example</a> '
                    '<a href="https://b.example">the bank</a>')


# -- approvals ------------------------------------------------------------------

class Surface:
    def __init__(self) -> None:
        self.shown: list[tuple[str, str, str]] = []
        self.settled: list[str] = []

    async def show_approval(self, chat_id, text, approval_id, digest, reply_to=None):
        self.shown.append((chat_id, approval_id, digest))
        return len(self.shown)

    async def settle_approval(self, chat_id, handle, outcome):
        self.settled.append(outcome)


def request(asker="1", timeout=5.0) -> ApprovalRequest:
    return ApprovalRequest(thread=Thread("telegram", "1"), action_class="shell",
                           title="Run a command", timeout=timeout, argv=("ls",), cwd="/",
                           requested_by=asker, digest=action_digest("(:type :request)"))


def test_only_the_asker_decides_with_the_right_digest_and_only_once():
    async def scenario():
        surface = Surface()
        approver = BridgeApprover(surface, approvers=[])
        asked = request()
        waiting = asyncio.create_task(approver.ask(asked))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        digest = short_digest(asked)
        assert "Only the person" in approver.decide(asked.id, digest, "2", True)
        assert "does not match" in approver.decide(asked.id, "0" * 16, "1", True)
        assert approver.decide(asked.id, digest, "1", True) == "Approved."
        assert "no longer open" in approver.decide(asked.id, digest, "1", False)
        return (await waiting).how, surface.settled
    how, settled = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert how == "approved" and settled == ["Approval approved."]


def test_an_unanswered_approval_expires_as_a_denial():
    async def scenario():
        approver = BridgeApprover(Surface(), approvers=[], timeout=0.05)
        return (await approver.ask(request())).how
    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == "timed-out"


@pytest.mark.parametrize("text,answer", [("approve", True), ("Deny!", False), ("yes", True),
                                         ("approve it please", None), ("", None)])
def test_text_answers(text, answer):
    assert parse_answer(text) is answer


# -- outbound pacing and retry-after --------------------------------------------

def test_retry_after_is_honoured_a_bounded_number_of_times():
    calls = []

    async def send():
        calls.append(1)
        if len(calls) < 3:
            raise RetryAfter(0.01)
        return "sent"
    assert asyncio.run(with_retry_after(send)) == "sent" and len(calls) == 3

    async def never():
        raise RetryAfter(0.0)
    with pytest.raises(RetryAfter):
        asyncio.run(with_retry_after(never))


def test_pacer_spaces_messages_in_one_chat():
    clock = Clock()
    pacer = Pacer(per_chat=1.0, per_second=100, clock=clock)
    slept: list[float] = []

    async def scenario():
        real_sleep = asyncio.sleep

        async def fake_sleep(seconds):
            slept.append(seconds)
            clock.now += seconds
            await real_sleep(0)
        asyncio.sleep = fake_sleep
        try:
            for _ in range(3):
                await pacer.wait("a")
            await pacer.wait("b")
        finally:
            asyncio.sleep = real_sleep
    asyncio.run(scenario())
    assert [round(s, 2) for s in slept] == [1.0, 1.0, 0.01]


# -- the durable inbox ----------------------------------------------------------

def test_inbox_keeps_what_is_not_done_across_a_restart(tmp_path):
    path = tmp_path / "inbox.jsonl"
    inbox = Inbox(path)
    assert [m.position for m in inbox.add([message(position=5), message(position=6)])] == [5, 6]
    inbox.done(5)
    inbox.close()
    with open(path, "ab") as handle:
        handle.write(b'{"add": {"posit')     # torn by a crash mid-write
    again = Inbox(path)
    assert [m.position for m in again.pending()] == [6]
    assert again.add([message(position=6), message(position=5)]) == []   # redelivered
    assert [m.position for m in again.add([message(position=7)])] == [7]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_inbox_takes_a_late_redelivery_it_never_kept_and_skips_what_it_did(tmp_path):
    from opencortex.bridges import inbox as inbox_module
    inbox = Inbox(tmp_path / "inbox.jsonl")
    inbox.add([message(position=10), message(position=12)])   # 11 was refused, comes later
    inbox.done(10)
    inbox.done(12)
    assert [m.position for m in inbox.add([message(position=11)])] == [11]
    assert inbox.add([message(position=10), message(position=12)]) == []
    inbox.done(11)
    inbox.compact()
    inbox.close()
    again = Inbox(tmp_path / "inbox.jsonl")
    assert again.add([message(position=p) for p in (10, 11, 12)]) == []
    assert [m.position for m in again.add([message(position=9)])] == [9]
    assert inbox_module.DONE_WINDOW >= 1000


def test_the_inbox_waits_for_its_disk_off_the_loop(tmp_path, monkeypatch):
    """`keep` waits for its fsync on the inbox's own thread and `done` queues its mark: a
    slow disk holds up the batch being kept, never the event loop."""
    import threading
    real, entered, release = os.fsync, threading.Event(), threading.Event()

    def fsync(fd: int) -> None:
        if threading.current_thread().name.startswith("opencortex-inbox"):
            entered.set()
            assert release.wait(20), "the test never released the disk"
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    inbox = Inbox(tmp_path / "inbox.jsonl")

    async def scenario():
        keeping = asyncio.create_task(inbox.keep([message(position=1), message(position=2)]))
        assert await asyncio.to_thread(entered.wait, 20)
        for _ in range(3):                      # the loop runs on while the disk is held
            await asyncio.sleep(0)
        assert not keeping.done()
        release.set()
        assert [m.position for m in await asyncio.wait_for(keeping, 20)] == [1, 2]
        inbox.done(1)                            # queued: returns at once
        assert [m.position for m in inbox.pending()] == [2]
    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        release.set()
        inbox.close()
    again = Inbox(tmp_path / "inbox.jsonl")
    assert [m.position for m in again.pending()] == [2]
    again.close()


def test_the_inbox_compacts_while_a_message_is_pending_and_keeps_it(tmp_path):
    """A long turn pending must not keep every done message's text on disk."""
    path = tmp_path / "inbox.jsonl"
    inbox = Inbox(path)
    inbox.add([message(position=1, text="still pending")])
    for position in range(2, 2500):
        inbox.add([message(position=position, text="done text")])
        inbox.done(position)
    inbox.close()
    content = path.read_text()
    assert content.count("done text") < 1100           # before: 2,498, and growing
    again = Inbox(path)
    assert [(m.position, m.text) for m in again.pending()] == [(1, "still pending")]
    assert again.add([message(position=p) for p in (1, 2000, 2499)]) == []
    again.close()


def test_the_inbox_takes_positions_that_restart_lower_as_a_new_sequence(tmp_path, monkeypatch,
                                                                       caplog):
    from opencortex.bridges import inbox as inbox_module
    monkeypatch.setattr(inbox_module, "DONE_WINDOW", 100)
    monkeypatch.setattr(inbox_module, "RESTART_GAP", 20, raising=False)
    path = tmp_path / "inbox.jsonl"
    inbox = Inbox(path)
    for position in range(1, 301):
        inbox.add([message(position=position)])
        inbox.done(position)
    assert inbox.add([message(position=295)]) == []               # a recent redelivery
    assert [m.position for m in inbox.add([message(position=150, text="zzqx")])] == [150]
    assert "zzqx" not in caplog.text and "new sequence" in caplog.text
    inbox.done(150)
    assert [m.position for m in inbox.add([message(position=151)])] == [151]
    inbox.close()
    again = Inbox(path)                                           # the restart is durable
    assert [m.position for m in again.pending()] == [151]
    assert again.add([message(position=150), message(position=151)]) == []
    assert [m.position for m in again.add([message(position=152)])] == [152]
    assert [m.position for m in again.add([message(position=7)])] == [7]   # under 150: new
    again.close()


def test_a_low_priority_message_takes_only_a_free_slot_and_never_delays_others():
    clock = Clock()
    pacer = Pacer(per_chat=1.0, per_second=10.0, clock=clock)
    assert pacer.try_now("stranger-1")
    assert not pacer.try_now("stranger-2")       # the global slot is taken for 0.1 s

    async def reply() -> None:
        await pacer.wait("owner")                 # a reply reserves the next slot
    asyncio.run(reply())
    clock.now += 0.1
    assert not pacer.try_now("stranger-2")       # the reply's slot: a refusal waits
    clock.now += 0.15
    assert pacer.try_now("stranger-2")
