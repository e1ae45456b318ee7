"""Azure LLM inference trace CSV (Splitwise, 2023): ``TIMESTAMP,ContextTokens,GeneratedTokens``.

TIMESTAMP is an absolute wall clock with 7 fractional digits (100 ns ticks) and
no time zone (taken as UTC); ContextTokens are prompt tokens, GeneratedTokens
output tokens. CRLF line endings, no final newline. The log has no request id
and no prefix information (no sharing is invented).
"""

from __future__ import annotations

import polars as pl

from pipeline.ingest.fields import parse_timestamp, split_csv_block, whole_int
from pipeline.ingest.formats import Block, Parsed, ParseOptions

name = "azure"
line_based = True
has_header = True
may_hold_text = False

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def sniff(head: bytes) -> bool:
    first = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].strip()
    return first.decode("ascii", "replace").replace(" ", "") == HEADER


def parse(block: Block, opts: ParseOptions) -> Parsed:
    frame, rejects, _ = split_csv_block(block, (3,))
    rows = frame.select(
        parse_timestamp(frame["f0"]).alias("arrival_time"),
        whole_int(frame["f1"]).alias("prompt_tokens"),
        whole_int(frame["f2"]).alias("output_tokens"),
        pl.col("source_line"),
        pl.col("byte_offset"),
    )
    return Parsed(rows, rejects)
