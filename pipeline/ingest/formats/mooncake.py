"""Mooncake (Kimi, FAST'25) trace JSONL.

Fields: ``timestamp``, ``input_length``, ``output_length``, ``hash_ids``.

``timestamp`` is integer milliseconds from the trace start; each hash id names
one 512-token prompt block, chained like vLLM's block hashes (equal id at
block i means the whole prefix up to block i is equal), so
``len(hash_ids) == ceil(input_length / 512)``; the last block is usually
partial. The Qwen/Bailian traces share the shape with seconds and 16-token
blocks: see ``bailian.py``, which reuses this module's reader.
"""

from __future__ import annotations

import polars as pl

from pipeline.ingest.fields import whole_int
from pipeline.ingest.formats import Block, Parsed, ParseOptions
from pipeline.ingest.jsonl import read_block

name = "mooncake"
line_based = True
has_header = False
may_hold_text = True  # a JSON line may carry any extra field, a prompt too

BLOCK_SIZE = 512
SECONDS_PER_UNIT = 1e-3

# Numbers are read as text so that "12" and 12 follow one rule (``fields.int_expr``);
# hash ids as UInt64, so that every legal 64-bit hash lands exactly and anything else
# (a string, a negative number, 2^70, a fraction) is a null element the validator rejects.
SCHEMA = {
    "timestamp": pl.String(),
    "input_length": pl.String(),
    "output_length": pl.String(),
    "hash_ids": pl.List(pl.UInt64()),
    "chat_id": pl.String(),
    "parent_chat_id": pl.String(),
    "turn": pl.String(),
}


def sniff(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return (
        first.lstrip().startswith(b"{")
        and b'"hash_ids"' in first
        and b'"input_length"' in first
        and b'"chat_id"' not in first
    )


def parse_hashed(
    block: Block, opts: ParseOptions, seconds_per_unit: float, default_block: int
) -> Parsed:
    """Read Mooncake-shaped JSON lines with the given clock unit and block size."""
    parsed = read_block(block, SCHEMA)
    f = parsed.rows
    rows = pl.DataFrame(
        {
            "arrival_offset_s": f["timestamp"].str.strip_chars().cast(pl.Float64, strict=False)
            * seconds_per_unit,
            "prompt_tokens": whole_int(f["input_length"]),
            "output_tokens": whole_int(f["output_length"]),
            "prefix_hashes": f["hash_ids"],
            "session_id": f["chat_id"],
            "parent_id": f["parent_chat_id"],
            "turn": whole_int(f["turn"]),
            "source_line": f["source_line"],
            "byte_offset": f["byte_offset"],
        }
    ).with_columns(pl.lit(opts.block_size or default_block, dtype=pl.Int32).alias("block_size"))
    return Parsed(rows, parsed.rejects)


def parse(block: Block, opts: ParseOptions) -> Parsed:
    return parse_hashed(block, opts, SECONDS_PER_UNIT, BLOCK_SIZE)
