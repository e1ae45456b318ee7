"""The one formatting of durations, counts and numbers that the report and the commands
print."""

from __future__ import annotations

import math

import pytest

from pipeline.report.render import fmt
from pipeline.text import DASH, format_count, format_duration, format_number


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.183, "183 ms"),
        (0.0125, "12.5 ms"),
        (0.00085, "850 \u00b5s"),
        (0.9994, "999 ms"),
        (0.9996, "1 s"),  # 999.6 ms rounds to 1,000 ms: the next unit
        (1.0, "1 s"),
        (12.5, "12.5 s"),
        (59.94, "59.9 s"),
        (59.97, "1 min"),
        (60.0, "1 min"),
        (252.0, "4.2 min"),
        (3500.0, "58.3 min"),
        (3599.0, "1 h"),
        (3599.9, "1 h"),
        (27_867.089, "7.7 h"),  # the 27,867,089 ms of a queue hours long
        (1e7, "2,778 h"),
        (0.0, "0 ms"),
        (-0.5, "-500 ms"),
    ],
)
def test_a_duration_prints_in_the_unit_that_reads(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_a_missing_duration_is_a_dash_and_an_infinite_one_says_so() -> None:
    assert format_duration(None) == DASH
    assert format_duration(math.nan) == DASH
    assert format_duration(math.inf) == "\u221e"
    assert format_duration(-math.inf) == "-\u221e"


def test_counts_are_integers() -> None:
    assert format_count(3.0) == "3"
    assert format_count(1024) == "1,024"
    assert format_count(2.6) == "3"
    assert format_count(None) == DASH
    assert format_count(math.nan) == DASH


def test_numbers_keep_four_significant_digits_without_trailing_zeros() -> None:
    assert format_number(3.0) == "3"
    assert format_number(11.6432) == "11.64"
    assert format_number(1.33) == "1.33"
    assert format_number(1024.0) == "1,024"
    assert format_number(27_867_089.4) == "27,867,089"
    assert format_number(0.012345) == "0.01235"
    assert format_number(None) == DASH and format_number(math.nan) == DASH


def test_report_cells_use_the_same_formatting() -> None:
    assert fmt(3.0, "float") == ("3", True)  # a replica answer, not 3.000
    assert fmt(3, "int") == ("3", True)
    assert fmt(27_867.089, "duration") == ("7.7 h", True)
    assert fmt(0.183, "duration") == ("183 ms", True)
    assert fmt(None, "duration") == (DASH, True)
    assert fmt(math.nan, "float") == (DASH, True)
