"""Record-level checks shared by every format, and the content-hash request ids.

``validate`` splits parsed rows into good rows (every canonical column present,
in contract types) and rejected rows with the first reason that applies. The
rules: an arrival time in range (``MIN_TIME``, ``MAX_TIME``, ``MAX_OFFSET_S``),
whole non-negative token counts of at most ``contracts.MAX_TOKENS``, at least one
prompt token, cached tokens within the prompt, non-negative observed latencies, valid
64-bit hash ids, and no more prefix hash blocks than the prompt has blocks.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.contracts import MAX_TOKENS
from pipeline.ingest.fields import none_blank
from pipeline.ingest.formats import CANONICAL, REJECT_SCHEMA

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


# Arrival times must lie where every consumer can hold them: from the epoch to the
# end of 64-bit nanosecond time (pandas and Arrow "ns" columns end there). Relative
# timestamps may reach MAX_OFFSET_S (about 31.7 years) past the trace start.
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(2262, 4, 11, tzinfo=UTC)
MAX_OFFSET_S = 1e9
_INT64_MAX = 2**63 - 1
_OVER = pl.lit(f" (over {MAX_TOKENS:,}, the most the warehouse holds)")
_INT32_MAX = 2**31 - 1  # the requests table holds counts, priority and turn as int32


def _num(col: str) -> pl.Expr:
    c = pl.col(col)
    text = pl.when(c == _INT64_MAX).then(pl.lit("(2^63 - 1 or more)")).otherwise(c.cast(pl.String))
    return text.fill_null("null")


class Rule(NamedTuple):
    """A record check: rows where ``cond`` holds are rejected with ``why``.

    ``reads``: the columns whose values the condition compares. It holds only where
    they are not null, so a block in which they are all null (most formats leave
    max_tokens, priority, turn, block_size and hashes out) cannot fail it and the
    rule is not evaluated there: those conditions were half of the validation time
    of a gateway block. ``any_of``: the condition holds where any one of ``reads``
    is not null (the rule is needed when one of them has values). Empty ``reads``:
    always evaluated (the rules about missing values).
    """

    cond: pl.Expr
    why: pl.Expr
    reads: tuple[str, ...]
    any_of: bool = False


def _rules() -> list[Rule]:
    p, o = pl.col("prompt_tokens"), pl.col("output_tokens")
    bs = pl.col("block_size")
    n_hash = pl.col("prefix_hashes").list.len()
    max_blocks = (p + bs - 1) // bs
    offset = ("arrival_offset_s",)
    return [
        Rule(pl.col("_reject").is_not_null(), pl.col("_reject"), ("_reject",)),
        Rule(
            pl.col("arrival_time").is_null() & pl.col("arrival_offset_s").is_null(),
            pl.lit("missing or unparseable timestamp"),
            (),
        ),
        Rule(
            ~pl.col("arrival_offset_s").is_finite(),
            pl.lit("timestamp is not a finite number (NaN or infinity)"),
            offset,
        ),
        Rule(
            pl.col("arrival_offset_s") < 0,
            pl.lit("negative timestamp ") + _num("arrival_offset_s"),
            offset,
        ),
        Rule(
            pl.col("arrival_offset_s") > MAX_OFFSET_S,
            pl.lit("timestamp ")
            + _num("arrival_offset_s")
            + pl.lit(" s after the trace start is over 1e9 s (31 years) away; check its unit"),
            offset,
        ),
        Rule(
            (pl.col("arrival_time") < MIN_TIME) | (pl.col("arrival_time") >= MAX_TIME),
            pl.lit("timestamp ")
            + pl.col("arrival_time").dt.year().cast(pl.String)
            + pl.lit(" outside the years 1970 to 2262; check its unit (s, ms, us or ns)"),
            ("arrival_time",),
        ),
        Rule(p.is_null(), pl.lit("missing or non-integer prompt token count"), ()),
        Rule(o.is_null(), pl.lit("missing or non-integer output token count"), ()),
        Rule(
            p < 0,
            pl.lit("negative prompt token count ") + _num("prompt_tokens"),
            ("prompt_tokens",),
        ),
        Rule(
            o < 0,
            pl.lit("negative output token count ") + _num("output_tokens"),
            ("output_tokens",),
        ),
        Rule(p == 0, pl.lit("zero prompt tokens (an empty or failed request)"), ("prompt_tokens",)),
        Rule(
            p > MAX_TOKENS,
            pl.lit("prompt token count too large ") + _num("prompt_tokens") + _OVER,
            ("prompt_tokens",),
        ),
        Rule(
            o > MAX_TOKENS,
            pl.lit("output token count too large ") + _num("output_tokens") + _OVER,
            ("output_tokens",),
        ),
        Rule(
            pl.col("max_tokens") < 1,
            pl.lit("max_tokens below 1: ") + _num("max_tokens"),
            ("max_tokens",),
        ),
        Rule(
            pl.col("max_tokens") > _INT32_MAX,
            pl.lit("max_tokens too large ") + _num("max_tokens"),
            ("max_tokens",),
        ),
        Rule(
            (pl.col("priority") < -_INT32_MAX) | (pl.col("priority") > _INT32_MAX),
            pl.lit("priority out of the 32-bit range: ") + _num("priority"),
            ("priority",),
        ),
        Rule(
            (pl.col("turn") < -_INT32_MAX) | (pl.col("turn") > _INT32_MAX),
            pl.lit("turn out of the 32-bit range: ") + _num("turn"),
            ("turn",),
        ),
        Rule(
            pl.col("cached_tokens") < 0,
            pl.lit("negative cached tokens ") + _num("cached_tokens"),
            ("cached_tokens",),
        ),
        Rule(
            pl.col("cached_tokens") > p,
            pl.lit("cached tokens ") + _num("cached_tokens") + pl.lit(" exceed prompt tokens"),
            ("cached_tokens", "prompt_tokens"),
        ),
        Rule(
            (pl.col("observed_ttft_s") < 0)
            | (pl.col("observed_e2e_s") < 0)
            | (pl.col("observed_queue_s") < 0),
            pl.lit("negative observed latency (end before start)"),
            ("observed_ttft_s", "observed_e2e_s", "observed_queue_s"),
            True,
        ),
        Rule(bs.is_not_null() & (bs < 1), pl.lit("block size below 1"), ("block_size",)),
        Rule(
            bs.is_not_null()
            & (
                pl.col("prefix_hashes").is_null()
                | (pl.col("prefix_hashes").list.drop_nulls().list.len() != n_hash)
            ),
            pl.lit("missing or invalid hash_ids (a list of integers from 0 to 2^64-1)"),
            ("block_size",),
        ),
        Rule(
            bs.is_not_null() & (n_hash > max_blocks),
            pl.lit("")
            + n_hash.cast(pl.String)
            + pl.lit(" hash blocks for ")
            + _num("prompt_tokens")
            + pl.lit(" prompt tokens at block size ")
            + _num("block_size")
            + pl.lit(" (at most ceil(prompt/block) expected); is --prefix-block-tokens right?"),
            ("block_size", "prompt_tokens"),
        ),
    ]


def complete(rows: pl.DataFrame) -> pl.DataFrame:
    """Add every canonical column the format did not produce, as nulls."""
    n = rows.height
    missing = [_nulls(name, dt, n) for name, dt in CANONICAL.items() if name not in rows.columns]
    if "_reject" not in rows.columns:
        missing.append(_nulls("_reject", pl.String(), n))
    # NOTE: columns added directly rather than by a query (``with_columns``): a query
    # waits its turn in polars' thread pool, busy with the other parse thread's read
    rows = rows.hstack(missing) if missing else rows
    casts = [
        pl.col(c).cast(dt)
        for c, dt in CANONICAL.items()
        if c in rows.columns and rows.schema[c] != dt
    ]
    return rows.with_columns(casts) if casts else rows


def _nulls(name: str, dtype: pl.DataType, n: int) -> pl.Series:
    return pl.Series(name, [None], dtype=dtype).new_from_index(0, n)


@lru_cache(maxsize=1)
def _all_rules() -> tuple[Rule, ...]:
    return tuple(_rules())


def _applicable(rows: pl.DataFrame) -> tuple[int, ...]:
    """The rules that can fail in ``rows`` (see ``Rule.reads``), by their index."""
    n = rows.height
    has = {c for c in rows.columns if rows[c].null_count() < n}
    return tuple(
        i
        for i, rule in enumerate(_all_rules())
        if (has.intersection(rule.reads) if rule.any_of else has.issuperset(rule.reads))
    )


@lru_cache(maxsize=64)
def _checks(which: tuple[int, ...]) -> tuple[pl.Expr, pl.Expr]:
    """(whether a row fails any of these rules, the first one's reason), built once per set."""
    rules = [_all_rules()[i] for i in which]
    failed = pl.any_horizontal([pl.lit(False)] + [r.cond.fill_null(False) for r in rules])
    reason: pl.Expr = pl.lit(None, dtype=pl.String)
    for r in reversed(rules):
        reason = pl.when(r.cond.fill_null(False)).then(r.why).otherwise(reason)
    return failed, reason


def validate(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split rows into (good rows, rejects with source_line, byte_offset, reason)."""
    rows = complete(rows)
    failed, reason = _checks(_applicable(rows))
    mask = rows.select(failed).to_series()
    # NOTE: reasons (text built from values) only for the rows that fail a rule: a
    # when/then chain computes every branch for every row, which cost more than the checks.
    if mask.any():
        bad = rows.filter(mask).select("source_line", "byte_offset", reason.alias("reason"))
        bad = bad.cast(REJECT_SCHEMA)  # type: ignore[arg-type]
        good = rows.filter(~mask)
    else:
        bad, good = pl.DataFrame(schema=REJECT_SCHEMA), rows
    good = good.clone()  # a shallow copy, changed in place below (``rows`` is the caller's)
    good.drop_in_place("_reject")
    hashes = good["prefix_hashes"]
    if hashes.null_count() == good.height:  # formats without hashes: an empty list each
        empty = pl.Series("prefix_hashes", [[]], dtype=hashes.dtype).new_from_index(0, good.height)
        good.replace_column(good.get_column_index("prefix_hashes"), empty)
    elif hashes.null_count():
        good = good.with_columns(pl.col("prefix_hashes").fill_null(pl.lit([], dtype=hashes.dtype)))
    if not none_blank(good["request_id"]):  # blank ids become missing ones
        good = good.with_columns(
            pl.when(pl.col("request_id").str.strip_chars() != "").then(pl.col("request_id"))
        )
    return good, bad


def _mix(h: npt.NDArray[np.uint64], v: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """One splitmix64-style round of h combined with v (stable across versions)."""
    with np.errstate(over="ignore"):
        z = (h ^ v) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def content_keys(rows: pl.DataFrame, format_name: str) -> npt.NDArray[np.uint64]:
    """A stable 64-bit key of each record's content (for logs without request ids).

    It covers the format, arrival, token counts, the number of prefix blocks
    and the last prefix hash (which names the whole chained prefix), and the turn.
    """
    seed = np.uint64(int.from_bytes(format_name.encode()[:8].ljust(8, b"\0"), "little"))
    t = rows["arrival_time"].dt.epoch("us").fill_null(-1)
    off = (rows["arrival_offset_s"] * 1e6).round().cast(pl.Int64).fill_null(-1)
    cols = [
        t,
        off,
        rows["prompt_tokens"].fill_null(-1),
        rows["output_tokens"].fill_null(-1),
        rows["prefix_hashes"].list.len().cast(pl.Int64).fill_null(-1),
        rows["prefix_hashes"].list.last().cast(pl.Int64, wrap_numerical=True).fill_null(-1),
        rows["turn"].fill_null(-1),
    ]
    h = np.full(rows.height, seed, dtype=np.uint64)
    for c in cols:
        h = _mix(h, c.to_numpy().astype(np.int64).view(np.uint64))
    return h


def occurrence_ids(keys: npt.NDArray[np.uint64], counts: dict[int, int]) -> list[str]:
    """Ids "h<16 hex>" from content keys, numbering repeats of the same content.

    ``counts`` carries how often each key was seen in earlier blocks of the
    same file, so identical records stay distinct and re-reads give equal ids.
    """
    out = []
    for k in keys.tolist():
        n = counts.get(k, 0)
        counts[k] = n + 1
        key = k if n == 0 else int(_mix(np.asarray([k], np.uint64), np.asarray([n], np.uint64))[0])
        out.append(f"h{key:016x}")
    return out
