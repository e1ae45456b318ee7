"""OpenAI-compatible gateway request logs as JSONL, LiteLLM spend-log style.

One JSON object per request, as exported from LiteLLM's ``LiteLLM_SpendLogs``
table: ``request_id``, ``startTime``, ``endTime``, ``completionStartTime``
(first chunk of a stream), ``prompt_tokens``, ``completion_tokens``, ``model``,
``user`` / ``team_id`` / ``end_user`` / ``api_key`` (hashed), ``status`` and
``metadata``. Cached prompt tokens are read from a top-level ``cached_tokens``
or ``cache_read_input_tokens``, or from
``metadata.usage_object.prompt_tokens_details.cached_tokens``.

``messages`` and ``response`` (present when the proxy stores prompts) are never
read. Observed TTFT is completionStartTime - startTime and E2E is endTime -
startTime. Rows whose ``status`` is not success are failed calls and are
rejected (they did not run on the engine).
"""

from __future__ import annotations

import polars as pl

from pipeline.ingest.fields import parse_timestamp, whole_int
from pipeline.ingest.formats import Block, ParseOptions, Parsed
from pipeline.ingest.jsonl import read_block

name = "gateway"
line_based = True
has_header = False
may_hold_text = True

_DETAILS = pl.Struct({"cached_tokens": pl.Float64()})
SCHEMA = {
    "request_id": pl.String(),
    "startTime": pl.String(),
    "endTime": pl.String(),
    "completionStartTime": pl.String(),
    "prompt_tokens": pl.Float64(),
    "completion_tokens": pl.Float64(),
    "model": pl.String(),
    "model_group": pl.String(),
    "user": pl.String(),
    "team_id": pl.String(),
    "end_user": pl.String(),
    "api_key": pl.String(),
    "status": pl.String(),
    "session_id": pl.String(),
    "cached_tokens": pl.Float64(),
    "cache_read_input_tokens": pl.Float64(),
    "metadata": pl.Struct(
        {"usage_object": pl.Struct({"prompt_tokens_details": _DETAILS})}
    ),
}


def sniff(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return first.lstrip().startswith(b"{") and b'"startTime"' in first and (
        b'"prompt_tokens"' in first or b'"request_id"' in first
    )


def _nonempty(s: pl.Series) -> pl.Expr:
    return pl.when(s.str.strip_chars() != "").then(s)


def parse(block: Block, opts: ParseOptions) -> Parsed:
    parsed = read_block(block, SCHEMA)
    f = parsed.rows
    start = parse_timestamp(f["startTime"])
    end = parse_timestamp(f["endTime"])
    first = parse_timestamp(f["completionStartTime"])
    nested = f["metadata"].struct.field("usage_object").struct.field("prompt_tokens_details")
    cached = pl.select(
        pl.coalesce(f["cached_tokens"], f["cache_read_input_tokens"],
                    nested.struct.field("cached_tokens"))
    ).to_series()
    status = f["status"].str.to_lowercase()
    failed = status.is_not_null() & ~status.is_in(["success", "ok", ""])
    rows = pl.DataFrame(
        {
            "request_id": f["request_id"],
            "arrival_time": start,
            "prompt_tokens": whole_int(f["prompt_tokens"]),
            "output_tokens": whole_int(f["completion_tokens"]),
            "model": pl.select(pl.coalesce(f["model"], f["model_group"])).to_series(),
            "tenant": pl.select(
                pl.coalesce(
                    _nonempty(f["team_id"]), _nonempty(f["user"]), _nonempty(f["end_user"]),
                    pl.lit(None, pl.String),
                )
            ).to_series(),
            "session_id": f["session_id"],
            "observed_ttft_s": (first - start).dt.total_microseconds() / 1e6,
            "observed_e2e_s": (end - start).dt.total_microseconds() / 1e6,
            "cached_tokens": whole_int(cached),
            "source_line": f["source_line"],
            "byte_offset": f["byte_offset"],
            "_reject": pl.select(
                pl.when(failed).then(pl.lit("status ") + f["status"] + pl.lit(
                    " (a failed call never reached the engine)"))
            ).to_series(),
        }
    )
    return Parsed(rows, parsed.rejects)
