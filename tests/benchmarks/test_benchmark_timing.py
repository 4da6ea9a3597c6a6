"""benchmarks/benchmark_timing.py, the benchmarks' one timing helper: it returns the call's result,
measures the call (not less, not more), and interleaves competitors round by round."""
import os
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchmark_timing import interleaved, median, timed_ms  # noqa: E402


def test_timed_ms_returns_the_result_and_covers_the_call():
    result, ms = timed_ms(lambda: (time.sleep(0.02), "done")[1], "cpu")
    assert result == "done"
    assert ms >= 20  # a lower bound only: no timing thresholds above


def test_interleaved_calls_round_by_round():
    calls = []
    times = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3)
    assert calls == ["a", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(ms >= 0 for v in times.values() for ms in v)
    with pytest.raises(ValueError, match="repeats"):
        interleaved({"a": lambda: None}, repeats=-1)


def test_median():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([]) is None
