"""BurstGPT CSV (HPMLL/BurstGPT, CC-BY 4.0): ChatGPT and GPT-4 traffic on Azure.

Two layouts, told apart by the header (columns are found by name):

* v1 (``BurstGPT_1.csv``, ``BurstGPT_2.csv``):
  ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
* v3 (release v2.0, ``BurstGPT_3.csv``) inserts two columns after ``Timestamp``:
  ``Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type``
  (``SessionID`` without the space, as the project README spells it, is accepted too).

Mapping:

* ``Timestamp`` (seconds from midnight of the trace's first day; integers in v1,
  ``19440110.0``-style floats in v3) -> ``arrival_offset_s``, unchanged.
* ``Model`` -> ``model``; ``Request tokens`` -> ``prompt_tokens``;
  ``Response tokens`` -> ``output_tokens``; ``Session ID`` -> ``session_id``
  (blank on ``API log`` rows -> null).
* ``Total tokens`` (their sum), ``Log Type`` (``Conversation log`` / ``API log``)
  and ``Elapsed time`` have no canonical column and are dropped. ``Elapsed
  time`` is not documented upstream; it is not assumed to be an end-to-end
  latency.
* No request ids: the driver derives them.
* A file without a header (its first line is a record: 6 or 8 fields, a number
  first, ``Conversation log`` or ``API log`` last) is detected too; its layout
  follows from the field count.

About 7-8% of rows have zero tokens: requests that failed. They are rejected with
the reason ``zero tokens (failed request in BurstGPT)`` rather than replayed as
zero-length work. Rows with the wrong number of fields or invalid UTF-8 are
rejected too; a number field that is not a number is read as null (the shared
validator rejects the row). BurstGPT holds no prompt text.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from pipeline.errors import SourceError
from pipeline.ingest.fields import int_expr
from pipeline.ingest.formats import Block, Parsed, ParseOptions
from pipeline.ingest.formats._lines import BOM, split_lines, utf8_reason

name = "burstgpt"
line_based = True
has_header = True
may_hold_text = False

V1_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
V3_HEADER = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
)
ZERO_TOKENS = "zero tokens (failed request in BurstGPT)"

# normalised header name -> (canonical column, dtype)
_MAP: dict[str, tuple[str, pl.DataType]] = {
    "timestamp": ("arrival_offset_s", pl.Float64()),
    "model": ("model", pl.String()),
    "requesttokens": ("prompt_tokens", pl.Int64()),
    "responsetokens": ("output_tokens", pl.Int64()),
    "sessionid": ("session_id", pl.String()),
}
_REQUIRED = ("timestamp", "requesttokens", "responsetokens")


def _norm(col: str) -> str:
    return "".join(col.split()).lower().strip('"')


def _header_names(opts: ParseOptions, first_fields: int | None) -> list[str]:
    raw = opts.header
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        # no header given: infer the layout from the field count of the first row
        if first_fields == 6:
            text = V1_HEADER
        elif first_fields == 8:
            text = V3_HEADER
        else:
            raise SourceError(
                str(opts.path),
                "BurstGPT CSV without a header and rows that are neither 6 (v1) nor 8 (v3) "
                f"fields wide (found {first_fields}); expected header {V1_HEADER!r}",
            )
    names = [c.strip().strip('"') for c in text.split(",")]
    normed = [_norm(c) for c in names]
    missing = [m for m in _REQUIRED if m not in normed]
    if missing:
        wanted = {"timestamp": "Timestamp", "requesttokens": "Request tokens"}
        miss = ", ".join(repr(wanted.get(m, "Response tokens")) for m in missing)
        raise SourceError(
            str(opts.path),
            f"BurstGPT header lacks column(s) {miss}; header was {text[:200]!r}, "
            f"expected {V1_HEADER!r} or {V3_HEADER!r}",
        )
    return names


_LOG_TYPES = (b"conversation log", b"api log")


def _is_record(line: bytes) -> bool:
    """A v1 or v3 data row (not a header): 6 or 8 fields, a number first, a log type last."""
    fields = line.strip().split(b",")
    if len(fields) not in (6, 8) or fields[-1].strip().strip(b'"').lower() not in _LOG_TYPES:
        return False
    try:
        float(fields[0])
    except ValueError:
        return False
    return True


def sniff(head: bytes) -> bool:
    if head.startswith(BOM):
        head = head[len(BOM) :]
    first = head.split(b"\n", 1)[0].strip().lower()
    return (
        first.startswith(b"timestamp,")
        and b"request tokens" in first
        and b"response tokens" in first
    ) or _is_record(first)


def parse(block: Block, opts: ParseOptions) -> Parsed:
    if _is_record(opts.header.removeprefix(BOM)):
        # A file without a header: the driver split off its first record as the header.
        # It belongs to the first block (the one right after it); the layout follows
        # from the field count.
        if block.first_line == 2:
            header = opts.header.removeprefix(BOM)
            block = Block(header + block.data, 1, block.offset - len(header))
        opts = replace(opts, header=b"")
    lines = split_lines(block.data, block.first_line, block.offset)
    # Decode: the whole block at once when it is clean UTF-8, else line by line.
    bad_utf8: list[str | None] = [None] * len(lines.raw)
    try:
        texts = block.data.decode("utf-8").split("\n")[: len(lines.raw)]
    except UnicodeDecodeError:
        texts = []
        for i, raw in enumerate(lines.raw):
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                texts.append("")
                bad_utf8[i] = utf8_reason(exc)

    frame = pl.DataFrame(
        {
            "line": texts,
            "bad_utf8": bad_utf8,
            "source_line": lines.numbers,
            "byte_offset": lines.offsets,
        },
        schema={
            "line": pl.String(),
            "bad_utf8": pl.String(),
            "source_line": pl.Int64(),
            "byte_offset": pl.Int64(),
        },
    )
    frame = frame.with_columns(pl.col("line").str.strip_chars_end("\r"))
    # blank lines are not records
    frame = frame.filter(
        pl.col("bad_utf8").is_not_null() | (pl.col("line").str.strip_chars() != "")
    )

    first_fields = None
    if frame.height and not opts.header.strip():
        first_fields = len(frame["line"][0].split(","))
    names = _header_names(opts, first_fields)
    width = len(names)

    n_fields = pl.col("line").str.count_matches(",", literal=True) + 1
    frame = frame.with_columns(
        pl.col("line").str.split_exact(",", width - 1).alias("fields"), n_fields.alias("_n")
    )
    n_fields = pl.col("_n")
    reason = (
        pl.when(pl.col("bad_utf8").is_not_null())
        .then(pl.col("bad_utf8"))
        .when(n_fields != width)
        .then(pl.format(f"expected {width} comma-separated fields, found {{}}", n_fields))
    )

    exprs = []
    taken: set[str] = set()
    for i, col in enumerate(names):
        key = _norm(col)
        if key not in _MAP or key in taken:  # a repeated column: the first one counts
            continue
        taken.add(key)
        canon, dtype = _MAP[key]
        text = pl.col("fields").struct.field(f"field_{i}").str.strip_chars().str.strip_chars('"')
        text = pl.when(text == "").then(None).otherwise(text)
        if dtype == pl.String():
            exprs.append(text.alias(canon))
            continue
        # counts follow the rule of every format ("12", "12.0"; see fields.int_expr)
        value = int_expr(text) if dtype == pl.Int64() else text.cast(dtype, strict=False)
        # a value that is not a number becomes null: the validator rejects it
        exprs.append(value.alias(canon))
    frame = frame.with_columns(exprs)
    reason = reason.when((pl.col("prompt_tokens") == 0) | (pl.col("output_tokens") == 0)).then(
        pl.lit(ZERO_TOKENS)
    )
    frame = frame.with_columns(reason.otherwise(None).alias("reason"))

    keep = list(
        dict.fromkeys(
            c for n in names if (k := _norm(n)) in _MAP and (c := _MAP[k][0]) in frame.columns
        )
    )
    rows = frame.filter(pl.col("reason").is_null()).select(*keep, "source_line", "byte_offset")
    rejects = frame.filter(pl.col("reason").is_not_null()).select(
        "source_line", "byte_offset", "reason"
    )
    return Parsed(rows=rows, rejects=rejects)
