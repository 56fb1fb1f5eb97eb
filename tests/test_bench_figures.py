"""The benchmarks' shared helpers that are arithmetic, not measurement (bench/figures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from figures import STALL_GAP, cpu_steadiness, percentile, stalls_in  # noqa: E402


def test_slow_pieces_close_together_are_one_stall_and_the_worst_is_kept():
    steady = [(i * 0.004, 0.001) for i in range(100)]             # 1 ms pieces, 4 ms apart
    burst = [(1.0 + i * 0.004, 0.010) for i in range(5)]            # one 10x stall of 5 pieces
    later = [(2.0, 0.006)]                                          # a second, 6x
    figures = stalls_in(steady + burst + later, seconds=2.0)
    assert figures["stalls"] == 2
    assert figures["stalls/s"] == pytest.approx(1.0)
    assert figures["worst slowdown"] == pytest.approx(10.0)
    assert figures["piece ms"] == pytest.approx(1.0)


def test_slow_pieces_further_apart_than_the_gap_are_two_stalls():
    steady = [(i * 0.004, 0.001) for i in range(100)]
    apart = [(1.0, 0.005), (1.0 + 2 * STALL_GAP, 0.005)]
    assert stalls_in(steady + apart, seconds=1.0)["stalls"] == 2


def test_a_steady_machine_has_no_stalls_and_the_probe_returns_its_figures():
    assert stalls_in([(i * 0.004, 0.001) for i in range(50)], seconds=0.2)["stalls"] == 0
    measured = cpu_steadiness(0.05)         # the real probe, briefly: figures, not timing
    assert set(measured) == {"piece ms", "stalls", "stalls/s", "worst slowdown"}
    assert measured["piece ms"] > 0 and measured["worst slowdown"] >= 1


def test_percentile_takes_the_value_below_which_the_share_lies():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, .5) == 51.0
    assert percentile(values, .99) == 100.0
