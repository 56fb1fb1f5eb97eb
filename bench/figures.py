"""Small helpers the benchmark scripts share: percentiles and timing a function's calls."""

from __future__ import annotations

import time
from typing import Callable


def percentile(values: list[float], share: float) -> float:
    """The value below which SHARE (0..1) of VALUES lie."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def timed(record: list[float], function: Callable) -> Callable:
    """FUNCTION, adding the seconds of each call to RECORD."""
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - started)
    return wrapper
