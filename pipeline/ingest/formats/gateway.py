"""OpenAI-compatible gateway request logs as JSONL, LiteLLM spend-log style.

One JSON object per request, as exported from LiteLLM's ``LiteLLM_SpendLogs``
table: ``request_id``, ``startTime``, ``endTime``, ``completionStartTime``
(first chunk of a stream), ``prompt_tokens``, ``completion_tokens``, ``model``,
``user`` / ``team_id`` / ``end_user`` (tenant, first non-empty), ``status`` and
``metadata``. Cached prompt tokens are read from a top-level ``cached_tokens``
or ``cache_read_input_tokens``, or from
``metadata.usage_object.prompt_tokens_details.cached_tokens``.

``response`` is never read. ``prompt`` or ``messages`` (present when the proxy
stores prompts) are read only with ``--tokenizer``: tokenized, hashed into
``prefix_hashes`` (``pipeline.ingest.prompt_text``) and dropped. Observed TTFT
is completionStartTime - startTime and E2E is endTime - startTime. Rows whose
``status`` is not success are failed calls and are rejected (they did not run
on the engine).
"""

from __future__ import annotations

import json

import polars as pl

from pipeline.ingest.fields import none_blank, parse_timestamp, to_number, whole_int
from pipeline.ingest.formats import Block, Parsed, ParseOptions
from pipeline.ingest.formats._lines import load_json_object
from pipeline.ingest.jsonl import read_block
from pipeline.ingest.prompt_text import Prompt, prompt_of, with_prompt_hashes

name = "gateway"
line_based = True
has_header = False
may_hold_text = True

# Counts are read as text so that "12" and 12 follow one rule (``fields.int_expr``).
SCHEMA = {
    "request_id": pl.String(),
    "startTime": pl.String(),
    "endTime": pl.String(),
    "completionStartTime": pl.String(),
    "prompt_tokens": pl.String(),
    "completion_tokens": pl.String(),
    "model": pl.String(),
    "model_group": pl.String(),
    "user": pl.String(),
    "team_id": pl.String(),
    "end_user": pl.String(),
    "status": pl.String(),
    "session_id": pl.String(),
    "cached_tokens": pl.String(),
    "cache_read_input_tokens": pl.String(),
    # NOTE: read as its JSON text: a Struct schema made polars build every row's struct
    # through its slow generic path (~8% of the whole read, for a field most logs lack)
    "metadata": pl.String(),
}
_TIMES = {"arrival_time": "startTime", "_end": "endTime", "_first": "completionStartTime"}
# read as JSON numbers where the log writes them so (``jsonl.read_block``), as Float64
_NUMBERS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_read_input_tokens")


def sniff(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return (
        first.lstrip().startswith(b"{")
        and b'"startTime"' in first
        and (b'"prompt_tokens"' in first or b'"request_id"' in first)
    )


def _nonempty(col: str) -> pl.Expr:
    return pl.when(pl.col(col).str.strip_chars() != "").then(pl.col(col))


# the general rules; ``_tenant`` and ``_failed_call`` skip them when a cheap check
# shows they would give the column as it is (tests/ingest/test_gateway_fast_paths.py)
TENANT = pl.coalesce(_nonempty("team_id"), _nonempty("user"), _nonempty("end_user"))
_STATUS = pl.col("status").str.to_lowercase()
FAILED_CALL = pl.when(_STATUS.is_not_null() & ~_STATUS.is_in(["success", "ok", ""])).then(
    pl.lit("status ") + pl.col("status").str.slice(0, 40) + pl.lit(" (a failed call never ran)")
)


def _tenant(f: pl.DataFrame) -> pl.Expr:
    """team_id, user or end_user, the first one neither missing nor blank."""
    if not f["team_id"].null_count() and none_blank(f["team_id"]):  # the common case
        return pl.col("team_id")
    return TENANT


def _failed_call(status: pl.Series) -> pl.Expr:
    """The reject reason of records whose status is not a success (null for the others)."""
    if (status == "success").all():  # nulls (ignored by all) are no failure either
        return pl.lit(None, dtype=pl.String)
    return FAILED_CALL


def parse(block: Block, opts: ParseOptions) -> Parsed:
    parsed = read_block(block, SCHEMA, numbers=_NUMBERS)
    f = parsed.rows
    cached = f["cached_tokens"].fill_null(f["cache_read_input_tokens"])
    if cached.null_count():
        cached = cached.fill_null(to_number(_nested_cached(f["metadata"])))
    times = {out: parse_timestamp(f[raw]) for out, raw in _TIMES.items()}
    start = pl.lit(times["arrival_time"])
    # One select, so polars evaluates the columns in parallel.
    rows = f.select(
        pl.col("request_id"),
        start.alias("arrival_time"),
        pl.lit(whole_int(f["prompt_tokens"])).alias("prompt_tokens"),
        pl.lit(whole_int(f["completion_tokens"])).alias("output_tokens"),
        pl.coalesce("model", "model_group").alias("model"),
        _tenant(f).alias("tenant"),
        pl.col("session_id"),
        pl.lit(whole_int(cached)).alias("cached_tokens"),
        pl.col("source_line"),
        pl.col("byte_offset"),
        _failed_call(f["status"]).alias("_reject"),
        ((pl.lit(times["_first"]) - start).dt.total_microseconds() / 1e6).alias("observed_ttft_s"),
        ((pl.lit(times["_end"]) - start).dt.total_microseconds() / 1e6).alias("observed_e2e_s"),
    )
    if opts.tokenizer is not None:
        rows = with_prompt_hashes(rows, _prompts(block, rows["byte_offset"]), opts)
    return Parsed(rows, parsed.rejects)


_CACHED_PATH = ("usage_object", "prompt_tokens_details", "cached_tokens")


def _nested_cached(metadata: pl.Series) -> pl.Series:
    """``metadata.usage_object.prompt_tokens_details.cached_tokens`` of each record, as text."""
    if metadata.null_count() == len(metadata):
        return metadata
    try:
        return metadata.str.json_path_match("$." + ".".join(_CACHED_PATH))
    except pl.exceptions.ComputeError:  # JSON nested deeper than polars' parser goes
        return pl.Series(metadata.name, [_dig(m) for m in metadata.to_list()], dtype=pl.String)


def _dig(text: str | None) -> str | None:
    record, _ = load_json_object(text.encode()) if text is not None else (None, None)
    value: object = record
    for key in _CACHED_PATH:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _prompts(block: Block, offsets: pl.Series) -> list[Prompt | None]:
    """The ``prompt`` or ``messages`` of each record (read only with ``--tokenizer``)."""
    data = block.data
    out: list[Prompt | None] = []
    for off in offsets.to_list():
        start = off - block.offset
        end = data.find(b"\n", start)
        record, _ = load_json_object(data[start : end if end >= 0 else len(data)])
        out.append(None if record is None else prompt_of(record))
    return out
