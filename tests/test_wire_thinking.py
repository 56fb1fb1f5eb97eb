"""A reasoning model's thinking over the wire: ``thinking`` events (protocol 1.1),
coalesced apart from the reply's ``chunk`` events, fresh when the model thinks
anew, never part of the verified message nor the archive; the reference client
shows it on stderr, inert, and its stdout stays the replies alone.
"""

from __future__ import annotations

from test_wire import Client, chunked, cli_reply, of, reference_client, run, wire

THOUGHTS = ["The person ", "greets me.", "\nI greet back", " \x1b[2J now."]


def thinking(entry: dict, thoughts: list[str] = THOUGHTS) -> dict:
    return {**entry, "thinking": thoughts}


def test_thinking_comes_as_its_own_coalesced_events_before_the_words(home):
    async def scenario():
        async with wire(home, thinking(chunked(cli_reply("Hello back"), 4))) as w:
            client = await Client.open(w.url)
            events = await client.turn("hi", "c1")
            await client.close()
            return events, w.archive()

    events, archive = run(scenario)
    kinds = [e["event"] for e in events if e["event"] in ("thinking", "chunk")]
    assert kinds[0] == "thinking" and "thinking" not in kinds[kinds.index("chunk"):]
    thoughts = of(events, "thinking")
    assert "".join(t["text"] for t in thoughts) == "".join(THOUGHTS)
    assert len(thoughts) < len(THOUGHTS), "pieces of thinking must be coalesced"
    assert thoughts[0]["fresh"] and not any(t["fresh"] for t in thoughts[1:])
    assert all(t["attempt"] == 1 and t["correlation_id"] == "c1" for t in thoughts)
    assert of(events, "message")[0]["content"] == "Hello back"
    assert of(events, "done")[0]["total_chunks"] == len(of(events, "chunk"))
    assert "greets me" not in archive and "Hello back" in archive


def test_a_rejected_reply_thinks_anew_in_the_next_attempt(home):
    rejected = '(:type :REQUEST :target :cli :text "NOT THIS" :approved t)'

    async def scenario():
        async with wire(home, thinking({"text": rejected}, ["first"]),
                        thinking({"text": cli_reply("kept")}, ["second"])) as w:
            client = await Client.open(w.url)
            return await client.turn("hi", "c1")

    thoughts = of(run(scenario), "thinking")
    assert [(t["text"], t["attempt"], t["fresh"]) for t in thoughts] == [
        ("first", 1, True), ("second", 2, True)]


def test_the_reference_client_shows_thinking_on_stderr_inert(home):
    async def scenario():
        async with wire(home, thinking(chunked(cli_reply("Hello back"), 5))) as w:
            return await reference_client(w, b"hi\n")

    code, out, err = run(scenario)
    assert code == 0, err
    assert "Hello back" in out and "greets" not in out
    assert "The person greets me.\nI greet back ␛[2J now.\n" in err
    assert "\x1b" not in err
