"""Per-request JSONL records that carry the prompt's token ids.

One JSON object per line, for instance exported from vLLM request logs
(``prompt_token_ids`` appear in its ``Received request`` / ``Request ... details``
lines) or written by a gateway that tokenizes::

    {"request_id": "cmpl-1", "timestamp": 1714521600.25, "prompt_token_ids": [1, 2, ...],
     "output_tokens": 57, "model": "llama-3-8b-instruct", "user": "team-a"}

Fields (others are ignored):

* ``request_id`` (or ``id``): string or number.
* ``timestamp`` (or ``arrival_time``): an epoch time (number or numeric string) in
  seconds, milliseconds, microseconds or nanoseconds, told apart by magnitude
  (``pipeline.ingest.fields.epoch_us``), or an ISO-8601 string; without a UTC
  offset it is taken as UTC -> ``arrival_time``.
* ``prompt_token_ids``: list of integers -> ``prompt_tokens`` (its length) and
  ``prefix_hashes``: vLLM-compatible chained block hashes of the full blocks (see
  ``pipeline.ingest.hashing``), ``block_size`` 16 unless ``--prefix-block-tokens`` says
  otherwise. A record without ids but with ``prompt_tokens`` keeps that count
  with no hashes.
* ``output_tokens``, else the length of ``output_token_ids``.
* ``output_token_ids`` (optional): what the request generated -> ``output_hashes``:
  the same chain continued over prompt + output, the hashes of the full blocks
  after the prompt's full blocks (vLLM hashes generated blocks by their tokens
  too, so a later prompt that quotes the answer hits them). A list of anything
  but integers rejects the record.
* optional: ``model``, ``user`` (or ``tenant``) -> ``tenant``, ``priority``,
  ``max_tokens``, ``session_id``, ``cache_salt`` (vLLM's per-request salt: mixed
  into the first block hash exactly as vLLM does).

Records with text but no token ids (``prompt`` or ``messages``) are tokenized
with ``--tokenizer tokenizer.json`` through the optional ``tokenizers`` package,
the same way as every other format's text (``pipeline.ingest.prompt_text``: the
chat template next to the tokenizer when there is one, else ``role: content``
lines). The text is dropped as soon as it is tokenized and never stored, and
reject reasons never quote record content.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from pipeline.ingest.fields import epoch_us
from pipeline.ingest.formats import Block, Parsed, ParseOptions
from pipeline.ingest.formats._lines import (
    BOM,
    Rejects,
    as_int,
    as_str,
    lenient,
    load_json_object,
    split_lines,
)
from pipeline.ingest.hashing import DEFAULT_BLOCK_SIZE, prefix_hashes
from pipeline.ingest.prompt_text import hash_list_series, prompt_of, token_ids

name = "token_ids"
line_based = True
has_header = False
may_hold_text = True

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_COUNT_KEYS = (b'"prompt_tokens"', b'"input_length"', b'"input_tokens"', b'"usage"')


def sniff(head: bytes) -> bool:
    if head.startswith(BOM):
        head = head[len(BOM) :]
    for line in head.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        if not line.startswith(b"{"):
            return False
        if b'"prompt_token_ids"' in line:
            return True
        has_text = b'"prompt"' in line or b'"messages"' in line
        has_time = b'"timestamp"' in line or b'"arrival_time"' in line
        return has_text and has_time and not any(k in line for k in _COUNT_KEYS)
    return False


def _parse_time(value: Any) -> int | None:
    """An epoch time (s, ms, us or ns by magnitude: ``fields.epoch_us``) or ISO-8601
    -> microseconds since the epoch (UTC); ValueError if neither or out of range."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                pass
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("not an epoch time or an ISO-8601 time") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return (dt - _EPOCH) // _MICROSECOND
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not an epoch time or an ISO-8601 time")
    us = epoch_us(value)
    if us is None:
        raise ValueError("epoch time out of range")
    return us


def _token_list(value: Any) -> list[int]:
    """Validate a JSON list of token ids (vectorized); ValueError when it is not one."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of integers, got a {type(value).__name__}")
    if not value:
        return []
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in "iu" or type(value[0]) is bool:
        raise ValueError("expected a list of integers")
    ids: list[int] = arr.tolist()
    return ids


def parse(block: Block, opts: ParseOptions) -> Parsed:
    bs = opts.block_size or DEFAULT_BLOCK_SIZE
    lines = split_lines(block.data, block.first_line, block.offset)
    rejects = Rejects()

    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "request_id",
            "arrival_time",
            "prompt_tokens",
            "output_tokens",
            "max_tokens",
            "block_size",
            "model",
            "tenant",
            "priority",
            "session_id",
            "source_line",
            "byte_offset",
        )
    }
    hash_values: list[np.ndarray] = []
    hash_lens: list[int] = []
    out_values: list[np.ndarray] = []
    out_lens: list[int] = []
    out_valid: list[bool] = []

    for raw, line_no, off in zip(
        lines.raw, lines.numbers.tolist(), lines.offsets.tolist(), strict=True
    ):
        if not raw.strip():
            continue
        obj, why = load_json_object(raw)
        if obj is None:
            rejects.add(line_no, off, why or "not a JSON object")
            continue
        # Values of the wrong type become null (the validator rejects a missing required
        # value); only unreadable token ids reject the record here.
        rid = lenient(as_str, obj["request_id"] if "request_id" in obj else obj.get("id"))
        ts = obj["timestamp"] if "timestamp" in obj else obj.get("arrival_time")
        arrival = lenient(_parse_time, ts)
        ids: list[int] | None = None
        try:
            if obj.get("prompt_token_ids") is not None:
                ids = _token_list(obj["prompt_token_ids"])
            else:
                text = prompt_of(obj)
                if text is not None:
                    ids = token_ids([text], opts)[0]
        except ValueError as exc:
            rejects.add(line_no, off, f"prompt_token_ids: {exc}")
            continue
        generated: list[int] | None = None
        try:
            if obj.get("output_token_ids") is not None:
                generated = _token_list(obj["output_token_ids"])
        except ValueError as exc:
            rejects.add(line_no, off, f"output_token_ids: {exc}")
            continue
        prompt = len(ids) if ids is not None else lenient(as_int, obj.get("prompt_tokens"))
        output: int | None = None
        if obj.get("output_tokens") is not None:
            output = lenient(as_int, obj["output_tokens"])
        elif generated is not None:
            output = len(generated)
        max_tokens = lenient(as_int, obj.get("max_tokens"))
        priority = lenient(as_int, obj.get("priority"))
        model = lenient(as_str, obj.get("model"))
        user = obj.get("user")
        tenant = lenient(as_str, user if user is not None else obj.get("tenant"))
        session = lenient(as_str, obj.get("session_id"))
        salt = lenient(as_str, obj.get("cache_salt")) or ""

        out_valid.append(ids is not None and generated is not None)
        if ids is not None:
            whole = ids + generated if generated else ids  # one chain over both
            h = prefix_hashes(whole, bs, cache_salt=salt, hash_salt=opts.hash_salt)
            n_prompt = len(ids) // bs
            hash_values.append(h[:n_prompt])
            hash_lens.append(n_prompt)
            out_values.append(h[n_prompt:])
            out_lens.append(len(h) - n_prompt)
        else:
            hash_lens.append(0)
            out_lens.append(0)
        cols["request_id"].append(rid)
        cols["arrival_time"].append(arrival)
        cols["prompt_tokens"].append(prompt)
        cols["output_tokens"].append(output)
        cols["max_tokens"].append(max_tokens)
        cols["block_size"].append(bs if ids is not None else None)
        cols["model"].append(model)
        cols["tenant"].append(tenant)
        cols["priority"].append(priority)
        cols["session_id"].append(session)
        cols["source_line"].append(line_no)
        cols["byte_offset"].append(off)

    rows = pl.DataFrame(
        cols,
        schema={
            "request_id": pl.String(),
            "arrival_time": pl.Int64(),
            "prompt_tokens": pl.Int64(),
            "output_tokens": pl.Int64(),
            "max_tokens": pl.Int64(),
            "block_size": pl.Int32(),
            "model": pl.String(),
            "tenant": pl.String(),
            "priority": pl.Int64(),
            "session_id": pl.String(),
            "source_line": pl.Int64(),
            "byte_offset": pl.Int64(),
        },
    )
    rows = rows.with_columns(
        pl.col("arrival_time").cast(pl.Datetime("us", "UTC")),
        hash_list_series(hash_values, hash_lens),
        hash_list_series(out_values, out_lens, "output_hashes", out_valid),
    ).select(
        "request_id",
        "arrival_time",
        "prompt_tokens",
        "output_tokens",
        "max_tokens",
        "block_size",
        "prefix_hashes",
        "output_hashes",
        "model",
        "tenant",
        "priority",
        "session_id",
        "source_line",
        "byte_offset",
    )
    return Parsed(rows=rows, rejects=rejects.frame())
