"""Date expressions in a recall question: a time window to search in, or "the newest".

`date_hint(question, now)` finds one expression naming a period ("yesterday",
"last night", "last week", "this month", "in March", "March 2026", "the 3rd of
March", "2026-03-14", "a few days ago", "on Monday", "since 2024",
"recently", "in 2025") and gives back its window (start, end epoch
seconds, local time) with the question stripped of it, so that words like
"week" or "March" do not have to match the text of a message.  A month or
weekday word that reads as a name ("What did June say?", "Wednesday Addams")
is no date.  Words asking
for the present state ("now", "currently", "these days", "still") set
`recent`: newer matches should win over older ones (a fact that changed); so do
"recently" and "lately", besides their window (the last month), for a history
older than that (an imported chat: its newest, not none of it).
"When ..." questions need no window: every recalled memory shows its date.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"]
_MONTH = r"(?P<month>" + "|".join(m[:3] + r"(?:" + m[3:] + ")?" for m in MONTHS) + r"|sept)\.?"
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
# Words before a month that make it a date: without them (or a day or a year), a month
# word is more often a name ("What did Jan say", "Where does June live") or a verb.
_BEFORE_MONTH = ("in", "during", "on", "since", "for", "of", "until", "till", "by", "before",
                 "after", "early", "late", "mid", "last", "this")
_BEFORE_MAY = ("in", "during", "since", "early", "late", "mid", "last")   # "this may be"
# Capitalised words that may follow a weekday in a date ("Wednesday Morning", "Friday
# March 6", "Monday I left"); any other makes a weekday alone a name ("Wednesday Addams").
_AFTER_WEEKDAY = frozenset(["morning", "afternoon", "evening", "night", "noon", "midnight",
                            "lunch", "am", "pm", "i", "i'm", "i'd", "i'll", "i've", "sept"]
                           + MONTHS + [m[:3] for m in MONTHS] + WEEKDAYS)
_NEXT_WORD = re.compile(r"[^\S\n]+(?P<word>[^\W\d_][\w'’]*)")
_PATTERNS = [
    ("iso", re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b")),
    ("ago", re.compile(r"\b(?P<n>\d+|a\s+couple\s+of|(?:a\s+)?few|several|a|an|one|two|"
                       r"three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+"
                       r"(?P<unit>day|week|month|year)s?\s+ago\b", re.I)),
    ("relative", re.compile(r"\b(?P<which>last|this|past)\s+(?P<unit>week|month|year)\b", re.I)),
    ("day", re.compile(r"\b(?P<word>(?:the\s+)?day\s+before\s+yesterday|yesterday|today|"
                       r"tonight|this\s+(?:morning|afternoon|evening)|last\s+night)\b", re.I)),
    ("weekday", re.compile(r"\b(?:(?P<pre>last|on|this|past)\s+)?(?P<weekday>"
                           + "|".join(WEEKDAYS) + r")\b", re.I)),
    ("recently", re.compile(r"\b(?:recently|lately)\b", re.I)),
    ("month", re.compile(r"\b(?:(?P<pre>" + "|".join(_BEFORE_MONTH) + r")\s+)?"
                         r"(?:(?:the\s+)?(?P<d0>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?)?"
                         + _MONTH + r"(?:\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?)?"
                         r"(?:,?\s+(?:of\s+)?(?P<y>\d{4}))?\b", re.I)),
    ("year", re.compile(r"\b(?P<pre>in|during|since)\s+(?P<y>(?:19|20)\d\d)\b", re.I)),
]
_RECENT = re.compile(r"\b(?:now|currently|current|these days|nowadays|still|anymore|"
                     r"at the moment|latest|most recent)\b", re.I)
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
            "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
            "a couple of": 2, "few": 3, "a few": 3, "several": 3}


@dataclass(frozen=True)
class DateHint:
    """What a question says about time."""

    text: str                                  # the question without the date expression
    window: tuple[float, float] | None = None  # messages said in [start, end)
    label: str = ""                            # the expression found ("last week")
    recent: bool = False                       # asks for the present state: newer wins


def _epoch(day: date) -> float:
    return datetime(day.year, day.month, day.day).timestamp()


def _month_window(year: int, month: int) -> tuple[date, date]:
    first = date(year, month, 1)
    following = date(year + (month == 12), month % 12 + 1, 1)
    return first, following


def _window(kind: str, found: re.Match, today: date) -> tuple[date, date]:
    """The [first day, day after the last) the expression FOUND names, seen from TODAY:
    "last week" is the week before this one (Monday to Sunday), "last month" and "last
    year" the calendar month and year before; "past week" the seven days up to today;
    "N weeks ago" the days around then (half a unit either way), never today."""
    if kind == "iso":
        day = date(int(found["y"]), int(found["m"]), int(found["d"]))
        return day, day + timedelta(days=1)
    if kind == "ago":
        count = _NUMBERS.get(" ".join(found["n"].lower().split())) or int(found["n"])
        unit = _UNITS[found["unit"].lower()]
        middle = today - timedelta(days=count * unit)
        half = max(1, unit // 2)
        return middle - timedelta(days=half), min(middle + timedelta(days=half + 1), today)
    if kind == "relative":
        return _relative(found["which"].lower(), found["unit"].lower(), today)
    if kind == "day":
        word = " ".join(found["word"].lower().split())
        if word == "last night":                       # the evening before, and after 0:00
            return today - timedelta(days=1), today + timedelta(days=1)
        day = today - timedelta(days=2 if word.endswith("before yesterday") else
                                word == "yesterday")
        return day, day + timedelta(days=1)
    if kind == "weekday":                              # the last one before today
        back = (today.weekday() - WEEKDAYS.index(found["weekday"].lower())) % 7 or 7
        day = today - timedelta(days=back)
        return day, day + timedelta(days=1)
    if kind == "recently":
        return today - timedelta(days=30), today + timedelta(days=1)
    if kind == "year":
        first = date(int(found["y"]), 1, 1)
        return first, (today + timedelta(days=1) if _pre(found) == "since" else
                       date(first.year + 1, 1, 1))
    month = next(n for n, m in enumerate(MONTHS, 1) if m.startswith(found["month"][:3].lower()))
    year = int(found["y"]) if found["y"] else \
        today.year - (month > today.month or (month == today.month and _pre(found) == "last"))
    if found["d"] or found["d0"]:
        day = date(year, month, int(found["d"] or found["d0"]))
        first, end = day, day + timedelta(days=1)
    else:
        first, end = _month_window(year, month)
    return (first, today + timedelta(days=1)) if _pre(found) == "since" else (first, end)


def _relative(which: str, unit: str, today: date) -> tuple[date, date]:
    """The window of "last", "this" or "past" (WHICH) week, month or year (UNIT)."""
    tomorrow = today + timedelta(days=1)
    if which == "past":
        return tomorrow - timedelta(days=_UNITS[unit]), tomorrow
    if unit == "week":
        monday = today - timedelta(days=today.weekday())
        return (monday, tomorrow) if which == "this" else (monday - timedelta(days=7), monday)
    if unit == "month":
        first = today.replace(day=1)
        return (first, tomorrow) if which == "this" else \
            ((first - timedelta(days=1)).replace(day=1), first)
    first = date(today.year, 1, 1)
    return (first, tomorrow) if which == "this" else (date(today.year - 1, 1, 1), first)


def _pre(found: re.Match) -> str:
    """The word before the expression FOUND ("in", "since", ...; "" when none)."""
    return (found.groupdict().get("pre") or "").lower()


def _is_date(kind: str, found: re.Match) -> bool:
    """Whether FOUND names a date: a month word does with a day, a year or a word such
    as "in" before it ("may" only after "in", "since" and the like: mostly a verb); a
    weekday does unless, alone, a capitalised word other than a date word follows it
    (a name: "Wednesday Addams")."""
    if kind == "weekday":
        return bool(_pre(found)) or not _name_follows(found)
    if kind != "month" or found["d"] or found["d0"] or found["y"]:
        return True
    before = _BEFORE_MAY if found["month"].lower() == "may" else _BEFORE_MONTH
    return _pre(found) in before


def _name_follows(found: re.Match) -> bool:
    """Whether the word right after FOUND (spaces between only) is capitalised and no
    date word ("Addams" is, "Morning", "March" and "I" are not)."""
    after = _NEXT_WORD.match(found.string, found.end())
    if after is None:
        return False
    word = after["word"]
    return word[0].isupper() and word.casefold().replace("’", "'") not in _AFTER_WEEKDAY


def date_hint(question: str, now: float) -> DateHint:
    """The first date expression of QUESTION as a window (seen from NOW), if any.  One
    that names no day of the calendar (2026-02-31, or 4500 years ago) is none."""
    recent = bool(_RECENT.search(question))
    today = datetime.fromtimestamp(now).date()
    for kind, pattern in _PATTERNS:
        for found in pattern.finditer(question):
            if not _is_date(kind, found):
                continue
            try:
                first, end = _window(kind, found, today)
                window = (_epoch(first), _epoch(end))
            except (ValueError, OverflowError, OSError):
                continue
            text = (question[:found.start()] + " " + question[found.end():]).strip()
            return DateHint(text, window, found[0].strip(), recent or kind == "recently")
    return DateHint(question, None, "", recent)
