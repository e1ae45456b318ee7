"""Gateway (LiteLLM-style) request logs for tests and benchmarks.

``gateway_lines``: a small log for the reliability tests (ids, days, latencies).
``write_gateway_log``: a large log (millions of lines, in chunks, vectorized) with a
chosen fraction of bad lines, for benchmarks and bad-input tests; its lengths and
tenants are those of the samples (``pipeline.samples``).
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import polars as pl
import zstandard

from pipeline.samples import (
    BASE,
    EPOCH,
    MODEL,
    MODEL_GROUP,
    OUTPUT_CAP,
    OUTPUT_MEDIAN,
    OUTPUT_SIGMA,
    PROMPT_MEDIAN,
    PROMPT_SIGMA,
    TENANTS,
    api_key,
)

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def gateway_lines(
    ids: range, *, day: int = 0, spacing_s: float = 0.5, seed: int = 0, prefix: str = "req"
) -> str:
    """One request per id, ``spacing_s`` apart from midnight of ``T0 + day``; lengths and
    observed latencies are a function of the id (and ``seed``), so a log is reproducible."""
    lines = []
    base = T0 + timedelta(days=day)
    for k, i in enumerate(ids):
        start = base + timedelta(seconds=k * spacing_s)
        out = 1 + (i * 7 + seed) % 200
        ttft = 0.05 + ((i * 31 + seed) % 100) / 400
        lines.append(
            json.dumps(
                {
                    "request_id": f"{prefix}-{i}",
                    "startTime": _iso(start),
                    "completionStartTime": _iso(start + timedelta(seconds=ttft)),
                    "endTime": _iso(start + timedelta(seconds=ttft + out * 0.02)),
                    "prompt_tokens": 10 + (i * 13 + seed) % 900,
                    "completion_tokens": out,
                    "model": "m",
                    "status": "success",
                }
            )
        )
    return "\n".join(lines) + "\n"


BAD_KINDS = (
    "truncated_json",
    "negative_completion_tokens",
    "missing_prompt_tokens",
    "bad_start_time",
    "duplicate_request_id",
    "invalid_utf8",
)
_BAD_UTF8_MARK = "@@BADUTF8@@"


@dataclass
class GatewayLog:
    """What ``write_gateway_log`` wrote: line count and the 1-based lines of each bad kind."""

    path: Path
    lines: int
    bytes: int
    bad: dict[str, list[int]] = field(default_factory=dict)

    @property
    def bad_total(self) -> int:
        return sum(len(v) for v in self.bad.values())


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _request_ids(index: np.ndarray, seed: int) -> list[str]:
    """``chatcmpl-<32 hex>`` ids, a pure function of (line index, seed)."""
    base = index.astype(np.uint64) * np.uint64(2) + np.uint64(seed) * np.uint64(0x1000003)
    with np.errstate(over="ignore"):
        pair = np.stack([_splitmix64(base), _splitmix64(base + np.uint64(1))], axis=1)
    text = pair.astype(">u8").tobytes().hex()
    return [text[i : i + 32] for i in range(0, len(text), 32)]


@contextmanager
def _open_out(path: Path) -> Iterator[BinaryIO]:
    """A binary writer for ``path``, compressing for ``.gz`` / ``.zst`` suffixes."""
    with path.open("wb") as raw:
        if path.suffix == ".gz":
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=1) as g:
                yield cast(BinaryIO, g)
        elif path.suffix == ".zst":
            with zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as z:
                yield cast(BinaryIO, z)
        else:
            yield raw


def _compact_pieces(
    rid: pl.Expr,
    prompt_part: pl.Expr,
    start: pl.Expr,
    user_part: pl.Expr,
    team: pl.Expr,
    stamp: str,
) -> list[Any]:
    """The pieces of a lean gateway line: only the fields ingest reads."""
    return [
        '{"request_id":"chatcmpl-', rid,
        '","startTime":"', start,
        '","endTime":"', pl.from_epoch("end", "us").dt.strftime(stamp),
        '","completionStartTime":"', pl.from_epoch("first", "us").dt.strftime(stamp),
        '"', prompt_part,
        ',"completion_tokens":', pl.col("output"),
        f',"model":"{MODEL}","user":"', user_part,
        '","team_id":"', team,
        '","cache_read_input_tokens":', pl.col("cached"),
        ',"status":"success"}',
    ]  # fmt: skip


def write_gateway_log(
    path: Path,
    n: int,
    *,
    seed: int,
    bad_fraction: float = 0.0,
    rate: float = 20.0,
    chunk: int = 200_000,
    compact: bool = False,
) -> GatewayLog:
    """Stream ``n`` LiteLLM spend-log lines (JSONL) to ``path``, vectorized, in chunks.

    A ``bad_fraction`` of lines, spread uniformly, are bad in one of ``BAD_KINDS``:
    a JSON line cut in half, a negative ``completion_tokens``, no ``prompt_tokens``,
    an unparseable ``startTime``, the ``request_id`` of an earlier good line, or
    invalid UTF-8 bytes in ``user``. ``.gz`` / ``.zst`` suffixes compress. Arrivals
    are Poisson at ``rate`` per second from 2024-05-01T00:00:00Z (about 20 hours a
    million lines at the default rate, so large logs span several days).

    ``compact`` leaves out the fields ingest does not read (api key, spend, call
    type, ...) and writes cached tokens as top-level ``cache_read_input_tokens``:
    about 350 bytes a line instead of 630, closer to a lean gateway export.

    Returns the line count, bytes written (uncompressed) and every bad line's number.
    """
    rng = np.random.default_rng(seed)
    n_bad = round(n * bad_fraction)
    bad_idx = np.sort(rng.choice(n, size=n_bad, replace=False)) if n_bad else np.zeros(0, np.int64)
    kinds = rng.integers(0, len(BAD_KINDS), size=n_bad)
    kind_of = np.full(n, -1, dtype=np.int8)
    kind_of[bad_idx] = kinds
    # duplicates copy the id of an earlier good line
    is_dup = kinds == BAD_KINDS.index("duplicate_request_id")
    good = np.flatnonzero(kind_of < 0)
    before = np.searchsorted(good, bad_idx[is_dup])  # good lines ahead of each duplicate
    pick = np.floor(rng.random(before.size) * before).astype(np.int64)
    src = np.where(before > 0, good[np.minimum(pick, max(good.size - 1, 0))], -1)
    no_source = bad_idx[is_dup][src < 0]  # nothing good before it: truncate instead
    kinds[np.isin(bad_idx, no_source)] = BAD_KINDS.index("truncated_json")
    kind_of[bad_idx] = kinds
    dup_src = dict(zip(bad_idx[is_dup].tolist(), src.tolist(), strict=True))

    keys = [api_key(t) for t in range(len(TENANTS))]
    base_us = (BASE - EPOCH) // timedelta(microseconds=1)
    clock = 0.0
    written = 0
    mu_p, mu_o = math.log(PROMPT_MEDIAN), math.log(OUTPUT_MEDIAN)
    with _open_out(path) as out:
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            m = hi - lo
            idx = np.arange(lo, hi)
            gaps = rng.exponential(1.0 / rate, m)
            arrival = clock + np.cumsum(gaps)
            clock = float(arrival[-1])
            prompt = np.maximum(1, np.rint(rng.lognormal(mu_p, PROMPT_SIGMA, m))).astype(np.int64)
            output = np.clip(np.rint(rng.lognormal(mu_o, OUTPUT_SIGMA, m)), 1, OUTPUT_CAP).astype(
                np.int64
            )
            share = np.where(rng.random(m) < 0.6, rng.random(m), 0.0)
            cached = np.minimum((prompt * share).astype(np.int64) // 16, (prompt - 1) // 16) * 16
            ttft = 0.03 + (prompt - cached) * 0.00012
            e2e = ttft + (output - 1) * 0.011
            user = rng.integers(0, 400, m)
            tenant = user % len(TENANTS)
            session = rng.integers(0, 50_000, m)
            kind = kind_of[lo:hi]

            rid = _request_ids(idx, seed)
            for i in np.flatnonzero(kind == BAD_KINDS.index("duplicate_request_id")).tolist():
                rid[i] = _request_ids(np.array([dup_src[lo + i]]), seed)[0]
            start_us = base_us + np.rint(arrival * 1e6).astype(np.int64)
            frame = pl.DataFrame(
                {
                    "rid": rid,
                    "spend": (prompt * 0.15 + output * 0.6) / 1e6,
                    "prompt": prompt,
                    "output": np.where(
                        kind == BAD_KINDS.index("negative_completion_tokens"), -output, output
                    ),
                    "start": start_us,
                    "end": start_us + np.rint(e2e * 1e6).astype(np.int64),
                    "first": start_us + np.rint(ttft * 1e6).astype(np.int64),
                    "user": user,
                    "tenant": tenant,
                    "session": session,
                    "cached": cached,
                    "kind": kind,
                }
            )
            stamp = "%Y-%m-%dT%H:%M:%S%.6fZ"
            k = pl.col("kind")
            start = (
                pl.when(k == BAD_KINDS.index("bad_start_time"))
                .then(pl.lit("2024-13-45T25:61:00Z"))
                .otherwise(pl.from_epoch("start", "us").dt.strftime(stamp))
            )
            prompt_part = (
                pl.when(k == BAD_KINDS.index("missing_prompt_tokens"))
                .then(pl.lit(""))
                .otherwise(pl.format(',"prompt_tokens":{}', "prompt"))
            )
            user_part = (
                pl.when(k == BAD_KINDS.index("invalid_utf8"))
                .then(pl.concat_str(pl.lit("user-" + _BAD_UTF8_MARK), pl.col("user")))
                .otherwise(pl.concat_str(pl.lit("user-"), pl.col("user")))
            )
            team = pl.col("tenant").replace_strict(list(range(len(TENANTS))), list(TENANTS))
            key = pl.col("tenant").replace_strict(list(range(len(TENANTS))), keys)
            pieces: list[Any] = [
                '{"request_id":"chatcmpl-', pl.col("rid"),
                '","call_type":"acompletion","api_key":"', key,
                '","spend":', pl.col("spend").round(8),
                ',"total_tokens":', pl.col("prompt") + pl.col("output"),
                prompt_part,
                ',"completion_tokens":', pl.col("output"),
                ',"startTime":"', start,
                '","endTime":"', pl.from_epoch("end", "us").dt.strftime(stamp),
                '","completionStartTime":"', pl.from_epoch("first", "us").dt.strftime(stamp),
                f'","model":"{MODEL}","model_group":"{MODEL_GROUP}","user":"', user_part,
                '","team_id":"', team,
                '","end_user":"","cache_hit":"False","metadata":{"usage_object":'
                '{"prompt_tokens_details":{"cached_tokens":', pl.col("cached"),
                '}}},"status":"success","session_id":"sess-', pl.col("session"),
                '"}',
            ]  # fmt: skip
            if compact:
                pieces = _compact_pieces(pl.col("rid"), prompt_part, start, user_part, team, stamp)
            line = pl.concat_str([pl.lit(p) if isinstance(p, str) else p for p in pieces])
            line = (
                pl.when(k == BAD_KINDS.index("truncated_json"))
                .then(line.str.slice(0, line.str.len_chars() // 2))
                .otherwise(line)
            )
            buf = io.BytesIO()
            frame.select(line.alias("line")).write_csv(
                buf, include_header=False, quote_style="never"
            )
            data = buf.getvalue()
            if BAD_KINDS.index("invalid_utf8") in kind:
                data = data.replace(_BAD_UTF8_MARK.encode(), b"\xff\xfe")
            out.write(data)
            written += len(data)

    bad = {name: (bad_idx[kinds == i] + 1).tolist() for i, name in enumerate(BAD_KINDS)}
    return GatewayLog(path=path, lines=n, bytes=written, bad=bad)
