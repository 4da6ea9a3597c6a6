"""Command-line converters refuse NaN, infinity and values outside the option's interval, with
argparse's error naming the option (detcore.utils.argtypes)."""
import argparse
import re

import pytest

from detcore.utils.argtypes import integer, number


def parser():
    p = argparse.ArgumentParser(prog="tool", exit_on_error=True)
    p.add_argument("--threshold", type=number(0.0, 1.0), default=0.5)
    p.add_argument("--scale", type=number(0.0, lo_open=True))
    p.add_argument("--logit", type=number())
    p.add_argument("--count", type=integer(0))
    return p


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--threshold", "nan"], r"argument --threshold: must be a finite number in \[0.0, 1.0\], got nan"),
        (["--threshold", "inf"], r"argument --threshold: must be a finite number in \[0.0, 1.0\], got inf"),
        (["--threshold", "2"], r"argument --threshold: must lie in \[0.0, 1.0\], got 2.0"),
        (["--threshold", "-1"], r"argument --threshold: must lie in \[0.0, 1.0\], got -1.0"),
        (["--threshold", "high"], r"argument --threshold: must be a number, got 'high'"),
        (["--scale", "0"], r"argument --scale: must lie in \(0.0, inf\), got 0.0"),
        (["--logit=-inf"], r"argument --logit: must be a finite number, got -inf"),
        (["--count", "-5"], r"argument --count: must lie in \[0, inf\), got -5"),
        (["--count", "2.5"], r"argument --count: must be a whole number, got '2.5'"),
        (["--count", "9" * 30], r"argument --count: must be a 64-bit integer, got one of 30 digits"),
    ],
)
def test_bad_values_are_refused_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        parser().parse_args(argv)
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_good_values_pass():
    args = parser().parse_args(["--threshold", "0", "--scale", "1e-3", "--logit", "-3.5", "--count", "7"])
    assert (args.threshold, args.scale, args.logit, args.count) == (0.0, 1e-3, -3.5, 7)
    assert isinstance(args.count, int) and parser().parse_args(["--threshold", "1"]).threshold == 1.0
