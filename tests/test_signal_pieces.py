"""The Signal bridge's pieces: settings, error mapping, envelopes, styles, the transport."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from opencortex.bridges.contract import BridgeError, FormattingRejected
from opencortex.bridges.outbound import RetryAfter
from opencortex.bridges.runner import PLATFORMS, build_bridges, check_bridge
from opencortex.bridges.settings import BridgesSettings, SignalSettings
from opencortex.bridges.signal import SignalPlatform, target
from opencortex.bridges.signal_envelope import reaction_answer
from opencortex.bridges.signal_rpc import RpcConnection, RpcError, parse_address
from opencortex.bridges.signal_text import styled
from opencortex.config import load_config
from opencortex.llm import EchoBackend
from opencortex.runtime import build_kernel

from signal_fake import ACCOUNT, GROUP, OWNER, FakeSignalCli, rate_limited


def test_doctor_check_over_a_unix_socket(tmp_path):
    async def scenario():
        fake = FakeSignalCli()
        path = await fake.start(str(tmp_path / "signal.sock"))
        try:
            return await check_bridge("signal", SignalSettings(enabled=True, address=path,
                                                               account=ACCOUNT))
        finally:
            await fake.stop()
    assert run_result(scenario()) == (True, f"connected as {ACCOUNT}", "")
    works, found, fix = run_result(check_bridge("signal", SignalSettings(
        enabled=True, address=str(tmp_path / "nothing.sock"))))
    assert not works and "cannot reach the signal-cli daemon" in found and "daemon" in found


def run_result(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_responses_out_of_order_and_notifications_between_them():
    async def daemon(reader, writer):
        first, second = [json.loads(await reader.readline()) for _ in range(2)]
        writer.write(b"[" * 100_000 + b"\n")      # JSON too deep to read: skipped, not fatal
        for message in ({"jsonrpc": "2.0", "method": "receive", "params": {}},
                        {"jsonrpc": "2.0", "result": "two", "id": second["id"]},
                        {"jsonrpc": "2.0", "error": {"code": -1, "message": "no"},
                         "id": first["id"]}):
            writer.write(json.dumps(message).encode() + b"\n")
        await writer.drain()
        await reader.readline()
        writer.close()

    async def scenario():
        server = await asyncio.start_server(daemon, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await RpcConnection.open(f"127.0.0.1:{port}", 5)
        try:
            first = asyncio.ensure_future(connection.call("one", None, 5))
            await asyncio.sleep(0)                  # "one" is written first
            second = await connection.call("two", {"x": "é"}, 5)
            with pytest.raises(RpcError) as failed:
                await first
            notes = await connection.notifications(5)
        finally:
            await connection.close()
            server.close()
            await server.wait_closed()
        return second, failed.value, notes
    second, error, notes = run_result(scenario())
    assert second == "two" and (error.method, error.code, error.message) == ("one", -1, "no")
    assert notes == [{"jsonrpc": "2.0", "method": "receive", "params": {}}]


def test_styles_count_utf16_units_and_keep_links():
    text, styles = styled('😀 <b>bold</b> <a href="https://e.org">site</a> <code>x</code>')
    assert text == "😀 bold site (https://e.org) x"
    assert styles == ["3:4:BOLD", "29:1:MONOSPACE"]


def test_reactions_targets_and_addresses():
    assert reaction_answer("\u2705") and reaction_answer("\U0001F44D\U0001F3FF")
    assert reaction_answer("\u274C") is False and reaction_answer("\U0001F44E") is False
    assert reaction_answer("\u2764\ufe0f") is None
    assert target(OWNER.uuid) == {"recipient": [OWNER.uuid]}
    assert target(GROUP) == {"groupId": GROUP}
    assert parse_address("127.0.0.1:7583") == ("tcp", ("127.0.0.1", 7583))
    assert parse_address("[::1]:7583") == ("tcp", ("::1", 7583))
    assert parse_address("/run/signal.sock") == ("unix", "/run/signal.sock")
    with pytest.raises(ValueError):
        parse_address("localhost")


def test_settings_take_uuids_and_numbers_and_the_runner_needs_no_token(home):
    settings = SignalSettings(allow=[OWNER.uuid.upper(), "+15550000020"])
    assert settings.allow == [OWNER.uuid, "+15550000020"]
    with pytest.raises(ValidationError, match="approvers take Signal UUIDs"):
        SignalSettings(approvers=["+15550000020"])
    with pytest.raises(ValidationError, match="neither a Signal UUID"):
        SignalSettings(allow=["@someone"])
    assert "signal" in PLATFORMS and "signal" in BridgesSettings.model_fields
    config = load_config(home)
    config = config.model_copy(update={"bridges": BridgesSettings(
        signal=SignalSettings(enabled=True, address="127.0.0.1:9"))})
    bridges, problems = build_bridges(config, build_kernel(config, backend=EchoBackend()))
    kernel = bridges[0].kernel if bridges else None
    assert problems == [] and [b.channel for b in bridges] == ["signal"]
    for built in bridges:
        built.inbox.close()
    asyncio.run(kernel.aclose())


def test_json_rpc_error_objects_become_the_contract_errors():
    platform = SignalPlatform(SignalSettings())
    unregistered = {"response": {"timestamp": 1, "results": [
        {"recipientAddress": {"uuid": None, "number": "+15550000999", "username": None},
         "type": "UNREGISTERED_FAILURE"}]}}
    error = platform._failure(RpcError("send", -1, "The user +15550000999 is not registered.",
                                       unregistered))
    assert isinstance(error, BridgeError) and "UNREGISTERED_FAILURE" in str(error)
    assert "+15550000999" not in str(error) and "<number>" in str(error)
    assert isinstance(platform._failure(RpcError("send", -5, "rate", rate_limited(7)["data"])),
                      RetryAfter)
    assert platform._failure(RpcError("send", -5, "rate")).seconds == 10
    assert isinstance(platform._failure(RpcError("send", -1, "Invalid style: X")),
                      FormattingRejected)
    assert "safety number" in str(platform._failure(RpcError("send", -4, "untrusted")))
    missing = platform._failure(RpcError("sendPollVote", -32601, "Method not implemented"))
    assert missing.fatal and "update signal-cli" in str(missing)


def test_notifications_that_are_not_a_person_writing_are_skipped():
    platform = SignalPlatform(SignalSettings())
    envelope = {"sourceUuid": OWNER.uuid, "sourceNumber": OWNER.number, "timestamp": 5,
                "serverReceivedTimestamp": 6, "dataMessage": {"timestamp": 5, "message": "hi"}}

    def note(result, wrapped=True):
        params = {"subscription": 0, "result": result} if wrapped else result
        return {"jsonrpc": "2.0", "method": "receive", "params": params}
    taken = platform._item(note({"envelope": envelope, "account": ACCOUNT}))
    assert (taken.chat_id, taken.sender_id, taken.text, taken.message_id) == \
        (OWNER.uuid, OWNER.uuid, "hi", f"{OWNER.uuid}:5")
    assert platform.account == ACCOUNT          # learned from the notification
    assert platform._item(note({"envelope": envelope}, wrapped=False)) is None
    for other in ({"typingMessage": {"action": "STARTED", "timestamp": 5}},
                  {"syncMessage": {"sentMessage": {"message": "mine"}}},
                  {"receiptMessage": {"when": 5, "isDelivery": True}}):
        bare = {k: v for k, v in envelope.items() if k != "dataMessage"}
        assert platform._item(note({"envelope": {**bare, **other}})) is None
    own = {**envelope, "sourceNumber": ACCOUNT}
    assert platform._item(note({"envelope": own})) is None
    later = platform._item(note({"envelope": {**envelope, "serverReceivedTimestamp": 1}}))
    assert later.position > taken.position        # positions only increase


def test_an_answer_quotes_a_message_named_by_its_author_and_time_only():
    from opencortex.bridges.signal import quoting
    uuid = "3f1c2a9e-5b7d-4e60-9a1b-0c2d3e4f5a61"
    assert quoting(f"{uuid}:1700000000123") == {"quoteTimestamp": 1700000000123,
                                                "quoteAuthor": uuid}
    assert quoting("+15550000010:5") == {"quoteTimestamp": 5, "quoteAuthor": "+15550000010"}
    for other in (None, "", "55", f"{uuid}:", f"{uuid}:12x", f"{uuid}:١٢", "someone:12",
                  f"{uuid}:{10 ** 30}", f"evil\n{uuid}:12"):
        assert quoting(other) == {}
