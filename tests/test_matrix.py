"""The Matrix bridge: the real matrix-nio against a real Synapse on 127.0.0.1.

One homeserver serves the whole module (it fails the module with Synapse's own
log lines if it cannot start); each test registers its own accounts, so tests
do not see each other's rooms.  The person is a second matrix-nio client with
its own crypto store.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import stat
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nio import MegolmEvent, RoomMessageNotice

from opencortex.bridges import matrix, matrix_session
from opencortex.bridges.matrix import (APPROVAL_HINT, ENCRYPTED_ONLY, UNDECRYPTABLE, UNTRUSTED,
                                       MatrixPlatform)
from opencortex.bridges.matrix_session import MatrixSession
from opencortex.bridges.matrix_state import MatrixState
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.runner import check_bridge
from opencortex.bridges.settings import MatrixSettings
from opencortex.events import Thread
from opencortex.llm.echo import EchoBackend, echo_text

from bridge_helpers import archived_step, running_bridge, script, until
from matrix_person import Person
from synapse import Homeserver

MODULE_DEADLINE = 120   # seconds any one test may take
_names = itertools.count()


@pytest.fixture(scope="module")
def homeserver(tmp_path_factory):
    with Homeserver(tmp_path_factory.mktemp("synapse")) as server:
        yield server


def run(coro):
    asyncio.run(asyncio.wait_for(coro, MODULE_DEADLINE))


def accounts(homeserver: Homeserver, *roles: str):
    """A fresh account per role (names unique in the module)."""
    number = next(_names)
    return [homeserver.register(f"{role}{number}") for role in roles]


@asynccontextmanager
async def bridge(home: Path, homeserver: Homeserver, bot, allow, backend=None, owners=None,
                 **options):
    """A kernel with the Matrix bridge logged in as BOT (by password), running."""
    settings = MatrixSettings(enabled=True, homeserver=homeserver.url, user_id=bot.user_id,
                              allow=allow, poll_timeout=1, **options)
    platform = MatrixPlatform(settings, bot.password, home / "bridges" / "matrix", password=True)
    async with running_bridge(home, platform, settings, backend=backend,
                              owners=owners) as (running, kernel):
        yield running, kernel


@asynccontextmanager
async def people(homeserver: Homeserver, tmp_path: Path, *accounts_):
    started = []
    try:
        for index, account in enumerate(accounts_):
            started.append(await Person(homeserver, account,
                                        tmp_path / f"person{index}").start())
        yield started
    finally:
        for person in started:
            await person.close()


async def joined(person: Person, room_id: str, bot_id: str) -> None:
    await person.until(lambda: person.membership(room_id, bot_id) == "join")


@asynccontextmanager
async def room_with_the_bot(homeserver: Homeserver, home: Path, tmp_path: Path, bot, owner,
                            *, encrypted: bool, **options):
    """OWNER's client and BOT's bridge (OWNER allowed, OPTIONS as `bridge` takes them) in
    a new room of the two, the bot joined: (person, running bridge, kernel, room id)."""
    async with people(homeserver, tmp_path, owner) as (person,), \
            bridge(home, homeserver, bot, [owner.user_id], **options) as (running, kernel):
        room = await person.create_room([bot.user_id], encrypted=encrypted)
        await joined(person, room, bot.user_id)
        yield person, running, kernel, room


# -- end to end, encrypted ----------------------------------------------------------

def test_an_encrypted_room_end_to_end_across_a_restart(homeserver, home, tmp_path,
                                                       monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setitem(matrix_session.SYNC_FILTER["room"]["timeline"], "limit", 2)
    backfilled = []
    original = MatrixSession._backfill

    async def backfill(self, *args):
        backfilled.append(await original(self, *args))
        return backfilled[-1]
    monkeypatch.setattr(MatrixSession, "_backfill", backfill)
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with people(homeserver, tmp_path, owner) as (person,):
            room = await person.create_room([bot.user_id], encrypted=True)
            async with bridge(home, homeserver, bot, [owner.user_id]) as (running, kernel):
                await joined(person, room, bot.user_id)
                await person.say(room, "hello *there*")
                await person.until(lambda: person.messages(room, bot.user_id))
                reply = person.messages(room, bot.user_id)[0]
                assert reply.decrypted and reply.body == "[Echo] hello *there*"
                assert reply.formatted_body == "[Echo] hello <b>there</b>"
                assert isinstance(person.events[-1][1], type(reply))
                device = running.platform.client.device_id
                await until(lambda: {str(t) for t in kernel.archive.threads()} ==
                            {f"matrix:{room}"})
            for text in ("while away 1", "while away 2", "while away 3"):
                await person.say(room, text)
            async with bridge(home, homeserver, bot, [owner.user_id]) as (running, kernel):
                assert running.platform.client.device_id == device
                await person.say(room, "back again")
                await person.until(lambda: len(person.bodies(room, bot.user_id)) >= 5)
                # what waited on the server is dated when it was sent, not when taken
                await person.until(lambda: len(person.bodies(room, owner.user_id)) >= 5)
                sent = {getattr(e, "body", ""): e.server_timestamp / 1000
                        for e in person.messages(room, owner.user_id)}
                said = {r.text: r.timestamp for r in kernel.archive.read_thread(
                    Thread("matrix", room)) if r.role == "user"}
                assert [said[t] for t in ("while away 1", "while away 3")] == \
                    [sent["while away 1"], sent["while away 3"]]
        assert person.bodies(room, bot.user_id) == [
            "[Echo] hello *there*", "[Echo] while away 1", "[Echo] while away 2",
            "[Echo] while away 3", "[Echo] back again"]
        assert all(m.decrypted for m in person.messages(room, bot.user_id))
        assert any(backfilled)   # the gap was longer than one sync's timeline
    run(scenario())
    state = home / "bridges" / "matrix"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "crypto").stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "state.sqlite3").stat().st_mode) == 0o600
    kept = MatrixState(state)
    token = kept.get("access_token")
    kept.close()
    assert token and token not in caplog.text and bot.password not in caplog.text
    assert "while away" not in caplog.text and "hello" not in caplog.text


def test_replies_follow_the_thread_and_edits_are_not_answered(homeserver, home, tmp_path):
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner,
                                     encrypted=False) as (person, _, _, room):
            root = await person.say(room, "a thread root")
            await person.until(lambda: len(person.messages(room, bot.user_id)) == 1)
            await person.say(room, "* changed", **{
                "m.new_content": {"msgtype": "m.text", "body": "changed"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": root}})
            inside = await person.say(room, "inside", **{"m.relates_to": {
                "rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                "m.in_reply_to": {"event_id": root}}})
            await person.until(lambda: len(person.messages(room, bot.user_id)) == 2)
            reply = person.messages(room, bot.user_id)[1]
            relation = reply.source["content"]["m.relates_to"]
            assert reply.body == "[Echo] inside"
            assert relation["rel_type"] == "m.thread" and relation["event_id"] == root
            assert relation["m.in_reply_to"]["event_id"] == inside
            await person.say(room, "main timeline again")
            await person.until(lambda: len(person.messages(room, bot.user_id)) == 3)
            assert "m.relates_to" not in person.messages(room, bot.user_id)[2].source["content"]
    run(scenario())


class Held(EchoBackend):
    """Echo, holding the reply to a message that says "hold" until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.holding = False

    async def stream(self, request):
        if "hold" in echo_text(request):
            self.holding = True
            await self.release.wait()
        async for item in super().stream(request):
            yield item


def test_a_reply_goes_to_the_thread_of_the_message_it_answers(homeserver, home, tmp_path):
    """The person writes in thread A, then in thread B while A's turn runs: A's answer
    is in A (it went where they last wrote, B), also when the bridge no longer knows
    A's thread (a restart in between: the homeserver is asked)."""
    bot, owner = accounts(homeserver, "bot", "owner")
    held = Held()

    def thread(root: str, reply_to: str) -> dict:
        return {"m.relates_to": {"rel_type": "m.thread", "event_id": root,
                                 "is_falling_back": True, "m.in_reply_to": {"event_id": reply_to}}}

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner, encrypted=False,
                                     backend=held) as (person, running, _, room):
            said = lambda: person.messages(room, bot.user_id)   # noqa: E731
            root_a = await person.say(room, "thread a")
            await person.until(lambda: len(said()) == 1)
            root_b = await person.say(room, "thread b")
            await person.until(lambda: len(said()) == 2)
            inside_a = await person.say(room, "hold on, in a", **thread(root_a, root_a))
            await until(lambda: held.holding, 30)
            await person.say(room, "now in b", **thread(root_b, root_b))
            await until(lambda: running.platform._threads[room][0] == root_b, 30)
            running.platform._roots.clear()           # as after a restart
            held.release.set()
            await person.until(lambda: len(said()) == 4)
            answers = {e.body: e.source["content"]["m.relates_to"] for e in said()[2:]}
            in_a = answers["[Echo] hold on, in a"]
            assert (in_a["event_id"], in_a["m.in_reply_to"]["event_id"]) == (root_a, inside_a)
            assert answers["[Echo] now in b"]["event_id"] == root_b
    run(scenario())


# -- who may talk ----------------------------------------------------------------------

def test_a_strangers_invite_is_declined_and_their_words_never_reach_the_kernel(
        homeserver, home, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    bot, owner, stranger = accounts(homeserver, "bot", "owner", "stranger")

    async def scenario():
        async with people(homeserver, tmp_path, owner, stranger) as (person, other):
            theirs = await other.create_room([bot.user_id], encrypted=True)
            group = await person.create_room([bot.user_id], encrypted=False, public=True)
            async with bridge(home, homeserver, bot, [owner.user_id],
                              groups=[group]) as (running, kernel):
                await other.until(lambda: other.membership(theirs, bot.user_id) == "leave")
                await joined(person, group, bot.user_id)
                assert not hasattr(await other.client.join(group), "status_code")
                await other.until(lambda: other.membership(group, stranger.user_id) == "join")
                await person.until(lambda: person.membership(group, stranger.user_id) == "join")
                await other.say(group, f"{bot.user_id} secret stranger words")
                await person.say(group, "no mention, no answer")
                await person.say(group, f"{bot.user_id.split(':')[0][1:]}: hello")
                await person.until(lambda: person.messages(group, bot.user_id))
                assert person.bodies(group, bot.user_id) == [
                    f"[Echo] {bot.user_id.split(':')[0][1:]}: hello"]
                assert running.gate.counts["group-stranger"] == 1
                assert running.gate.counts["group-not-addressed"] == 1
                assert bot.user_id not in {user for user in
                                           running.platform.client.rooms.get(theirs, {})}
    run(scenario())
    assert "secret stranger words" not in caplog.text


def test_a_message_whose_fields_are_not_what_the_spec_says_is_skipped_not_fatal(
        homeserver, home, tmp_path):
    """Synapse checks the fields of a plain message its own users send (a `msgtype`
    must be text), but it cannot see inside an encrypted one, and does not check
    events other servers send it (`EventValidator.validate_new`: "stricter checks
    than is appropriate for an event received over federation").  One message whose
    `msgtype` was an object, in any room the bot is in, made the bridge's fetch raise
    TypeError (unhashable), which nothing retried: the Matrix bridge ended, and the
    batch, never acknowledged, ended it again after every restart."""
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner,
                                     encrypted=True) as (person, running, _, room):
            await person.say(room, "odd", msgtype={"not": "text"},
                             **{"m.relates_to": ["a", "list"], "m.mentions": "everyone"})
            await person.say(room, "still answered")
            await person.until(lambda: person.messages(room, bot.user_id))
            assert person.bodies(room, bot.user_id) == ["[Echo] still answered"]
            assert running.status["state"] == "running"
    run(scenario())


def test_an_event_the_platform_cannot_read_is_skipped_and_the_next_answered(
        homeserver, home, tmp_path, monkeypatch, caplog):
    """A defect reading one event failed the whole sync batch, on every retry: the
    messages after it were never answered.  Now only that event is left out."""
    caplog.set_level(logging.DEBUG)
    read = matrix.read_event

    def odd_reading(source):
        if "odd one" in str(source.get("content")):
            raise TypeError("it quoted the odd one")
        return read(source)
    monkeypatch.setattr(matrix, "read_event", odd_reading)
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner,
                                     encrypted=False) as (person, running, _, room):
            await person.say(room, "odd one")
            await person.say(room, "after it")
            await person.until(lambda: person.messages(room, bot.user_id))
            assert person.bodies(room, bot.user_id) == ["[Echo] after it"]
            assert running.status["errors"] == 0
    run(scenario())
    assert "matrix: skipped an incoming item it could not read (event $" in caplog.text
    assert "quoted the odd one" not in caplog.text


# -- approvals, limits, keys ---------------------------------------------------------

SHELL = '(:type :REQUEST :target :shell :cmd ("echo" "approved-run"))'
AFTER = '(:type :RESPONSE :text "after the command")'   # the model's answer after the step


def test_an_approval_by_reaction_runs_the_action(homeserver, home, tmp_path):
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner, encrypted=True,
                                     backend=script(tmp_path, SHELL, AFTER),
                                     owners={"matrix:*": "developer"}) as (person, _, kernel,
                                                                           room):
            await person.say(room, "run it")
            asked = await person.until(lambda: [m for m in person.messages(room, bot.user_id)
                                                if APPROVAL_HINT in m.body])
            assert "echo approved-run" in asked[0].body
            await person.until(lambda: len(reactions(person, asked[0].event_id)) == 2)
            await person.react(room, asked[0].event_id, "👍")   # not an answer: ignored
            await person.react(room, asked[0].event_id, "✅")
            await person.until(lambda: "after the command" in person.bodies(room, bot.user_id))
            said = person.bodies(room, bot.user_id)
            assert "⚙ step 1: shell echo approved-run → done" in said
            await person.until(lambda: edits(person, asked[0].event_id))
            assert "Approval approved." in edits(person, asked[0].event_id)[0]
            result = await archived_step(kernel, Thread("matrix", room))
            assert "(exit 0)" in result and "approved-run" in result   # it ran
    run(scenario())


def reactions(person: Person, event_id: str) -> list[str]:
    return [e.source["content"]["m.relates_to"]["key"] for _, e in person.events
            if e.source.get("type") == "m.reaction"
            and e.source["content"]["m.relates_to"]["event_id"] == event_id]


def edits(person: Person, event_id: str) -> list[str]:
    return [e.source["content"]["m.new_content"]["body"] for _, e in person.events
            if e.source.get("content", {}).get("m.relates_to", {}).get("event_id") == event_id
            and e.source["content"]["m.relates_to"].get("rel_type") == "m.replace"]


def test_m_limit_exceeded_is_honoured(homeserver, home, tmp_path):
    admin, bot, owner = accounts(homeserver, "admin", "bot", "owner")
    homeserver.request("PUT", f"/_synapse/admin/v2/users/{admin.user_id}", {"admin": True},
                       token=homeserver.register(f"root{next(_names)}", admin=True).access_token)
    homeserver.override_ratelimit(admin, bot.user_id, per_second=1, burst=1)

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner,
                                     encrypted=False) as (person, running, _, room):
            platform = running.platform
            await until(lambda: room in platform.client.rooms)
            with pytest.raises(RetryAfter) as limited:
                for index in range(5):   # one message a second, a burst of one
                    await platform.send(room, "", f"quick {index}")
            assert 0 < limited.value.seconds <= 2
            await running.actuator.deliver(room, "after the wait")
            await person.until(lambda: "after the wait" in person.bodies(room, bot.user_id))
    run(scenario())


def test_an_undecryptable_message_gets_a_key_request_and_a_notice(homeserver, home, tmp_path):
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with room_with_the_bot(homeserver, home, tmp_path, bot, owner,
                                     encrypted=True) as (person, _, _, room):
            devices = await person.until(lambda: list(
                person.client.device_store.active_user_devices(bot.user_id)))
            for device in devices:
                person.client.blacklist_device(device)    # the bot gets no key
            await person.say(room, "you cannot read this")
            notice = await person.until(lambda: person.messages(room, bot.user_id))
            assert isinstance(notice[0], RoomMessageNotice) and notice[0].decrypted
            assert notice[0].body == UNDECRYPTABLE
            await person.until(lambda: [e for e in person.to_device
                                        if e.source.get("type") == "m.room_key_request"])
    run(scenario())


def test_verified_trust_answers_only_listed_devices(homeserver, home, tmp_path):
    bot, owner = accounts(homeserver, "bot", "owner")

    async def scenario():
        async with people(homeserver, tmp_path, owner, owner) as (phone, laptop):
            key = phone.client.olm.account.identity_keys["ed25519"]
            spaced = " ".join(key[i:i + 4] for i in range(0, len(key), 4))   # as clients show it
            room = await phone.create_room([bot.user_id], encrypted=True)
            async with bridge(home, homeserver, bot, [owner.user_id], trust="verified",
                              verified_devices={owner.user_id: {phone.client.device_id: spaced}}):
                await joined(phone, room, bot.user_id)
                await laptop.until(lambda: room in laptop.client.rooms)
                await laptop.say(room, "from the unlisted laptop")
                notice = await phone.until(lambda: phone.messages(room, bot.user_id))
                assert notice[0].body == UNTRUSTED
                await phone.say(room, "from the listed phone")
                await phone.until(lambda: len(phone.messages(room, bot.user_id)) == 2)
                assert phone.bodies(room, bot.user_id)[1] == "[Echo] from the listed phone"
                await laptop.until(lambda: len(laptop.messages(room, bot.user_id)) == 2)
                assert all(isinstance(m, MegolmEvent)   # the laptop gets no key to them
                           for m in laptop.messages(room, bot.user_id))
                plain = await phone.create_room([bot.user_id], encrypted=False)
                await joined(phone, plain, bot.user_id)
                await phone.say(plain, "in the clear")
                await phone.until(lambda: phone.messages(plain, bot.user_id))
                assert phone.bodies(plain, bot.user_id) == [ENCRYPTED_ONLY]
    run(scenario())


# -- durability, login, doctor -----------------------------------------------------------

async def fetch_until(platform: MatrixPlatform, predicate):
    """PLATFORM's next fetched items for which PREDICATE holds (30 fetches at most)."""
    for _ in range(30):
        items = await platform.fetch()
        if predicate(items):
            return items
    raise AssertionError("nothing came")


def bot_platforms(homeserver: Homeserver, tmp_path: Path):
    """Fresh bot and owner accounts, and a maker of the bot's platform (a password login;
    each one made keeps its state where the one before did: a restart)."""
    bot, owner = accounts(homeserver, "bot", "owner")
    settings = MatrixSettings(enabled=True, homeserver=homeserver.url, user_id=bot.user_id,
                              allow=[owner.user_id], poll_timeout=1)
    return bot, owner, lambda: MatrixPlatform(settings, bot.password, tmp_path / "state",
                                              password=True)


async def started_in(platform: MatrixPlatform, room: str) -> MatrixPlatform:
    """PLATFORM started, once it has synced ROOM (it joined it)."""
    await platform.start()
    await fetch_until(platform, lambda _: room in platform.client.rooms)
    return platform


def test_a_message_fetched_but_not_acknowledged_comes_back_with_its_position(
        homeserver, tmp_path):
    bot, owner, platform = bot_platforms(homeserver, tmp_path)

    async def scenario():
        async with people(homeserver, tmp_path, owner) as (person,):
            room = await person.create_room([bot.user_id], encrypted=True)
            first = await started_in(platform(), room)
            await first.acknowledge()
            await joined(person, room, bot.user_id)
            await person.say(room, "keep me")
            got = await fetch_until(first, lambda items: items)
            await first.stop()                      # a crash: fetched, never acknowledged
            again = platform()
            await again.start()
            redelivered = await fetch_until(again, lambda items: items)
            await again.acknowledge()
            await person.say(room, "and then me")
            later = await fetch_until(again, lambda items: items)
            await again.stop()
            return got, redelivered, later
    got, redelivered, later = asyncio.run(asyncio.wait_for(scenario(), MODULE_DEADLINE))
    assert [m.text for m in got] == ["keep me"] and redelivered == got
    assert [m.text for m in later] == ["and then me"] and later[0].position > got[0].position


def test_a_reply_said_again_after_a_crash_is_one_message_in_the_room(homeserver, tmp_path):
    """A reply sent, then a crash before its message was marked done: the bridge says the
    archived reply again under the same key, and the homeserver keeps one event (the
    key is the transaction id, and the kept login makes it the same client's)."""
    bot, owner, platform = bot_platforms(homeserver, tmp_path)

    async def scenario():
        async with people(homeserver, tmp_path, owner) as (person,):
            room = await person.create_room([bot.user_id], encrypted=True)
            first = await started_in(platform(), room)
            await joined(person, room, bot.user_id)
            await first.send(room, "", "the reply", key="reply-1/0")
            await first.stop()                      # the crash
            again = await started_in(platform(), room)
            await again.send(room, "", "the reply", key="reply-1/0")    # said again
            await again.send(room, "", "the next reply", key="reply-2/0")
            await again.send(room, "", "a notice", key=None)           # no key: always sent
            await again.send(room, "", "a notice", key=None)
            await person.until(lambda: len(person.bodies(room, bot.user_id)) >= 4)
            await asyncio.sleep(0.5)
            await again.stop()
            return person.bodies(room, bot.user_id)
    bodies = asyncio.run(asyncio.wait_for(scenario(), MODULE_DEADLINE))
    assert bodies == ["the reply", "the next reply", "a notice", "a notice"]


def test_logins_by_token_and_by_password_and_the_doctor_check(homeserver, home, monkeypatch):
    bot, = accounts(homeserver, "bot")
    settings = MatrixSettings(enabled=True, homeserver=homeserver.url, user_id=bot.user_id)
    monkeypatch.delenv(settings.token_env, raising=False)
    monkeypatch.delenv(settings.password_env, raising=False)

    def check():
        return asyncio.run(asyncio.wait_for(check_bridge("matrix", settings, home=home), 60))
    works, found, _ = check()
    assert not works and found == ("$OPENCORTEX_MATRIX_TOKEN or $OPENCORTEX_MATRIX_PASSWORD "
                                   "is not set")
    monkeypatch.setenv(settings.password_env, "wrong")
    works, found, _ = check()
    assert not works and "refused the login" in found and "wrong" not in found
    monkeypatch.setenv(settings.password_env, bot.password)
    assert check() == (True, f"connected as {bot.user_id}", "")
    kept = MatrixState(home / "bridges" / "matrix")
    device = kept.get("device_id")
    kept.put(access_token="revoked-token")         # the server no longer knows it
    kept.close()
    assert check() == (True, f"connected as {bot.user_id}", "")
    kept = MatrixState(home / "bridges" / "matrix")
    assert kept.get("device_id") == device and kept.get("access_token") != "revoked-token"
    kept.close()
    monkeypatch.setenv(settings.token_env, bot.access_token)   # a token wins over a password
    assert check() == (True, f"connected as {bot.user_id}", "")
    monkeypatch.setenv(settings.token_env, "not-a-token")
    works, found, _ = check()
    assert not works and "no longer accepts the access token" in found

