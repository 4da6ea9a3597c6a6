"""Typed converters for command-line options: ``parser.add_argument("--x", type=number(0, 1))``.

argparse's own ``type=float`` takes "nan", "inf" and any value; these refuse a value outside
the option's interval with argparse's usual error, which names the option::

    demo.py: error: argument --confidence-threshold: must be a finite number in [0.0, 1.0], got nan

The rule is the config's (``detcore.config.choices.number_problem``): NaN and infinity are never
values, and the interval is closed unless it says otherwise.
"""
import argparse
from typing import Callable, Union

from detcore.config.choices import INF, Interval, number_problem

__all__ = ["number", "integer"]


def number(lo: float = -INF, hi: float = INF, *, lo_open: bool = False) -> Callable[[str], float]:
    """A converter to a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    bounds = Interval(lo, hi, lo_open)

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        problem = number_problem(value, bounds if (lo, hi) != (-INF, INF) else None)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = "number"
    return convert


def integer(lo: Union[int, float] = -INF, hi: Union[int, float] = INF) -> Callable[[str], int]:
    """A converter to a whole number in ``[lo, hi]``."""
    bounds = Interval(lo, hi)

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        problem = number_problem(value, bounds)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = "integer"
    return convert
