"""The ``reworded`` and ``in reply`` facts of the generated chat (see memory_eval_data.py).

They are inserted into the sessions `memory_eval_data.generate` built, drawn from
a random generator of their own: the other kinds' questions, messages, keys and
timestamps stay exactly what they were for the same seed.  Inserted messages sit
between two earlier ones, neither of them the answer to a question and the first
not a question (so no answer gets another message next to it, no question another
reply), timed between them, keyed after every earlier key.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from string import Formatter

from memory_eval_data import PEOPLE, SLOTS, STRANGERS, TEMPLATES, Dataset, Question, Turn

# pools of their own: a new pool in SLOTS would change every draw of the other kinds
MORE_SLOTS = {
    "car": ["Skoda Octavia", "Volvo estate", "Toyota Yaris", "Fiat Panda", "Mazda MX-5"],
    "field": ["marine biology", "medieval history", "civil engineering", "philosophy",
              "economics"],
    "vegetable": ["tomatoes", "courgettes", "runner beans", "pumpkins", "potatoes"],
}
# topic: (statement, question); no content word in common, not even by stem (`shared_stems`)
REWORDED = {
    "pet": ("{o}, we finally brought home a little {animal} from the breeder",
            "Which pet did {p} adopt?"),
    "job": ("{o}, I handed in my notice, starting at {company} on Monday",
            "Where did {p} get a new job?"),
    "home": ("The removal van came on Saturday {o}, our new address is in {city}",
             "Which city did {p} relocate to?"),
    "illness": ("{o}, stuck in bed with a fever and a horrible cough all week",
                "What illness did {p} catch?"),
    "car": ("{o}, I picked up a used {car} from the dealer, it drives like a dream",
            "What vehicle did {p} purchase?"),
    "instrument": ("{o}, my teacher says my scales on the {instrument} are getting smoother",
                   "Which instrument is {p} studying?"),
    "travel": ("Back from two weeks of temples and street food in {country}, {o}",
               "Where did {p} travel on holiday?"),
    "wedding": ("{o}, he proposed on the beach! We're tying the knot in {city}",
                "Where is {p} getting married?"),
    "baby": ("{o}, little {petname} arrived on Tuesday, seven pounds and perfectly healthy",
             "What did {p} call the baby?"),
    "study": ("{o}, I passed my final exams, officially a qualified {job}",
              "What degree did {p} complete?"),
    "garden": ("The {vegetable} on my allotment are finally ripe, {o}",
               "What vegetables is {p} growing?"),
}
# topic: (the other person asks, the person replies, question, the slot the reply answers)
IN_REPLY = {
    "pet": ("So what did you end up naming the {animal}, {p}?",
            "{petname}! After my grandmother's cat", "What is the name of {p}'s {animal}?",
            "petname"),
    "home": ("{p}, where did you two end up moving in the end?",
             "{city}! Signed the lease on Friday", "Where did {p} move to?", "city"),
    "job": ("Did you take the job offer in the end, {p}? Which one?",
            "{company}, yes. Start on Monday", "Which job offer did {p} take?", "company"),
    "car": ("Which car did you go for in the end, {p}?", "The {car}, in dark green",
            "Which car did {p} go for?", "car"),
    "study": ("{p}, what did you study at university again?", "{field}, believe it or not",
              "What did {p} study at university?", "field"),
    "travel": ("Where are you going for the honeymoon, {p}?", "{country}! Booked it last night",
               "Where is {p} going for the honeymoon?", "country"),
    "instrument": ("What are you learning to play these days, {p}?",
                   "The {instrument}, my neighbours hate me", "What is {p} learning to play?",
                   "instrument"),
}
# the other kinds' templates (memory_eval_data.TEMPLATES) a topic's question also asks about:
# a person they were planted for gets no new fact of that topic (two right answers)
TOPIC_OF_TEMPLATE = {"pet": "pet", "job": "job", "city": "home", "music": "instrument",
                     "trip": "travel"}
FUNCTION_WORDS = frozenset("""a an the and or but of to in on at for from with by as is are
was were be been am do does did done has have had i i'm i've we we're you your my our me he
she it its they them this that these those what which who where when how why so yes no
not all up out just very there their""".split())
NAMES = frozenset(name.lower() for pair in PEOPLE for name in pair) | \
    frozenset(name.lower() for name in STRANGERS)
SUFFIXES = ("ing", "ion", "ed", "es", "er", "ly", "s")


def stem(word: str) -> str:
    """WORD, lowercase, without one common suffix (crude: it only has to catch overlaps)."""
    word = word.lower()
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


def content_stems(text: str) -> set[str]:
    """The stems of TEXT's words, function words and people's names aside."""
    words = re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())     # "we're", "mother's"
    bases = {word.split("'")[0] for word in words if word not in FUNCTION_WORDS}
    return {stem(base) for base in bases - NAMES - FUNCTION_WORDS}


def shared_stems(statement: str, question: str) -> set[str]:
    """The content stems STATEMENT and QUESTION have in common."""
    return content_stems(statement) & content_stems(question)


def asked_about(question: str) -> re.Pattern[str]:
    """A pattern matching QUESTION (a template) filled in, the person in group "p"."""
    parts = [re.escape(text) + ("" if slot is None else "(?P<p>\\w+)" if slot == "p" else ".+")
             for text, slot, _, _ in Formatter().parse(question)]
    return re.compile("".join(parts) + r"\Z")


def topics_taken(questions: list[Question]) -> set[tuple[str, str]]:
    """(person, topic) of every question of the other kinds about a topic of the new ones."""
    patterns = {topic: asked_about(TEMPLATES[name][2])
                for name, topic in TOPIC_OF_TEMPLATE.items()}
    return {(match["p"], topic) for q in questions for topic, pattern in patterns.items()
            if (match := pattern.match(q.text))}


class _Inserter:
    """Chooses who says what where (one fact of a topic per person), and records the new
    messages in gaps between two messages of small talk (nothing of the others moves)."""

    def __init__(self, rng: random.Random, data: Dataset):
        self.rng, self.sessions = rng, data.sessions
        self.pairs = [PEOPLE[i % len(PEOPLE)] for i in range(len(data.sessions))]
        self.next_key = 1 + max(t.key for s in data.sessions for t in s)
        self.taken = topics_taken(data.questions)
        evidence = set().union(*(q.evidence for q in data.questions))
        # a gap (session, position) is before that turn (see the module notes)
        self.free = {(index, position) for index, session in enumerate(data.sessions)
                     for position in range(1, len(session))
                     if not {session[position - 1].key, session[position].key} & evidence
                     and not session[position - 1].text.rstrip().endswith("?")}
        self.inserted: dict[tuple[int, int], list[Turn]] = {}
        self.said: set[str] = set()         # no two new messages alike (see `evaluate`)

    def person_and_session(self, topic: str) -> tuple[str, int, str] | None:
        """Someone with no fact of TOPIC yet, one of their sessions with a free gap, and
        the other person in it; None when everyone has one."""
        people = [p for pair in PEOPLE for p in pair if (p, topic) not in self.taken]
        if not people:
            return None
        person = self.rng.choice(people)
        self.taken.add((person, topic))
        session = self.rng.choice([i for i, pair in enumerate(self.pairs) if person in pair
                                   and any(gap[0] == i for gap in self.free)])
        return person, session, next(p for p in self.pairs[session] if p != person)

    def insert(self, session: int, lines: list[tuple[str, str]]) -> list[int]:
        """Put LINES (sender, text) together in a free gap of SESSION; their keys."""
        gap = self.rng.choice(sorted(g for g in self.free if g[0] == session))
        self.free.discard(gap)
        before = self.sessions[session][gap[1] - 1].timestamp
        turns = [Turn(self.next_key + n, session, sender, text, before + 20 * (n + 1))
                 for n, (sender, text) in enumerate(lines)]
        self.next_key += len(turns)
        self.said.update(t.text for t in turns)
        self.inserted[gap] = turns
        return [t.key for t in turns]

    def sessions_with_insertions(self) -> list[list[Turn]]:
        """Every session, the inserted turns in their gaps."""
        result = []
        for index, session in enumerate(self.sessions):
            turns = []
            for position, turn in enumerate(session):
                turns.extend(self.inserted.get((index, position), []))
                turns.append(turn)
            result.append(turns)
        return result


def _values(rng: random.Random) -> dict[str, str]:
    return {slot: rng.choice(pool) for slot, pool in {**SLOTS, **MORE_SLOTS}.items()}


def reworded_fact(inserter: _Inserter, topic: str) -> Question | None:
    """A fact of TOPIC said in words its question does not use (None: no one left)."""
    statement, question = REWORDED[topic]
    chosen = inserter.person_and_session(topic)
    if chosen is None:
        return None
    person, session, other = chosen
    values = _values(inserter.rng)
    said = statement.format(**values, o=other)
    asked = question.format(**values, p=person)
    assert not shared_stems(said, asked), (said, asked, shared_stems(said, asked))
    (key,) = inserter.insert(session, [(person, said)])
    return Question("reworded", asked, {key})


def in_reply_fact(inserter: _Inserter, topic: str) -> Question | None:
    """A fact of TOPIC only in the reply to the other person's question (None: no one left).
    The reply names its answer (the pet's name), nothing else of the question."""
    asking, reply, question, answer = IN_REPLY[topic]
    chosen = inserter.person_and_session(topic)
    if chosen is None:
        return None
    person, session, other = chosen
    values = _values(inserter.rng)
    while reply.format(**values) in inserter.said:     # the same words would count alike
        values = _values(inserter.rng)
    asked_then, replied = asking.format(**values, p=person), reply.format(**values)
    asked = question.format(**values, p=person)
    assert values[answer] in replied and values[answer] not in asked_then + asked, replied
    _, key = inserter.insert(session, [(other, asked_then), (person, replied)])
    return Question("in reply", asked, {key})


def plant_hard_kinds(data: Dataset, seed: int, reworded: int, replies: int) -> Dataset:
    """DATA with up to REWORDED reworded facts and REPLIES in-reply exchanges inserted and
    asked about, each cycling through its topics, the two kinds in turn (fewer when
    everyone has a fact of a topic); drawn from a generator of their own: nothing of DATA
    changes."""
    inserter = _Inserter(random.Random(seed * 7 + 1), data)
    kinds = [(reworded_fact, list(REWORDED), reworded), (in_reply_fact, list(IN_REPLY), replies)]
    questions = [plant(inserter, topics[n % len(topics)]) for n in range(max(reworded, replies))
                 for plant, topics, count in kinds if n < count]
    return replace(data, sessions=inserter.sessions_with_insertions(),
                   questions=data.questions + [q for q in questions if q is not None])
