"""Date expressions in a recall question: a time window to search in, or "the newest".

`date_hint(question, now)` finds one expression naming a period ("yesterday",
"last week", "this month", "in March", "March 2026", "2026-03-14", "3 days
ago", "recently", "in 2025") and gives back its window (start, end epoch
seconds, local time) with the question stripped of it, so that words like
"week" or "March" do not have to match the text of a message.  Words asking
for the present state ("now", "currently", "these days", "still") set
`recent`: newer matches should win over older ones (a fact that changed).
"When ..." questions need no window: every recalled memory shows its date.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"]
_MONTH = r"(?P<month>" + "|".join(m[:3] + r"(?:" + m[3:] + ")?" for m in MONTHS) + r")\.?"
_UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
_PATTERNS = [
    ("iso", re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b")),
    ("ago", re.compile(r"\b(?P<n>\d+|a|an|one|two|three|four|five|six)\s+"
                       r"(?P<unit>day|week|month|year)s?\s+ago\b", re.I)),
    ("relative", re.compile(r"\b(?P<which>last|this|past)\s+(?P<unit>week|month|year)\b", re.I)),
    ("day", re.compile(r"\b(?P<word>yesterday|today|tonight)\b", re.I)),
    ("recently", re.compile(r"\b(?:recently|lately)\b", re.I)),
    ("month", re.compile(r"\b(?:in\s+|during\s+|on\s+)?" + _MONTH +
                         r"(?:\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?)?(?:,?\s+(?P<y>\d{4}))?\b", re.I)),
    ("year", re.compile(r"\b(?:in|during)\s+(?P<y>(?:19|20)\d\d)\b", re.I)),
]
_RECENT = re.compile(r"\b(?:now|currently|current|these days|nowadays|still|anymore|"
                     r"at the moment|latest|most recent)\b", re.I)
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


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


def _window(kind: str, found: re.Match, today: date) -> tuple[date, date] | None:
    """The [first day, day after the last) the expression FOUND names, seen from TODAY."""
    if kind == "iso":
        day = date(int(found["y"]), int(found["m"]), int(found["d"]))
        return day, day + timedelta(days=1)
    if kind == "ago":
        count = _NUMBERS.get(found["n"].lower()) or int(found["n"])
        unit = _UNITS[found["unit"].lower()]
        middle = today - timedelta(days=count * unit)
        return middle - timedelta(days=unit), middle + timedelta(days=unit + 1)
    if kind == "relative":
        unit, which = found["unit"].lower(), found["which"].lower()
        if unit == "week":
            monday = today - timedelta(days=today.weekday())
            start = monday if which == "this" else monday - timedelta(days=7)
        elif unit == "month":
            start = today.replace(day=1)
            if which != "this":
                start = (start - timedelta(days=1)).replace(day=1)
        else:
            start = date(today.year - (which != "this"), 1, 1)
        return start, today + timedelta(days=1)
    if kind == "day":
        day = today - timedelta(days=found["word"].lower() == "yesterday")
        return day, day + timedelta(days=1)
    if kind == "recently":
        return today - timedelta(days=30), today + timedelta(days=1)
    if kind == "year":
        return date(int(found["y"]), 1, 1), date(int(found["y"]) + 1, 1, 1)
    month = next(n for n, m in enumerate(MONTHS, 1) if m.startswith(found["month"][:3].lower()))
    year = int(found["y"]) if found["y"] else today.year - (month > today.month)
    if found["d"]:
        day = date(year, month, int(found["d"]))
        return day, day + timedelta(days=1)
    return _month_window(year, month)


def date_hint(question: str, now: float) -> DateHint:
    """The first date expression of QUESTION as a window (seen from NOW), if any."""
    recent = bool(_RECENT.search(question))
    today = datetime.fromtimestamp(now).date()
    for kind, pattern in _PATTERNS:
        found = pattern.search(question)
        if found is None or (kind == "month" and found["month"].lower() == "may"
                             and not (found["d"] or found["y"] or found[0][:3].lower() == "in ")):
            continue                   # "may" alone is mostly the verb
        try:
            span = _window(kind, found, today)
        except ValueError:             # 2026-02-31 and the like: not a date
            continue
        if span is None:
            continue
        text = (question[:found.start()] + " " + question[found.end():]).strip()
        return DateHint(text, (_epoch(span[0]), _epoch(span[1])), found[0].strip(), recent)
    return DateHint(question, None, "", recent)
