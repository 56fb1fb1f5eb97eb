"""A generated multi-session chat with planted facts, for bench_memory_eval.py.

Nothing here comes from a public dataset: the people, facts and wordings are
drawn from the small pools below with a seeded random generator, so the same
seed always gives the same archive and questions.

The owner's archive holds sessions between pairs of people whose names recur
in most messages (greetings, thanks, questions).  Facts are planted in kinds:

- ``single``: stated once; the question uses other words or other forms
  ("donated" / "donate", "hiking" / "hike");
- ``restated``: stated twice, in different sessions and words (either counts);
- ``changed``: stated, then replaced later; only the newest statement counts;
- ``when``: the question asks when it happened (the date shown is the answer);
- ``dated``: the same kind of event happens several times; the question names
  the period ("last week", "in March") and only the event in it counts;
- ``about``: someone else says it of the person the question names;
- ``swapped``: the question names the other person of the chat (a question
  that mixes people up still finds what was said);
- ``reworded``: stated in words the question does not use at all: no content
  word in common, not even by stem, but the person's name ("we finally brought
  home a little beagle from the breeder" / "Which pet did Caroline adopt?");
  lexical recall cannot find these by construction, a model's can (--embedder);
- ``in reply``: the other person asks and the answer is only in the reply,
  which alone does not say what it is about ("So what did you end up naming
  the beagle, Caroline?" / "Biscuit! After my grandmother's cat"); the reply
  is what counts: recall brings it beside the question when that is recalled.

The last two are inserted by memory_eval_kinds.py into the sessions built here,
drawn from a random generator of their own: the other kinds' questions and
messages are the same for a seed with or without them.

No two questions read the same: a template is about each person once at most,
and a period named by one "dated" question holds that one event only.

Many statements use an irregular verb the question puts in another form
("bought" / "buy", "met" / "meet", "broke" / "break", "ran" / "run").

Other owners' threads (much larger, other topics, other people) share the
index: they change whole-table word statistics but must never be recalled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime

DAY = 86400.0
PEOPLE = [("Caroline", "Melanie"), ("Dev", "Priya"), ("Jonas", "Aiko"), ("Rosa", "Tobias")]
STRANGERS = ["Ahmed", "Bea", "Chen", "Dora", "Emil", "Farah", "Gus", "Hana"]
SMALL_TALK = [
    "Hey {o}, how was your day?", "haha {o} that is hilarious", "{o}! long time no see",
    "Thanks {o}, talk soon", "Good morning {o}, did you sleep well?", "I'm so tired today {o}",
    "{o}, you would not believe the traffic this morning", "lol same here {o}",
    "Miss you {o}, we should catch up properly", "Sorry {o}, was busy with work all week",
    "That sounds lovely {o}", "ok {o} let me know how it goes", "What are you up to tonight {o}?",
    "{o} did you see the game yesterday?", "Honestly {o} I just need a holiday",
    "Weather is awful here {o}, rain all day", "You always make me laugh {o}",
]
NEAR_MISS = [
    "Have you ever been to {place}, {o}?", "The {org} near my house is closing, {o}",
    "I really love {animal}s {o}", "My cousin plays the {instrument}, {o}",
    "{o}, someone at work said {city} is expensive", "Is {company} hiring, {o}?",
]
SLOTS = {
    "thing": ["my old bikes", "a box of winter coats", "my grandmother's piano",
              "two hundred children's books", "our camping tent", "a crate of board games"],
    "org": ["animal shelter", "community library", "youth centre", "food bank", "church choir"],
    "place": ["Ben Nevis", "the Pico ridge", "Mount Olympus", "the Zugspitze", "Snowdon"],
    "animal": ["beagle", "parrot", "tabby cat", "tortoise", "ferret"],
    "petname": ["Biscuit", "Pepper", "Nimbus", "Waffles", "Juniper", "Mochi"],
    "job": ["nurse", "data analyst", "carpenter", "school teacher", "sous chef", "architect"],
    "company": ["Brightwell", "Nordlicht", "Castellan", "Quarry Labs", "Heron Health"],
    "city": ["Lisbon", "Porto", "Utrecht", "Glasgow", "Valencia", "Leipzig", "Bergen"],
    "instrument": ["cello", "banjo", "saxophone", "harp", "ukulele"],
    "race": ["Berlin", "Chicago", "Valencia", "Tokyo", "Boston"],
    "country": ["Japan", "Chile", "Iceland", "Kenya", "Canada", "Vietnam"],
    "cake": ["lemon drizzle cake", "carrot cake", "sourdough loaf", "apple pie",
             "chocolate brownies", "banana bread"],
    "book": ["The Overstory", "Piranesi", "Middlemarch", "Kindred", "Stoner"],
    "food": ["peanuts", "shellfish", "sesame", "kiwi fruit", "gluten"],
    "subject": ["lighthouse at dusk", "portrait of my dad", "field of sunflowers", "fox in snow"],
    "event": ["school fair", "charity auction", "library exhibition", "street festival"],
}
# name: (kind, statements (one per wording), question); "changed" lists old then new.
TEMPLATES = {
    "donate": ("single", ["Guess what {o}, I donated {thing} to the {org} yesterday"],
               "What did {p} donate to the {org}?"),
    "give": ("restated", ["{o}, I gave {thing} away to the {org} this morning",
                          "Dropping off {thing} at the {org} felt so good, {o}"],
             "What did {p} give to the {org}?"),
    "hike": ("single", ["{o} we went hiking up {place} on Sunday, my legs are dead"],
             "Where did {p} go on a hike?"),
    "pet": ("restated", ["We adopted a {animal}, {o}! We named her {petname}",
                         "{petname} chewed my shoes again {o}, typical {animal}"],
            "What is the name of {p}'s {animal}?"),
    "job": ("changed", ["{o}, I started working as a {job} at {company} this month",
                        "Big news {o}: I switched jobs, I'm working as a {job} at {company} now"],
            "Where does {p} work now?"),
    "city": ("changed", ["We finally moved into a flat in {city}, {o}",
                         "{o}, we relocated again, living in {city} since last month"],
             "Which city does {p} live in now?"),
    "music": ("restated", ["I've been learning to play the {instrument}, {o}",
                           "{o} my {instrument} lessons are going really well"],
              "What instrument is {p} learning?"),
    "race": ("when", ["I ran the {race} marathon {o}! Finished in under four hours"],
             "When did {p} run the {race} marathon?"),
    "trip": ("when", ["{o}, I flew to {country} for a conference, back on Friday"],
             "When did {p} travel to {country}?"),
    "book": ("single", ["Just finished reading {book}, {o}, you must read it"],
             "Which book did {p} finish?"),
    "allergy": ("single", ["Turns out I'm allergic to {food}, {o}, the doctor confirmed it"],
                "What is {p} allergic to?"),
    "paint": ("single", ["{o} I painted a {subject} for the {event}"],
              "What did {p} paint for the {event}?"),
    "bake": ("dated", ["{o}, I baked a {cake} for my neighbours"], "What did {p} bake {period}?"),
    "meet": ("single", ["Guess who I met at the {event}, {o}: my old teacher {petname}!"],
             "Who did {p} meet at the {event}?"),
    "buy": ("single", ["{o}, I finally bought a second-hand {instrument}"],
            "What did {p} buy?"),
    "break": ("about", ["Did you hear {p} broke an arm skiing in {country}?"],
              "What did {p} break?"),
    "sell": ("swapped", ["{o}, I sold {thing} at the flea market for almost nothing"],
             "What did {o} sell at the flea market?"),
}


@dataclass
class Turn:
    """One message of the generated archive."""

    key: int
    session: int
    sender: str
    text: str
    timestamp: float


@dataclass
class Question:
    """A question, its kind, and the keys of the turns that answer it."""

    kind: str
    text: str
    evidence: set[int] = field(default_factory=set)


@dataclass
class Dataset:
    sessions: list[list[Turn]]
    questions: list[Question]
    others: list[list[Turn]]          # other owners' threads


def _fill(template: str, values: dict[str, str]) -> str:
    return template.format(**values)


class _Builder:
    """Plants facts into sessions, then pads every session with small talk."""

    def __init__(self, rng: random.Random, sessions: int, per_session: int, now: float):
        self.rng, self.per_session, self.now = rng, per_session, now
        span = 300 * DAY
        self.times = [now - 2 * DAY - span + span * i / max(1, sessions - 1)
                      for i in range(sessions)]
        self.planted: list[list[tuple[str, str]]] = [[] for _ in range(sessions)]
        self.pairs = [PEOPLE[i % len(PEOPLE)] for i in range(sessions)]
        self.questions: list[Question] = []
        self.pending: list[tuple[Question, int, int]] = []   # question, session, plant index
        self.used: dict[str, set[str]] = {}                  # template -> people it was about

    def plant(self, session: int, speaker: str, text: str, question: Question) -> None:
        self.planted[session].append((speaker, text))
        self.pending.append((question, session, len(self.planted[session]) - 1))

    def sessions_of(self, person: str) -> list[int]:
        return [i for i, pair in enumerate(self.pairs) if person in pair]

    def person_for(self, name: str) -> str | None:
        """Someone template NAME was not about yet (None when it was about everyone): the
        same question asked of two facts ("What is Rosa allergic to?" of two
        allergies) would have two answers, and each would count for the other."""
        used = self.used.setdefault(name, set())
        left = [p for pair in PEOPLE for p in pair if p not in used]
        if not left:
            return None
        person = self.rng.choice(left)
        used.add(person)
        return person

    def fact(self, name: str) -> None:
        kind, statements, question = TEMPLATES[name]
        person = self.person_for(name)
        if person is None:
            return
        own = self.sessions_of(person)
        values = {slot: self.rng.choice(pool) for slot, pool in SLOTS.items()}
        partner = lambda s: next(p for p in self.pairs[s] if p != person)  # noqa: E731
        if kind == "dated":
            return self._dated(person, own, statements[0], question)
        if kind == "changed":
            first, second = sorted(self.rng.sample(own, 2))
            later = dict(values, **{k: self.rng.choice([v for v in SLOTS[k] if v != values[k]])
                                    for k in ("job", "company", "city")})
            q = Question(kind, _fill(question, {"p": person, **values}))
            self.plant(first, person, _fill(statements[0], {**values, "o": partner(first)}),
                       Question("ignored", ""))
            self.plant(second, person, _fill(statements[1], {**later, "o": partner(second)}), q)
        elif kind == "swapped":
            session = self.rng.choice(own)
            q = Question(kind, _fill(question, {"o": partner(session), **values}))
            self.plant(session, person, _fill(statements[0], {**values, "o": partner(session)}),
                       q)
        else:
            q = Question(kind, _fill(question, {"p": person, **values}))
            chosen = self.rng.sample(own, min(len(statements), len(own)))
            for session, statement in zip(chosen, statements):
                speaker = partner(session) if kind == "about" else person
                self.plant(session, speaker, _fill(statement, {
                    **values, "o": partner(session), "p": person}), q)
        self.questions.append(q)

    def _dated(self, person: str, own: list[int], statement: str, question: str) -> None:
        """The same event in three sessions; the question names one's period."""
        last = max(own)
        # this person's newest session: last week (its Thursday: "last week" is the week
        # before this one, Monday to Sunday, whatever day the benchmark runs)
        self.times[last] = self.now - (datetime.fromtimestamp(self.now).weekday() + 4) * DAY
        # the others each in a month of its own, not last week's (else a question naming
        # that month would have two answers)
        month = lambda s: f"{datetime.fromtimestamp(self.times[s]):%B %Y}"  # noqa: E731
        months: dict[str, list[int]] = {}
        for session in own:
            if month(session) != month(last):
                months.setdefault(month(session), []).append(session)
        picked = self.rng.sample(sorted(months), min(2, len(months)))
        picks = [last] + [self.rng.choice(months[label]) for label in picked]
        cakes = self.rng.sample(SLOTS["cake"], len(picks))
        for n, (session, cake) in enumerate(zip(picks, cakes)):
            when = datetime.fromtimestamp(self.times[session])
            period = "last week" if n == 0 else f"in {when:%B %Y}"
            q = Question("dated", _fill(question, {"p": person, "period": period}))
            partner = next(p for p in self.pairs[session] if p != person)
            self.plant(session, person, _fill(statement, {"cake": cake, "o": partner}), q)
            self.questions.append(q)

    def chatter(self, session: int, speaker: str, other: str) -> str:
        if self.rng.random() < 0.08:
            values = {slot: self.rng.choice(pool) for slot, pool in SLOTS.items()}
            return _fill(self.rng.choice(NEAR_MISS), {**values, "o": other})
        return _fill(self.rng.choice(SMALL_TALK), {"o": other})

    def build(self) -> list[list[Turn]]:
        sessions, key = [], 0
        for index, planted in enumerate(self.planted):
            pair = self.pairs[index]
            slots = sorted(self.rng.sample(range(self.per_session), len(planted)))
            lines, next_plant = [], iter(zip(slots, range(len(planted))))
            target = next(next_plant, None)
            for position in range(self.per_session):
                if target and target[0] == position:
                    speaker, text = planted[target[1]]
                    lines.append((speaker, text, target[1]))
                    target = next(next_plant, None)
                else:
                    speaker = pair[position % 2]
                    other = pair[1 - position % 2]
                    lines.append((speaker, self.chatter(index, speaker, other), None))
            turns = []
            for position, (speaker, text, plant) in enumerate(lines):
                turns.append(Turn(key, index, speaker, text, self.times[index] + 60 * position))
                if plant is not None:
                    for question, session, number in self.pending:
                        if session == index and number == plant:
                            question.evidence.add(key)
                key += 1
            sessions.append(turns)
        return sessions


def other_owners(rng: random.Random, threads: int, per_thread: int, now: float) -> list[list[Turn]]:
    """Other owners' chats: other people, other topics, heavy use of the owner's topic words."""
    topics = [SLOTS["org"], SLOTS["city"], SLOTS["cake"], SLOTS["job"]]
    result = []
    for t in range(threads):
        a, b = rng.sample(STRANGERS, 2)
        turns = []
        for i in range(per_thread):
            word = rng.choice(rng.choice(topics))
            text = rng.choice([f"{b}, the {word} thing again", f"did you hear about {word} {b}",
                               f"{word} {word} honestly", f"ok {b}, see you at the {word}"])
            turns.append(Turn(-1, t, a if i % 2 == 0 else b, text, now - 200 * DAY + i * 30))
        result.append(turns)
    return result


def generate(seed: int, sessions: int, per_session: int, facts: int, others: int,
             other_size: int, now: float) -> Dataset:
    """A seeded dataset: SESSIONS owner sessions of PER_SESSION turns with FACTS planted facts."""
    rng = random.Random(seed)
    builder = _Builder(rng, sessions, per_session, now)
    names = list(TEMPLATES)
    for n in range(facts):
        builder.fact(names[n % len(names)])
    built = builder.build()
    questions = [q for q in builder.questions if q.kind != "ignored" and q.evidence]
    texts = [q.text for q in questions]
    assert len(set(texts)) == len(texts), "a question would have two answers"
    return Dataset(built, questions, other_owners(rng, others, other_size, now))
