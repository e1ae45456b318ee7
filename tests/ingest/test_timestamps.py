"""The fast ISO-8601 path of timestamp parsing against the slow path (every layout)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest.fields import _mostly_iso, iso_timestamps, parse_timestamp, slow_timestamps


@st.composite
def _iso(draw: st.DrawFn) -> str:
    """ISO-like strings around the fast layout: valid ones and near misses."""
    year = draw(st.sampled_from([1899, 1900, 1969, 1970, 2024, 2262, 2999, 3000]))
    month, day = draw(st.integers(0, 13)), draw(st.integers(0, 32))
    hour, minute, sec = draw(st.integers(0, 25)), draw(st.integers(0, 61)), draw(st.integers(0, 61))
    sep = draw(st.sampled_from(["T", " ", "t"]))
    frac = draw(st.sampled_from(["", "."]))
    if frac:
        frac += "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=0, max_size=10)))
    zone = draw(
        st.sampled_from(["", "Z", "z", "+00:00", "-00:00", "+05:30", "-11:45", "+23:59", "+24:00"])
    )
    return f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{sec:02d}{frac}{zone}"


_VALUES = st.lists(_iso() | st.none() | st.sampled_from(["", " 2024-05-01T00:00:00Z"]), max_size=8)


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_fast_path_gives_the_slow_paths_instants(values: list[str | None]) -> None:
    s = pl.Series("t", values, dtype=pl.String)
    assert parse_timestamp(s).to_list() == slow_timestamps(s).to_list()


@settings(max_examples=200, deadline=None)
@given(st.lists(_iso(), min_size=1, max_size=8))
def test_fast_path_results_equal_slow_path_when_taken(values: list[str]) -> None:
    s = pl.Series("t", values, dtype=pl.String)
    fast = iso_timestamps(s)
    if fast is not None:
        assert fast.dtype == pl.Datetime("us", "UTC")
        assert fast.to_list() == slow_timestamps(s).to_list()


def test_fast_path_is_taken_for_the_common_layouts() -> None:
    zoned = ["2024-05-01T00:00:00.053651Z", "2024-05-01 10:00:00+02:00", None]
    zoned.append("2024-05-01T00:00:01Z")
    naive = ["2024-05-01T00:00:00.5", "2024-05-01 23:59:59"]
    for values in (zoned, naive):
        s = pl.Series("t", values, dtype=pl.String)
        fast = iso_timestamps(s)
        assert fast is not None
        assert fast.to_list() == slow_timestamps(s).to_list()
    # a leap second, 7 fraction digits, an epoch number: the slow path's business
    for odd in ("2024-06-30T23:59:60Z", "2024-05-01T00:00:00.1234567Z", "1714521600"):
        assert iso_timestamps(pl.Series("t", [odd, "2024-05-01T00:00:00Z"])) is None


_COMMON = st.sampled_from(["2024-05-01T00:00:00.053651Z", "2024-05-01T10:20:30.000001Z"])
_ODD = st.one_of(
    _iso(),
    st.none(),
    st.sampled_from(
        ["", "2024-13-45T25:61:00Z", "1714521600", "1714521600123", "x", " 2024-05-01"]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_COMMON, min_size=1, max_size=6), st.lists(_ODD, max_size=6), st.randoms())
def test_mostly_one_layout_gives_the_slow_paths_instants(
    common: list[str], odd: list[str | None], rnd: object
) -> None:
    """A column in the common layout but for a few values: those alone take the slow path."""
    rest = [*common[1:], *odd]
    rnd.shuffle(rest)  # type: ignore[attr-defined]
    s = pl.Series("t", [common[0], *rest], dtype=pl.String)
    mixed = _mostly_iso(s)
    if mixed is not None:
        assert mixed.to_list() == slow_timestamps(s).to_list()
    assert parse_timestamp(s).to_list() == slow_timestamps(s).to_list()


def test_mostly_one_layout_is_taken_with_a_bad_value() -> None:
    s = pl.Series("t", ["2024-05-01T00:00:00.5Z", "2024-13-45T25:61:00Z", None, "1714521600"])
    assert iso_timestamps(s) is None
    mixed = _mostly_iso(s)
    assert mixed is not None
    assert mixed.to_list() == slow_timestamps(s).to_list()
    assert mixed.null_count() == 2
