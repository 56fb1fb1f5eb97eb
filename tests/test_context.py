"""The working context: pressure, compression order and strategies, pins, hysteresis, settings."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opencortex.conversation.compression import (
    STRATEGIES, EmbeddingSimilarity, LexicalSimilarity, backend_summarizer, extract_summary,
    extractive_summarizer, fit_tokens, turn_span)
from opencortex.conversation.context import WorkingContext
from opencortex.conversation.entries import Entry, count_tokens, default_retention
from opencortex.conversation.settings import ConversationSettings
from opencortex.conversation.similarity import content_words, similarity_from_name
from opencortex.events import Thread
from opencortex.llm.base import Backend, LLMError, Usage
from opencortex.memory import Archive, NewMessage


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


FACTS = [
    "We decided to use PostgreSQL 16 for the billing service; the deadline is March 3.",
    "Alice will write the migration script migrate_db.py by Friday.",
    "The API rate limit is 120 requests per minute, so we must retry with exponential backoff.",
    "Bob prefers Rust for the parser, but we chose Python because the team knows it.",
    "Store invoices as JSON in the invoices table, keyed by customer_id and month.",
    "Remember that the staging server is staging.example.org on port 8443.",
]


def message(i: int, text: str, role: str = "user", *, turn: int | None = None,
            retention: str | None = None, turn_type: str = "speech") -> Entry:
    return Entry(id=f"m{i}", role=role, text=text, turn=turn if turn is not None else i,
                 turn_type=turn_type,
                 retention=retention or default_retention(role, text, turn_type))


def persona(text: str = "You are a careful assistant. Answer briefly.") -> Entry:
    return Entry(id="persona", role="system", text=text, turn=0, retention="PRESERVED",
                 kind="persona")


def dialogue(turns: int, start: int = 1) -> list[Entry]:
    """TURNS turns of user fact + assistant acknowledgement (REQUIRED both)."""
    entries = []
    for turn in range(start, start + turns):
        fact = FACTS[turn % len(FACTS)]
        entries.append(Entry(f"u{turn}", "user", f"Turn {turn}: {fact}", turn))
        entries.append(Entry(f"a{turn}", "assistant", f"Noted for turn {turn}: {fact}", turn))
    return entries


async def filled(strategy: str, turns: int, budget: int = 400, **options) -> WorkingContext:
    """A context with a persona and TURNS turns added one entry at a time; `.reports` lists
    the compressions that happened on the way."""
    context = WorkingContext(budget=budget, strategy=strategy, **options)
    context.reports = []
    await context.add(persona())
    for entry in dialogue(turns):
        report = await context.add(entry)
        if report is not None:
            context.reports.append(report)
    return context


# ---------------------------------------------------------------- basics

def test_a_new_context_is_empty_and_fills_token_counts():
    context = WorkingContext(budget=100)
    assert context.state == "empty" and context.used == 0 and context.pressure == 0
    assert run(context.add(Entry("m1", "user", "x" * 40, 1))) is None
    assert context.used == count_tokens("x" * 40) == 10
    assert context.pressure == pytest.approx(0.1)
    assert context.state == "accumulating"
    with pytest.raises(ValueError, match="already in the context"):
        run(context.add(Entry("m1", "user", "again", 1)))


@pytest.mark.parametrize("options, message_part", [
    ({"budget": 0}, "positive"), ({"threshold": 1.5}, "threshold"),
    ({"target": 0.8, "threshold": 0.8}, "below the threshold"), ({"tolerance": 2}, "tolerance"),
    ({"strategy": "zip"}, "forget, galois, sliding, summarize"),
])
def test_bad_options_are_refused_with_the_reason(options, message_part):
    with pytest.raises(ValueError, match=message_part):
        WorkingContext(**options)


def test_set_strategy_lists_the_names():
    context = WorkingContext()
    for name in STRATEGIES:
        context.set_strategy(name)
        assert context.strategy == name
    with pytest.raises(ValueError, match="unknown strategy 'lossy'; choose one of: forget, galois, "
                                         "sliding, summarize"):
        context.set_strategy("lossy")


def test_view_shows_classes_and_a_short_preview():
    context = WorkingContext()
    run(context.add(persona(), message(1, "word " * 40), message(2, "thanks!", "assistant")))
    rows = context.view()
    assert [row["id"] for row in rows] == ["persona", "m1", "m2"]
    assert rows[0]["kind"] == "persona" and rows[0]["retention"] == "PRESERVED"
    assert rows[2]["retention"] == "DROPPABLE"
    assert len(rows[1]["text"]) == 80 and rows[1]["text"].endswith("…")
    assert set(rows[1]) == {"id", "turn", "role", "retention", "kind", "tokens", "text"}


# ---------------------------------------------------------------- compression order

def test_droppable_entries_go_first_oldest_first():
    context = WorkingContext(budget=100)
    entries = [message(1, "Use port 8443 for the staging server, not 8080 as before."),
               message(2, "ok", "assistant"), message(3, "thanks!"),
               message(4, "lol", "assistant"),
               message(5, "The production database lives on db1 in the Frankfurt region."),
               message(6, "Please write the config file for db1 with port 5432.")]
    run(context.add(*entries))
    context.target = 0.4  # compress to 40 tokens: dropping the chit-chat (and one fact) is enough
    report = run(context.compress())
    assert report.dropped[:3] == ("m2", "m3", "m4")
    assert "Dropped 3 small-talk messages" in report.notes
    assert context.used <= 40
    assert "m6" in context  # the newest turn stays


def test_only_as_much_is_dropped_as_needed():
    context = WorkingContext(budget=100, threshold=0.9, target=0.5)
    run(context.add(Entry("m1", "user", "hi", 1, retention="DROPPABLE", tokens=10),
                    Entry("m2", "assistant", "hello", 1, retention="DROPPABLE", tokens=5),
                    Entry("m3", "user", "A fact: port 8443.", 2, tokens=20),
                    Entry("m4", "assistant", "Deadline June 5.", 2, tokens=20),
                    Entry("m5", "user", "The port again?", 3, tokens=4)))
    assert context.used == 59
    report = run(context.compress())
    assert report.dropped == ("m1",) and report.summarized == ()
    assert [e.id for e in context.entries] == ["m2", "m3", "m4", "m5"]
    assert report.notes.startswith("Dropped 1 small-talk message (59 → 49 tokens")


def test_the_newest_turn_is_never_folded():
    big = "The deployment checklist item number {0} must be done before release. " * 3
    for strategy in STRATEGIES:
        context = WorkingContext(budget=200, strategy=strategy)
        run(context.add(*dialogue(3)))
        newest = [message(100, big.format(1), turn=4),
                  message(101, big.format(2), "assistant", turn=4),
                  message(102, "ok", "assistant", turn=4)]
        run(context.add(*newest))
        run(context.compress())
        for entry in newest:
            assert entry in context.entries, strategy


def test_preserved_alone_above_target_is_said_in_the_notes():
    context = WorkingContext(budget=100)
    huge = Entry("rules", "system", "Never delete data. " * 40, 0, retention="PRESERVED",
                 kind="system")
    report = run(context.add(huge, message(1, "Fact: the build uses make -j8 on the CI host."),
                             message(2, "What flags does the build use?", turn=2)))
    assert report is not None
    assert "still above the target" in report.notes
    assert "rules" in context and context.state == "pressured"
    assert "m1" not in context


# ---------------------------------------------------------------- strategies

def test_sliding_drops_whole_turns():
    context = run(filled("sliding", 12))
    report = context.last_report
    assert report is not None and report.strategy == "sliding" and report.summarized == ()
    remaining_turns = {e.turn for e in context.entries if e.kind == "message"}
    for turn in remaining_turns:  # a turn is either gone or whole
        assert {f"u{turn}", f"a{turn}"} <= {e.id for e in context.entries}
    assert report.notes.startswith("Dropped turns ")
    assert report.loss is not None and report.measure == "lexical"


def test_forget_cuts_everything_older_than_the_first_misfit():
    context = WorkingContext(budget=100, strategy="forget")
    small = Entry("small", "user", "Port 22.", 1)
    large = Entry("large", "assistant", "Long explanation of the SSH setup and keys. " * 4, 1)
    recent = Entry("recent", "assistant", "A recent answer about deploy keys on host b7.", 2)
    question = Entry("question", "user", "And the port again for the bastion host?", 3)
    run(context.add(small, large, recent, question))
    context.target = 0.35
    report = run(context.compress())
    ids = [e.id for e in context.entries]
    assert ids == ["recent", "question"]
    assert "small" in report.dropped  # it would fit, but it is older than the cut
    assert report.notes.startswith("Forgot turn")


def test_summarize_folds_the_oldest_into_one_summary():
    calls = []

    async def summarizer(entries, max_tokens):
        calls.append(([e.id for e in entries], max_tokens))
        return "Facts: PostgreSQL 16, port 8443, Alice writes migrate_db.py."

    context = run(filled("summarize", 12, summarizer=summarizer))
    summaries = [e for e in context.entries if e.kind == "summary"]
    assert len(summaries) == 1
    summary = summaries[0]
    assert summary.role == "system" and summary.retention == "REQUIRED"
    assert summary.id.startswith("summary:")
    assert "PostgreSQL 16" in summary.text and summary.text.startswith("[Summary of turn")
    assert calls and all(max_tokens > 0 for _, max_tokens in calls)
    assert context.entries[0].kind == "persona" and context.entries[1] is summary
    # every folded message is named in covers, even across summaries of summaries
    present = {e.id for e in context.entries}
    for entry in dialogue(12):
        assert entry.id in present or entry.id in summary.covers
    report = context.last_report
    assert report.summarized and "summarised" in report.notes.lower()


def test_a_long_summary_is_cut_to_its_allowance():
    async def verbose(entries, max_tokens):
        return "blah " * 10_000

    context = run(filled("summarize", 12, summarizer=verbose))
    summary = next(e for e in context.entries if e.kind == "summary")
    assert summary.tokens == count_tokens(summary.text)
    assert context.reports and all(r.after_tokens <= context.target_tokens for r in context.reports)


class LengthLoss:
    """A stand-in measure: the loss is how much shorter the compressed text is."""

    name = "length"

    def __init__(self):
        self.calls = 0

    def distance(self, a: str, b: str) -> float:
        self.calls += 1
        return max(0.0, min(1.0, 1 - len(b) / len(a))) if a else 0.0


class WordCountLoss:
    """A stand-in measure: the compression is faithful once the summary has enough "fact"s."""

    name = "facts"

    def __init__(self, enough: int):
        self.enough = enough

    def distance(self, a: str, b: str) -> float:
        return 0.1 if b.count("fact") >= self.enough else 0.9


def test_galois_steps_to_gentler_folds_until_the_loss_is_tolerable():
    allowances = []

    async def summarizer(entries, max_tokens):
        allowances.append((entries[0].id, max_tokens))
        return "fact " * max_tokens

    context = run(filled("galois", 12, budget=400, summarizer=summarizer,
                         similarity=WordCountLoss(enough=30), tolerance=0.25))
    report = context.reports[0]
    assert report.strategy == "galois" and report.measure == "facts" and report.loss == 0.1
    assert report.notes.startswith("Summarised turns 1-") and "gentler step" in report.notes
    assert "facts loss 0.10" in report.notes
    first = [tokens for first_id, tokens in allowances if first_id == "u1"]  # 1st compression
    assert len(first) >= 2 and first == sorted(first) and first[0] < 30 <= first[-1]
    assert all(r.after_tokens <= context.target_tokens for r in context.reports)


def test_galois_reports_when_no_fold_meets_the_tolerance():
    context = run(filled("galois", 12, similarity=LengthLoss(), tolerance=0.0))
    report = context.reports[0]
    assert report.loss is not None and report.loss > 0
    assert "above the 0 tolerance" in report.notes
    assert all(r.after_tokens <= context.target_tokens for r in context.reports)


def test_galois_with_the_default_lexical_measure_reports_it():
    context = run(filled("galois", 12))
    report = context.reports[0]
    assert report.measure == "lexical" and 0 <= report.loss <= 1
    assert f"lexical loss {report.loss:.2f}" in report.notes


class ThreadNoting:
    """The lexical measure, noting the thread of each call."""

    name = "lexical"

    def __init__(self):
        self.threads: list[str] = []
        self.measure = similarity_from_name("lexical")

    def distance(self, a: str, b: str) -> float:
        self.threads.append(threading.current_thread().name)
        return self.measure.distance(a, b)


@pytest.mark.parametrize("strategy", ["sliding", "summarize", "galois"])
def test_measuring_the_loss_and_the_offline_summary_never_run_on_the_loop(strategy,
                                                                          monkeypatch):
    """A measure of loss costs time with the whole context, and the offline summary with
    what it folds: a fork of a long thread held every conversation 27-67 ms on the loop."""
    import opencortex.conversation.summaries as summaries
    summarized: list[str] = []
    real = summaries.extract_summary

    def noting(entries, max_tokens):
        summarized.append(threading.current_thread().name)
        return real(entries, max_tokens)
    monkeypatch.setattr(summaries, "extract_summary", noting)
    measure = ThreadNoting()
    context = run(filled(strategy, 12, similarity=measure))
    assert context.reports and measure.threads
    loop = threading.main_thread().name
    assert loop not in measure.threads and loop not in summarized
    assert bool(summarized) == (strategy != "sliding")


def test_the_notes_say_what_was_folded_in_one_sentence():
    context = WorkingContext(budget=200, strategy="summarize")
    run(context.add(persona(), message(1, "hi"), message(2, "hello!", "assistant", turn=1)))
    reports = [run(context.add(entry)) for entry in dialogue(6, start=2)]
    notes = next(r for r in reports if r is not None).notes
    assert notes.startswith("Dropped 2 small-talk messages, summarised turns 2-")
    assert "→" in notes and notes.endswith(".") and ". " not in notes


# ---------------------------------------------------------------- pins

def test_pin_and_unpin():
    context = WorkingContext(budget=200)
    run(context.add(persona(), message(1, "thanks!"), *dialogue(2, start=2)))
    assert context.pin("m1") and context.entries[1].retention == "PRESERVED"
    assert not context.pin("nope")
    assert context.unpin("m1") and context.entries[1].retention == "DROPPABLE"
    assert not context.unpin("m1")          # not pinned any more
    assert not context.unpin("persona")     # preserved by its kind
    assert context.pin("u2") and context.unpin("u2")
    assert context.entries[2].retention == "REQUIRED"


def test_a_pinned_entry_survives_every_strategy():
    for strategy in STRATEGIES:
        context = WorkingContext(budget=300, strategy=strategy)
        run(context.add(*dialogue(2)))
        assert context.pin("u1")
        pinned = context.entries[0]
        for entry in dialogue(20, start=3):
            run(context.add(entry))
        assert context.compressions > 0
        assert context.entries[0] == pinned, strategy
        assert "u1" in context and "a1" not in context


# ---------------------------------------------------------------- hysteresis

def test_many_small_adds_do_not_thrash():
    for strategy in STRATEGIES:
        context = WorkingContext(budget=1000, strategy=strategy)
        run(context.add(persona()))
        added = 0
        reports = 0
        for i in range(600):
            entry = Entry(f"m{i}", "user" if i % 2 == 0 else "assistant",
                          f"Step {i}: configure node{i % 7} with value {i * 3}.", i // 2 + 1)
            added += entry.tokens
            report = run(context.add(entry))
            if report is not None:
                reports += 1
                assert context.pressure <= context.target, strategy
        band = int(context.threshold * context.budget) - context.target_tokens
        assert 0 < reports <= added // band + 1, strategy


def test_after_a_compression_none_until_the_threshold_is_passed_again():
    context = WorkingContext(budget=100)
    run(context.add(*dialogue(6)))
    assert context.compressions >= 1
    count = context.compressions
    while context.pressure + 0.05 <= context.threshold:
        assert run(context.add(Entry(f"x{context.used}", "user", "abcd efgh ijk", 9))) is None
    assert context.compressions == count


def test_stuck_above_the_threshold_it_waits_for_a_band_of_new_tokens():
    context = WorkingContext(budget=100)
    run(context.add(Entry("rules", "system", "Be exact. " * 40, 0, retention="PRESERVED",
                          kind="system")))
    compressions = 0
    for i in range(60):
        if run(context.add(Entry(f"m{i}", "user", "tiny", 1))) is not None:
            compressions += 1
    band = int(context.threshold * context.budget) - context.target_tokens
    assert compressions <= 60 * count_tokens("tiny") // band + 1


# ---------------------------------------------------------------- the law, for any sequence

TEXTS = st.sampled_from([*FACTS, "ok", "thanks!", "lol", "hi", "🙂", "yes",
                         "The answer is 42 and the key is k_7.",
                         "Long " * 30 + "paragraph about the schema migration."])
operations = st.lists(st.one_of(
    st.tuples(st.just("add"), TEXTS, st.sampled_from(["user", "assistant"]),
              st.sampled_from(["speech", "thought"]), st.booleans()),
    st.tuples(st.just("pin"), st.integers(0, 60)),
    st.tuples(st.just("unpin"), st.integers(0, 60)),
    st.tuples(st.just("compress"),),
), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(STRATEGIES), ops=operations, budget=st.integers(60, 600))
def test_preserved_entries_survive_and_compressions_reach_the_target(strategy, ops, budget):
    context = WorkingContext(budget=budget, strategy=strategy)
    run(context.add(persona()))
    turn, count = 0, 0
    for op in ops:
        preserved = [e for e in context.entries if e.retention == "PRESERVED"]
        report = None
        if op[0] == "add":
            _, text, role, turn_type, pinned = op
            turn += role == "user"
            entry = message(count, text, role, turn=max(turn, 1), turn_type=turn_type,
                            retention="PRESERVED" if pinned else None)
            count += 1
            report = run(context.add(entry))
        elif op[0] == "pin":
            context.pin(f"m{op[1]}")
        elif op[0] == "unpin":
            context.unpin(f"m{op[1]}")
        else:
            report = run(context.compress())
        for entry in preserved:
            if op[0] != "unpin" or entry.id != f"m{op[1]}":
                assert entry in context.entries  # unchanged, same text and tokens
        assert context.used == sum(e.tokens for e in context.entries)
        assert len({e.id for e in context.entries}) == len(context.entries)
        if report is not None and context.used > context.target_tokens:
            assert "still above the target" in report.notes
            # only what no compression may touch is left: PRESERVED entries and the newest turn
            users = [i for i, e in enumerate(context.entries)
                     if e.role == "user" and e.kind == "message"]
            newest = users[-1] if users else len(context.entries) - 1
            assert all(e.retention == "PRESERVED" or i >= newest
                       for i, e in enumerate(context.entries))
        if report is not None:
            assert report.after_tokens == context.used
            assert set(report.dropped).isdisjoint(e.id for e in context.entries)
            assert set(report.summarized).isdisjoint(e.id for e in context.entries)


# ---------------------------------------------------------------- against the archive

def test_compression_never_touches_the_archive(tmp_path):
    thread = Thread("cli", "local")
    with Archive(tmp_path / "memory") as archive:
        for turn in range(1, 16):
            fact = FACTS[turn % len(FACTS)]
            archive.append([NewMessage(role="user", text=f"{turn}: {fact}", thread=thread),
                            NewMessage(role="assistant", text="ok", thread=thread)])
        path = archive.thread_file(thread)
        on_disk = path.read_bytes()
        records = archive.read_thread(thread)
    context = WorkingContext(budget=300, strategy="summarize")
    run(context.add(persona()))
    for number, record in enumerate(records):
        run(context.add(Entry(record.id, record.role, record.text, number // 2 + 1,
                              record.turn_type,
                              default_retention(record.role, record.text, record.turn_type))))
    assert context.compressions > 0
    assert path.read_bytes() == on_disk
    archived = {record.id for record in records}
    report = context.last_report
    assert set(report.dropped) | set(report.summarized) <= archived | {
        e.id for e in context.entries} | {i for i in report.summarized if i.startswith("summary:")}
    with Archive(tmp_path / "memory") as archive:  # everything folded is still there
        assert {r.id for r in archive.read_thread(thread)} == archived


# ---------------------------------------------------------------- measures and summaries

texts = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Zs")),
                max_size=200)


@settings(max_examples=200, deadline=None)
@given(a=texts, b=texts)
def test_lexical_distance_is_a_symmetric_measure_in_0_1(a, b):
    measure = LexicalSimilarity()
    d = measure.distance(a, b)
    assert 0 <= d <= 1
    assert d == measure.distance(b, a)
    assert measure.distance(a, a) == pytest.approx(0, abs=1e-9)


def test_lexical_distance_examples():
    measure = LexicalSimilarity()
    assert measure.name == "lexical"
    assert measure.distance("postgres billing", "kittens yarn") == 1
    assert measure.distance("", "") == 0 and measure.distance("the of", "") == 0
    close = measure.distance(FACTS[0], FACTS[0] + " Also backups nightly.")
    far = measure.distance(FACTS[0], FACTS[3])
    assert close < far
    assert "8443" in content_words(FACTS[5]) and "the" not in content_words(FACTS[5])


@settings(max_examples=150, deadline=None)
@given(bodies=st.lists(st.text(max_size=300), min_size=1, max_size=8), limit=st.integers(0, 80))
def test_extractive_summaries_fit_their_allowance(bodies, limit):
    entries = [Entry(f"m{i}", "user", body, i + 1) for i, body in enumerate(bodies)]
    assert count_tokens(run(extractive_summarizer(entries, limit))) <= limit


def test_extractive_summaries_keep_the_informative_sentences():
    entries = [Entry("m1", "user", "Hello there! How are you today? We decided the release is on "
                     "May 14 with version 2.3.1.", 1),
               Entry("m2", "assistant", "Great. I am fine. The config lives in /etc/app/app.toml "
                     "and uses port 9090.", 1),
               Entry("m3", "user", "Nice weather. Nice weather indeed. Lovely.", 2)]
    summary = extract_summary(entries, 40)
    assert "May 14" in summary and "9090" in summary
    assert "weather" not in summary
    assert summary.startswith("user (turn 1):")


def test_fit_tokens_and_turn_spans():
    assert fit_tokens("short", 10) == "short"
    cut = fit_tokens("a" * 100, 5)
    assert count_tokens(cut) <= 5 and cut.endswith("…")
    assert fit_tokens("abc", 0) == ""
    entries = [Entry(f"m{t}", "user", "x", t) for t in (2, 3, 4, 7, 9, 10)]
    assert turn_span(entries) == "2-4, 7, 9-10"


def test_embedding_similarity_is_lazy_and_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    measure = similarity_from_name("embedding:all-MiniLM-L6-v2")
    assert isinstance(measure, EmbeddingSimilarity)
    assert measure.name == "embedding:all-MiniLM-L6-v2"
    assert measure.distance("", "") == 0
    with pytest.raises(RuntimeError, match="pip install sentence-transformers"):
        measure.distance("a b", "c d")
    with pytest.raises(ValueError, match="lexical"):
        similarity_from_name("cosine")


def test_embedding_similarity_uses_the_model_when_present(monkeypatch):
    class FakeModel:
        def __init__(self, name):
            self.name = name

        def encode(self, texts):
            return [[1.0, 0.0] if "cat" in t else [0.0, 1.0] for t in texts]

    fake = type(sys)("sentence_transformers")
    fake.SentenceTransformer = FakeModel
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    measure = EmbeddingSimilarity("tiny")
    assert measure.distance("a cat", "cat food") == pytest.approx(0)
    assert measure.distance("a cat", "dog") == pytest.approx(1)


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, chunks=None, error=None):
        self.chunks, self.error, self.requests = chunks or [], error, []

    async def stream(self, request):
        self.requests.append(request)
        if self.error:
            raise self.error
        for chunk in self.chunks:
            yield chunk
        yield Usage()


def test_backend_summarizer_asks_the_model_and_falls_back_offline():
    entries = dialogue(2)
    backend = FakeBackend(["Summary: ", "Postgres 16, Alice."])
    text = run(backend_summarizer(backend)(entries, 50))
    assert text == "Summary: Postgres 16, Alice."
    assert "Turn 1" in backend.requests[0].messages[0].content
    failing = FakeBackend(error=LLMError("LLM_UNAVAILABLE", "down"))
    assert run(backend_summarizer(failing)(entries, 50)) == extract_summary(entries, 50)
    assert run(backend_summarizer(FakeBackend(["x" * 1000]))(entries, 10)).endswith("…")


class EndlessBackend(Backend):
    """Streams text for ever (a server that ignores max_tokens), each chunk after PAUSE s."""
    name = "endless"

    def __init__(self, pause: float = 0.0):
        self.pause, self.sent, self.closed = pause, 0, False

    async def stream(self, request):
        try:
            while True:
                await asyncio.sleep(self.pause)
                self.sent += 1
                yield "word " * 20
        finally:
            self.closed = True


def test_a_summary_stops_reading_a_reply_that_never_ends():
    """Before, the summary (and the turn compressing) waited for ever and held every chunk."""
    endless = EndlessBackend()
    text = run(asyncio.wait_for(backend_summarizer(endless)(dialogue(2), 50), 30))
    assert text.startswith("word word") and count_tokens(text) <= 50
    assert endless.closed and endless.sent * 100 <= 50 * 8 + 100


def test_a_summary_that_takes_too_long_is_made_offline():
    entries = dialogue(2)
    slow = EndlessBackend(pause=0.05)
    text = run(asyncio.wait_for(backend_summarizer(slow, timeout=0.2)(entries, 2000), 30))
    assert text == extract_summary(entries, 2000) and slow.closed


# ---------------------------------------------------------------- settings

def test_settings_defaults_and_validation():
    conversation = ConversationSettings()
    assert (conversation.budget, conversation.threshold, conversation.target) == (8000, 0.8, 0.6)
    assert conversation.strategy == "sliding" and conversation.tolerance == 0.25
    assert conversation.recall_k == 5 and conversation.max_turns is None
    assert conversation.max_tokens is None and conversation.owners == {}
    assert conversation.recall_across_owners == [] and conversation.show_thoughts is False
    assert conversation.similarity == "lexical"
    with pytest.raises(ValidationError, match="extra"):
        ConversationSettings(budgett=1)
    with pytest.raises(ValidationError, match="below threshold"):
        ConversationSettings(target=0.9)
    with pytest.raises(ValidationError):
        ConversationSettings(strategy="lossy")
    with pytest.raises(ValidationError, match="embedding"):
        ConversationSettings(similarity="cosine")
    with pytest.raises(ValidationError, match="channel:chat-id"):
        ConversationSettings(owners={"alice": "alice"})
    owned = ConversationSettings(owners={"telegram:123": "alice"})
    assert owned.owners == {"telegram:123": "alice"}


def test_a_context_from_settings():
    conversation = ConversationSettings(budget=1234, strategy="galois", tolerance=0.5,
                                        threshold=0.9, target=0.5)
    context = WorkingContext.from_settings(conversation)
    assert (context.budget, context.strategy, context.tolerance) == (1234, "galois", 0.5)
    assert (context.threshold, context.target) == (0.9, 0.5)
    assert context.similarity.name == "lexical"


@settings(max_examples=30, deadline=None)
@given(strategy=st.sampled_from(sorted(STRATEGIES)), turns=st.integers(1, 40),
       budget=st.integers(120, 600), pins=st.sets(st.integers(1, 40), max_size=4))
def test_seen_ids_follow_adds_compressions_and_pins(strategy, turns, budget, pins):
    """`seen_ids` (what recall leaves out) and the summaries a checkpoint names are
    kept as the context changes, not rebuilt each turn: the ids always equal the
    entries' with those their summaries cover, and the summaries the entries' own."""
    def summaries(context: WorkingContext) -> tuple[str, ...]:
        return tuple(e.id for e in context.entries if e.kind == "summary")

    async def scenario():
        context = WorkingContext(budget=budget, strategy=strategy)
        for entry in dialogue(turns):
            await context.add(entry)
            if entry.turn in pins and entry.role == "user":
                context.pin(entry.id)
            expected = {e.id for e in context.entries} | {
                origin for e in context.entries for origin in e.covers}
            assert set(context.seen_ids()) == expected
            assert all(e.id in context for e in context.entries)
            assert context.mark().summaries == summaries(context)
        with pytest.raises(ValueError, match="already in the context"):
            await context.add(context.entries[-1])
        for summary in summaries(context):      # a summary kept is known by its record's id
            assert context.rename(summary, f"kept-{summary}")
            assert context.mark().summaries == summaries(context)
        await context.add(Entry("summary:late", "system", "[Summary] late", 0,
                                kind="summary"))
        assert context.mark().summaries == summaries(context)
        assert context.mark().summaries[-1] == "summary:late"
    run(scenario())


class _CountedEntries(list):
    """A context's entries that count how many of them were gone through."""

    read = 0

    def __iter__(self):
        for entry in super().__iter__():
            self.read += 1
            yield entry


def test_a_checkpoint_mark_does_not_go_through_every_entry():
    """Every turn marks its checkpoint: with a thousand messages in the context that
    cost a pass over all of them (the summaries among them), and grew with the
    context.  Now a mark reads the first message and what it keeps up to date."""
    context = WorkingContext(budget=10**7)
    run(context.add(persona(), *dialogue(500)))
    context.entries = _CountedEntries(context.entries)
    context.mark()                       # the entries list was replaced: known anew once
    context.entries.read = 0
    for _ in range(10):
        mark = context.mark()
    assert mark.oldest == "u1" and mark.summaries == ()
    assert context.entries.read <= 10 * 2
