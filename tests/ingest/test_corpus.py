"""The bad-input corpus: every format, every classic, each with its exact outcome.

Each case writes a few files (built here in code, no binary fixtures), ingests
them in one run and checks, per file, the exact (kept, quarantined, duplicate)
counts or the one-line file error, plus the reasons of the quarantined records
where they matter. Every case also checks what must hold for any input: read =
kept + quarantined + duplicates, the warehouse holds exactly the kept rows and
the quarantined ones, a file with an error lands nothing, and the runs row is
written.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import Warehouse
from tests.ingest.records import (
    AZURE_HEADER,
    BURST_V1_HEADER,
    BURST_V3_HEADER,
    T0,
    azure,
    bailian,
    burst_v1,
    burst_v3,
    gateway,
    jline,
    lines,
    mooncake,
    otel_attr,
    otel_doc,
    otel_span,
    token_ids,
)

DEEP = 100_000


@dataclass
class Link:
    """A symbolic link to ``target`` (relative to the case directory)."""

    target: str


@dataclass
class Case:
    name: str
    files: dict[str, bytes | Link]
    # per file: (kept, quarantined, duplicates), or a substring of its one-line error
    expect: dict[str, tuple[int, int, int] | str]
    fmt: str | None = None
    sources: list[str] | None = None  # what to ingest (default: the case directory)
    reasons: list[str] = field(default_factory=list)  # substrings, in quarantine line order
    check: Callable[[Warehouse], None] | None = None


def zst(data: bytes, **kw: object) -> bytes:
    return zstandard.ZstdCompressor(**kw).compress(data)  # type: ignore[arg-type]


def gw(n: int, start: int = 0) -> bytes:
    return lines([gateway(i) for i in range(start, start + n)])


def mc(n: int) -> bytes:
    return lines([mooncake(i) for i in range(n)])


def tk(n: int) -> bytes:
    return lines([token_ids(i) for i in range(n)])


def az(n: int) -> bytes:
    return AZURE_HEADER + b"".join(azure(i) for i in range(n))


def b1(n: int) -> bytes:
    return BURST_V1_HEADER + b"".join(burst_v1(i) for i in range(n))


BIG = gw(20_000)
BIG_Z = zst(BIG[: len(BIG) // 2]) + zst(BIG[len(BIG) // 2 :])
NOT_OBJECTS = [b"[1, 2]\n", b"3\n", b"null\n", b'"text"\n']
BLANKS = [b"\n", b" \n", b"\t\t\n", b" " * 200 + b"\n", b" \t" * 5000 + b"\r\n", b"\r\n"]
DEEP_LINE = b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}\n"


def _skippable(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A50, len(payload)) + payload


def _gzip_bad_crc(data: bytes) -> bytes:
    z = bytearray(gzip.compress(data))
    z[-8] ^= 0xFF  # the CRC32 of the member
    return bytes(z)


def _hash_exact(wh: Warehouse) -> None:
    got = wh.connect().sql("SELECT prefix_hashes FROM requests").fetchall()
    assert got == [([2**64 - 1],)]


def _dates(expected: set[str]) -> Callable[[Warehouse], None]:
    def check(wh: Warehouse) -> None:
        got = wh.connect().sql("SELECT DISTINCT arrival_time::DATE::VARCHAR FROM requests")
        assert {r[0] for r in got.fetchall()} == expected

    return check


def _masked_excerpt(wh: Warehouse) -> None:
    got = wh.connect().sql("SELECT raw_excerpt FROM quarantine").fetchall()
    assert got == [("2023-11-16 18:00:01.6805900,301,?,41",)]


def _no_excerpts(wh: Warehouse) -> None:
    got = wh.connect().sql("SELECT count(raw_excerpt) FROM quarantine").fetchall()
    assert got == [(0,)]


CASES: list[Case] = [
    # --- compression: a frame cut short or corrupt lands nothing -----------------
    Case("zstd second frame cut", {"a.jsonl.zst": BIG_Z[:-3000]}, {"a.jsonl.zst": "truncated"}),
    Case(
        "zstd small cut, detected",
        {"a.jsonl.zst": zst(gw(20))[:-10]},
        {"a.jsonl.zst": "zstd data is truncated"},
    ),
    Case(
        "zstd small cut, --format",
        {"a.jsonl.zst": zst(gw(20))[:-10]},
        {"a.jsonl.zst": "zstd data is truncated"},
        fmt="gateway",
    ),
    Case(
        "zstd cut inside the next frame's header",
        {"a.zst": zst(gw(20)) + zst(gw(5, 100))[:5]},
        {"a.zst": "truncated"},
    ),
    Case(
        "zstd bad checksum",
        {"a.zst": (lambda z: z[:-1] + bytes([z[-1] ^ 0xFF]))(zst(gw(20), write_checksum=True))},
        {"a.zst": "corrupt zstd"},
    ),
    Case("zstd junk after a frame", {"a.zst": zst(gw(20)) + b"junk!"}, {"a.zst": "corrupt zstd"}),
    Case("zstd two whole frames", {"a.jsonl.zst": BIG_Z}, {"a.jsonl.zst": (20_000, 0, 0)}),
    Case(
        "zstd skippable frame",
        {"a.zst": zst(gw(10)) + _skippable(b"meta") + zst(gw(10, 10))},
        {"a.zst": (20, 0, 0)},
    ),
    Case("gzip cut", {"a.gz": gzip.compress(BIG)[:-500]}, {"a.gz": "truncated"}),
    Case("gzip bad crc", {"a.gz": _gzip_bad_crc(gw(20))}, {"a.gz": "corrupt gzip"}),
    Case(
        "gzip two members",
        {"a.gz": gzip.compress(gw(10)) + gzip.compress(gw(10, 10))},
        {"a.gz": (20, 0, 0)},
    ),
    Case(
        "gzip second member cut",
        {"a.gz": gzip.compress(gw(10)) + gzip.compress(gw(10, 10))[:-12]},
        {"a.gz": "truncated"},
    ),
    Case("zstd of mooncake cut", {"m.zst": zst(mc(50))[:-8]}, {"m.zst": "truncated"}),
    # --- encodings ------------------------------------------------------------
    Case(
        "UTF-16 with BOM",
        {"a.csv": (AZURE_HEADER + azure(1)).decode().encode("utf-16")},
        {"a.csv": "UTF-16"},
    ),
    Case("UTF-16 without BOM", {"a.csv": az(3).decode().encode("utf-16-le")}, {"a.csv": "UTF-16"}),
    Case("UTF-8 BOM azure", {"a.csv": b"\xef\xbb\xbf" + az(5)}, {"a.csv": (5, 0, 0)}),
    Case("UTF-8 BOM gateway", {"g.jsonl": b"\xef\xbb\xbf" + gw(5)}, {"g.jsonl": (5, 0, 0)}),
    Case("UTF-8 BOM burstgpt", {"b.csv": b"\xef\xbb\xbf" + b1(4)}, {"b.csv": (4, 0, 0)}),
    Case("CRLF gateway", {"g.jsonl": gw(6).replace(b"\n", b"\r\n")}, {"g.jsonl": (6, 0, 0)}),
    Case("CRLF mooncake", {"m.jsonl": mc(6).replace(b"\n", b"\r\n")}, {"m.jsonl": (6, 0, 0)}),
    Case("CRLF burstgpt", {"b.csv": b1(6).replace(b"\n", b"\r\n")}, {"b.csv": (6, 0, 0)}),
    Case(
        "Latin-1 byte in an azure row",
        {"a.csv": AZURE_HEADER + azure(0) + azure(1).replace(b"18:", b"18\xe9:") + azure(2)},
        {"a.csv": (2, 1, 0)},
        reasons=["invalid UTF-8"],
    ),
    Case(
        "Latin-1 byte in a burstgpt row",
        {"b.csv": BURST_V1_HEADER + burst_v1(0) + burst_v1(1).replace(b"Chat", b"Ch\xe9t")},
        {"b.csv": (1, 1, 0)},
        reasons=["invalid UTF-8"],
    ),
    Case(
        "Latin-1 byte in a gateway line",
        {"g.jsonl": gw(3) + jline(gateway(9)).replace(b"team-a", b"t\xe9am")},
        {"g.jsonl": (3, 1, 0)},
        reasons=["invalid UTF-8"],
    ),
    Case(
        "lone surrogate in a gateway id",
        {"g.jsonl": gw(3) + jline(gateway(9, request_id="\ud800"))},
        {"g.jsonl": (3, 1, 0)},
        reasons=["unpaired surrogate"],
    ),
    Case(
        "lone surrogate in a token_ids id",
        {"t.jsonl": tk(3) + jline(token_ids(9, request_id="x\udc00"))},
        {"t.jsonl": (3, 1, 0)},
        reasons=["unpaired surrogate"],
    ),
    Case(
        "lone surrogate in an otel attribute",
        {
            "o.json": jline(otel_doc(otel_span(1)))
            + jline(otel_doc(otel_span(2, otel_attr("gen_ai.conversation.id", "\ud801"))))
        },
        {"o.json": (1, 1, 0)},
        reasons=["unpaired surrogate"],
    ),
    Case(
        "surrogate pair (emoji) kept",
        {"g.jsonl": jline(gateway(1, model="llama \U0001f600"))},
        {"g.jsonl": (1, 0, 0)},
    ),
    # --- values JSON parsers disagree on, and overflow ---------------------------
    Case(
        "NaN, Infinity, 1e309 in gateway",
        {
            "g.jsonl": gw(2)
            + b'{"request_id": "x1", "startTime": "2024-05-01", "prompt_tokens": NaN}\n'
            + b'{"request_id": "x2", "startTime": "2024-05-01", "prompt_tokens": -Infinity}\n'
            + b'{"request_id": "x3", "startTime": "2024-05-01", "prompt_tokens": 1e309}\n'
        },
        {"g.jsonl": (2, 3, 0)},
        reasons=["NaN is not", "-Infinity is not", "beyond the double range"],
    ),
    Case(
        "NaN and 1e309 in mooncake",
        {
            "m.jsonl": mc(2)
            + b'{"timestamp": NaN, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
            + b'{"timestamp": 1e309, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        },
        {"m.jsonl": (2, 2, 0)},
        reasons=["NaN is not", "beyond the double range"],
    ),
    Case(
        "mooncake timestamp 1e20",
        {"m.jsonl": mc(2) + jline(mooncake(5, timestamp=1e20))},
        {"m.jsonl": (2, 1, 0)},
        reasons=["check its unit"],
    ),
    Case(
        "burstgpt timestamps inf, nan, 1e300",
        {"b.csv": b1(2) + burst_v1(5, "inf") + burst_v1(6, "nan") + burst_v1(7, "1e300")},
        {"b.csv": (2, 3, 0)},
        reasons=["not a finite number", "not a finite number", "check its unit"],
    ),
    Case(
        "gateway counts 2^63 and 1e30",
        {
            "g.jsonl": gw(1)
            + jline(gateway(5, prompt_tokens=2**63))
            + jline(gateway(6, completion_tokens=1e30))
        },
        {"g.jsonl": (1, 2, 0)},
        reasons=["prompt token count too large", "output token count too large"],
    ),
    Case(
        "token_ids counts 10^30 and -2^64",
        {
            "t.jsonl": tk(1)
            + jline({"timestamp": T0, "prompt_tokens": 10**30, "output_tokens": 1})
            + jline({"timestamp": T0, "prompt_tokens": 5, "output_tokens": -(2**64)})
        },
        {"t.jsonl": (1, 2, 0)},
        reasons=["prompt token count too large", "negative output token count"],
    ),
    Case(
        "token_ids int32 columns out of range",
        {
            "t.jsonl": lines(
                [
                    token_ids(0, max_tokens=64, priority=-3),
                    token_ids(1, max_tokens=2**40),
                    token_ids(2, priority=-(2**40)),
                    token_ids(3, priority=2**31),
                ]
            ),
        },
        {"t.jsonl": (1, 3, 0)},
        reasons=["max_tokens too large", "priority out of", "priority out of"],
    ),
    Case(
        "bailian turn out of range",
        {"q.jsonl": lines([bailian(0, turn=2), bailian(1, turn=2**40)])},
        {"q.jsonl": (1, 1, 0)},
        reasons=["turn out of the 32-bit range"],
    ),
    Case(
        "mooncake count 2^63",
        {"m.jsonl": mc(1) + jline(mooncake(3, input_length=2**63))},
        {"m.jsonl": (1, 1, 0)},
        reasons=["prompt token count too large"],
    ),
    Case(
        "azure count of 20 digits",
        {"a.csv": az(2) + azure(5, prompt="99999999999999999999")},
        {"a.csv": (2, 1, 0)},
        reasons=["prompt token count too large"],
    ),
    Case(
        "token_ids epoch s, ms, us and ns",
        {
            "t.jsonl": lines(
                [
                    token_ids(0, timestamp=T0),
                    token_ids(1, timestamp=T0 * 1000),
                    token_ids(2, timestamp=T0 * 10**6),
                    token_ids(3, timestamp=T0 * 10**9),
                    token_ids(4, timestamp=str(T0 * 10**9)),
                ]
            )
        },
        {"t.jsonl": (5, 0, 0)},
        check=_dates({"2024-05-01"}),
    ),
    Case(
        "token_ids timestamps out of range",
        {
            "t.jsonl": lines(
                [
                    token_ids(0),
                    token_ids(1, timestamp=1e300),
                    token_ids(2, timestamp="inf"),
                    token_ids(3, timestamp=10**30),
                    token_ids(4, timestamp="9999-01-01T00:00:00Z"),
                    token_ids(5, timestamp=-5),
                ]
            )
        },
        {"t.jsonl": (1, 5, 0)},
        reasons=["timestamp"] * 3 + ["outside the years"] * 2,
    ),
    Case(
        "otel startTimeUnixNano beyond int64 and negative",
        {
            "o.json": lines(
                [
                    otel_doc(otel_span(1)),
                    otel_doc(otel_span(2, startTimeUnixNano=str(2**64))),
                    otel_doc(otel_span(3, startTimeUnixNano=-(10**18))),
                ]
            )
        },
        {"o.json": (1, 2, 0)},
        reasons=["startTimeUnixNano out of range"] * 2,
    ),
    Case(
        "gateway epoch numbers and numeric strings",
        {
            "g.jsonl": lines(
                [
                    gateway(0, startTime=T0 + 0.5, endTime=T0 + 1.5, completionStartTime=None),
                    gateway(1, startTime=str(T0 * 1000), endTime=None, completionStartTime=None),
                ]
            )
        },
        {"g.jsonl": (2, 0, 0)},
        check=_dates({"2024-05-01"}),
    ),
    Case(
        "gateway times out of range",
        {
            "g.jsonl": lines(
                [
                    gateway(0),
                    gateway(1, startTime="9999-12-31T00:00:00Z"),
                    gateway(2, startTime="1960-01-01T00:00:00Z"),
                ]
            )
        },
        {"g.jsonl": (1, 2, 0)},
        reasons=["outside the years 1970 to 2262"] * 2,
    ),
    Case(
        "every timestamp shape (gateway)",
        {
            "g.jsonl": lines(
                [
                    gateway(0, startTime="2024-05-01T00:00:00Z"),
                    gateway(1, startTime="2024-05-01T02:00:01+02:00"),
                    gateway(2, startTime="2024-05-01 00:00:02.123456"),
                    gateway(3, startTime="2024-05-01T00:00:03"),
                    gateway(4, startTime="2024-05-01 00:00:04.1234567"),
                    gateway(5, startTime=T0 + 5),
                    gateway(6, startTime=str((T0 + 6) * 1000)),
                    gateway(7, startTime=(T0 + 7) * 10**6),
                ]
            )
        },
        {"g.jsonl": (8, 0, 0)},
        check=_dates({"2024-05-01"}),
    ),
    # --- structure ---------------------------------------------------------------
    Case(
        "100,000-deep gateway line",
        {"g.jsonl": gw(2) + DEEP_LINE},
        {"g.jsonl": (2, 1, 0)},
        reasons=["nested too deeply"],
    ),
    Case(
        "100,000-deep mooncake line",
        {"m.jsonl": mc(2) + DEEP_LINE},
        {"m.jsonl": (2, 1, 0)},
        fmt="mooncake",
        reasons=["nested too deeply"],
    ),
    Case(
        "100,000-deep token_ids line",
        {"t.jsonl": tk(2) + DEEP_LINE},
        {"t.jsonl": (2, 1, 0)},
        reasons=["nested too deeply"],
    ),
    Case(
        "100,000-deep otel document",
        {"o.json": jline(otel_doc(otel_span(1))) + DEEP_LINE},
        {"o.json": (1, 1, 0)},
        reasons=["nested too deeply"],
    ),
    Case(
        "gateway lines that are not objects",
        {"g.jsonl": gw(2) + b"".join(NOT_OBJECTS)},
        {"g.jsonl": (2, 4, 0)},
        reasons=["not a JSON object"] * 4,
    ),
    Case(
        "mooncake lines that are not objects",
        {"m.jsonl": mc(2) + b"".join(NOT_OBJECTS)},
        {"m.jsonl": (2, 4, 0)},
        reasons=["not a JSON object"] * 4,
    ),
    Case(
        "token_ids lines that are not objects",
        {"t.jsonl": tk(2) + b"".join(NOT_OBJECTS)},
        {"t.jsonl": (2, 4, 0)},
        reasons=["not a JSON object"] * 4,
    ),
    Case(
        "otel lines that are not objects",
        {"o.json": jline(otel_doc(otel_span(1))) + b"".join(NOT_OBJECTS)},
        {"o.json": (1, 4, 0)},
        reasons=["not a JSON object"] * 4,
    ),
    Case(
        "whitespace-only lines of any length (gateway)",
        {"g.jsonl": gw(2) + b"".join(BLANKS) + gw(1, 5)},
        {"g.jsonl": (3, 0, 0)},
    ),
    Case(
        "whitespace-only lines of any length (mooncake)",
        {"m.jsonl": mc(2) + b"".join(BLANKS)},
        {"m.jsonl": (2, 0, 0)},
    ),
    Case(
        "whitespace-only lines of any length (token_ids)",
        {"t.jsonl": tk(2) + b"".join(BLANKS)},
        {"t.jsonl": (2, 0, 0)},
    ),
    Case(
        "whitespace-only lines of any length (azure)",
        {"a.csv": az(2) + b"".join(BLANKS) + azure(9)},
        {"a.csv": (3, 0, 0)},
    ),
    Case(
        "whitespace-only lines of any length (burstgpt)",
        {"b.csv": b1(2) + b"".join(BLANKS)},
        {"b.csv": (2, 0, 0)},
    ),
    Case(
        "numeric strings in gateway",
        {
            "g.jsonl": lines(
                [
                    gateway(0, prompt_tokens="12", completion_tokens="3.0"),
                    gateway(1, prompt_tokens="12.5"),
                    gateway(2, prompt_tokens="twelve"),
                    gateway(3, prompt_tokens=True),
                ]
            )
        },
        {"g.jsonl": (1, 3, 0)},
        reasons=["non-integer prompt token count"] * 3,
    ),
    Case(
        "numeric strings in mooncake",
        {"m.jsonl": lines([mooncake(0, input_length="600", timestamp="5"), mooncake(1)])},
        {"m.jsonl": (2, 0, 0)},
    ),
    Case(
        "numeric strings in token_ids",
        {
            "t.jsonl": lines(
                [
                    {"timestamp": str(T0), "prompt_tokens": "12", "output_tokens": "3.0"},
                    {"timestamp": T0, "prompt_tokens": "12.5", "output_tokens": 1},
                ]
            )
        },
        {"t.jsonl": (1, 1, 0)},
        fmt="token_ids",
        reasons=["non-integer prompt token count"],
    ),
    Case(
        "numeric strings in otel",
        {
            "o.json": jline(
                otel_doc(otel_span(1, otel_attr("gen_ai.usage.input_tokens", "77"))),
            )
        },
        {"o.json": (1, 0, 0)},
    ),
    Case("headerless burstgpt v1", {"b.csv": b1(5)[len(BURST_V1_HEADER) :]}, {"b.csv": (5, 0, 0)}),
    Case(
        "headerless burstgpt v3",
        {"b.csv": b"".join(burst_v3(i) for i in range(4))},
        {"b.csv": (4, 0, 0)},
    ),
    Case("headerless burstgpt, one line", {"b.csv": burst_v1(3).rstrip()}, {"b.csv": (1, 0, 0)}),
    Case("burstgpt v3 with header", {"b.csv": BURST_V3_HEADER + burst_v3(1)}, {"b.csv": (1, 0, 0)}),
    Case(
        "mooncake bad hash_ids",
        {
            "m.jsonl": lines(
                [
                    mooncake(0, hash_ids=["a", "b"]),
                    mooncake(1, hash_ids=[2**70]),
                    mooncake(2, hash_ids=[-1]),
                    mooncake(3, hash_ids=[1.5]),
                    mooncake(4, hash_ids="1,2"),
                    mooncake(5, hash_ids=[1, None]),
                ]
            )
        },
        {"m.jsonl": (0, 6, 0)},
        reasons=["invalid hash_ids"] * 6,
    ),
    Case(
        "mooncake hash 2^64-1 lands exactly",
        {"m.jsonl": jline(mooncake(0, hash_ids=[2**64 - 1]))},
        {"m.jsonl": (1, 0, 0)},
        check=_hash_exact,
    ),
    Case(
        "bailian bad hash_ids and a good one",
        {"q.jsonl": lines([bailian(0), bailian(1, hash_ids=[2**65])])},
        {"q.jsonl": (1, 1, 0)},
        reasons=["invalid hash_ids"],
    ),
    # --- classics ------------------------------------------------------------------
    Case("empty file", {"e.jsonl": b""}, {"e.jsonl": (0, 0, 0)}),
    Case("blank file", {"e.jsonl": b"\n \n\t\n"}, {"e.jsonl": (0, 0, 0)}),
    Case("empty gzip", {"e.gz": gzip.compress(b"")}, {"e.gz": (0, 0, 0)}),
    Case("header-only azure", {"a.csv": AZURE_HEADER}, {"a.csv": (0, 0, 0)}),
    Case("header-only burstgpt", {"b.csv": BURST_V1_HEADER.rstrip()}, {"b.csv": (0, 0, 0)}),
    Case(
        "huge line kept",
        {"g.jsonl": jline(gateway(1, note="x" * 10_000_000)) + gw(1, 2)},
        {"g.jsonl": (2, 0, 0)},
    ),
    Case(
        "huge garbage line without newline",
        {"g.jsonl": gw(2) + b"{" + b"z" * 5_000_000},
        {"g.jsonl": (2, 1, 0)},
        reasons=["not valid JSON"],
    ),
    Case(
        "unsorted gateway",
        {"g.jsonl": lines([gateway(i) for i in (5, 3, 9, 1, 7, 0)])},
        {"g.jsonl": (6, 0, 0)},
    ),
    Case(
        "duplicates within a file",
        {"g.jsonl": gw(5) + jline(gateway(2, prompt_tokens=5)) + jline(gateway(4))},
        {"g.jsonl": (5, 0, 2)},
    ),
    Case(
        "duplicates across files",
        {"a.jsonl": gw(5), "b.jsonl": gw(5, 3)},
        {"a.jsonl": (5, 0, 0), "b.jsonl": (3, 0, 2)},
    ),
    Case(
        "identical rows without ids are distinct records",
        {"a.csv": AZURE_HEADER + azure(1) * 3},
        {"a.csv": (3, 0, 0)},
    ),
    Case(
        "identical files without ids",
        {"a.csv": az(4), "b.csv": az(4)},
        {"a.csv": (4, 0, 0), "b.csv": (0, 0, 4)},  # same content, same derived ids
    ),
    Case(
        "a symlink to a file in the same directory",
        {"g.jsonl": gw(4), "link.jsonl": Link("g.jsonl")},
        {"g.jsonl": (4, 0, 0)},
    ),
    Case(
        "a symlink to a directory",
        {"d/g.jsonl": gw(3), "e": Link("d")},
        {"d/g.jsonl": (3, 0, 0)},
    ),
    Case(
        "a dangling symlink",
        {"g.jsonl": gw(3), "gone.jsonl": Link("nowhere.jsonl")},
        {"g.jsonl": (3, 0, 0)},
    ),
    Case(
        "a mixed directory",
        {
            "a.csv": az(3),
            "sub/g.jsonl.gz": gzip.compress(gw(4)),
            "sub/m.jsonl.zst": zst(mc(5)),
            "sub/t.jsonl": tk(2),
            "b.csv": b1(2),
            "o.json": jline(otel_doc(otel_span(1), otel_span(2))),
            "README.md": b"# notes\n",
            ".hidden.jsonl": gw(9),
            "notes.txt": b"hello\n",
        },
        {
            "a.csv": (3, 0, 0),
            "sub/g.jsonl.gz": (4, 0, 0),
            "sub/m.jsonl.zst": (5, 0, 0),
            "sub/t.jsonl": (2, 0, 0),
            "b.csv": (2, 0, 0),
            "o.json": (2, 0, 0),
            "notes.txt": "unknown log format",
        },
    ),
    Case(
        "a bad file among good ones",
        {"a.jsonl": gw(3), "b.jsonl.zst": zst(gw(3, 10))[:-4], "c.jsonl": gw(3, 20)},
        {"a.jsonl": (3, 0, 0), "b.jsonl.zst": "truncated", "c.jsonl": (3, 0, 0)},
    ),
    Case(
        "last line cut short",
        {"g.jsonl": gw(3) + jline(gateway(8))[:30]},
        {"g.jsonl": (3, 1, 0)},
        reasons=["not valid JSON"],
    ),
    Case(
        "failed gateway calls",
        {"g.jsonl": gw(2) + jline(gateway(5, status="failure"))},
        {"g.jsonl": (2, 1, 0)},
        reasons=["status failure"],
    ),
    Case(
        "azure field counts, negative, junk",
        {
            "a.csv": az(1)
            + b"2023-11-16 18:15:47.0000000,12\r\n"
            + azure(2, prompt=-5)
            + b"not a time,10,10\r\n"
            + azure(3, output="abc")
        },
        {"a.csv": (1, 4, 0)},
        reasons=["2 fields", "negative prompt", "unparseable timestamp", "non-integer output"],
    ),
    Case(
        "azure text in an extra field: masked excerpt",
        {"a.csv": AZURE_HEADER + azure(1).replace(b",301,", b",301,secret words,")},
        {"a.csv": (0, 1, 0)},
        reasons=["4 fields"],
        check=_masked_excerpt,
    ),
    Case(
        "mooncake with a prompt field: no excerpt",
        {"m.jsonl": jline(mooncake(0, input_length=-1, prompt="secret words"))},
        {"m.jsonl": (0, 1, 0)},
        reasons=["negative prompt"],
        check=_no_excerpts,
    ),
    Case(
        "otel whole document with a NaN count",
        {
            "o.json": b'{"resourceSpans": [{"scopeSpans": [{"spans": [\n'
            + jline(otel_span(1))[:-1]
            + b",\n"
            + jline(otel_span(2))[:-1].replace(b'"intValue": "1202"', b'"doubleValue": NaN')
            + b"\n]}]}]}\n"
        },
        {"o.json": (1, 1, 0)},
        reasons=["missing or non-integer prompt"],
    ),
    Case(
        "forced format that does not match",
        {"a.csv": az(3)},
        {"a.csv": (0, 4, 0)},  # the header is a line like any other to JSONL
        fmt="gateway",
        reasons=["not valid JSON"] * 4,
    ),
]


def _write(root: Path, files: dict[str, bytes | Link]) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            os.symlink(content.target, p)
        else:
            p.write_bytes(content)


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(tmp_path: Path, case: Case) -> None:
    root = tmp_path / "in"
    root.mkdir()
    _write(root, case.files)
    wh = Warehouse(tmp_path / "wh")
    sources = [str(root / s) for s in case.sources] if case.sources else [str(root)]
    res = ingest_logs(sources, wh, IngestOptions(format=case.fmt, quiet=True))

    got = {str(Path(f.path).relative_to(root)): f for f in res.files}
    assert set(got) == set(case.expect), sorted(got)
    for rel, want in case.expect.items():
        f = got[rel]
        assert f.rows_read == f.rows_kept + f.rows_quarantined + f.rows_duplicate
        if isinstance(want, str):
            assert f.error is not None and want in f.error, (rel, f.error)
            assert len(f.error.splitlines()) == 1 and rel.split("/")[-1] in f.error
            assert (f.rows_read, f.rows_kept) == (0, 0)
        else:
            assert f.error is None, (rel, f.error)
            assert (f.rows_kept, f.rows_quarantined, f.rows_duplicate) == want, rel

    con = wh.connect()
    kept = sum(f.rows_kept for f in res.files)
    quarantined = sum(f.rows_quarantined for f in res.files)
    assert con.execute("SELECT count(*) FROM requests").fetchall() == [(kept,)]
    assert con.execute("SELECT count(*) FROM quarantine").fetchall() == [(quarantined,)]
    failed = {f.path for f in res.files if f.error}
    landed = {r[0] for r in con.execute("SELECT DISTINCT source_file FROM requests").fetchall()}
    assert not landed & failed
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    if case.reasons:
        got = con.sql("SELECT reason FROM quarantine ORDER BY source_line").fetchall()
        reasons = [r[0] for r in got]
        assert len(reasons) == len(case.reasons), reasons
        for want_reason, reason in zip(case.reasons, reasons, strict=True):
            assert want_reason in reason, (want_reason, reason)
    if case.check:
        case.check(wh)
    # nothing of a failed or finished run is left behind as a temporary file
    assert not [p for p in (tmp_path / "wh").rglob("*") if ".tmp-" in p.name]
    for p in (tmp_path / "wh").rglob("*.parquet"):
        pq.read_metadata(p)  # every file is whole
