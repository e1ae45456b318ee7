"""Fuzzing every reader: random bytes and mutated valid records never crash an ingest.

For every format (forced, and detected), a file of random bytes or of valid
records mutated at random (bytes flipped, inserted, deleted, lines cut or
repeated, JSON's troublemakers spliced in: NaN, 1e309, 2^63, unpaired
surrogates, deep brackets, blank runs, Latin-1 bytes) is ingested end to end.
What must hold for every input:

* no unexpected error: a file either lands with read = kept + quarantined +
  duplicates, or fails as a whole with an expected one-line error;
* the warehouse holds exactly the kept rows and the quarantined ones.

Examples per test: ``TRACEREPLAY_FUZZ_EXAMPLES`` (default 10, so the suite
stays fast); e.g. ``TRACEREPLAY_FUZZ_EXAMPLES=2000 pytest tests/ingest/test_fuzz.py``
for a long run.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import Warehouse
from tests.ingest.records import (
    AZURE_HEADER,
    BURST_V1_HEADER,
    BURST_V3_HEADER,
    azure,
    bailian,
    burst_v1,
    burst_v3,
    gateway,
    lines,
    mooncake,
    otel_doc,
    otel_span,
    token_ids,
)

EXAMPLES = int(os.environ.get("TRACEREPLAY_FUZZ_EXAMPLES", "10"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

VALID: dict[str, bytes] = {
    "gateway": lines([gateway(i, messages=[{"role": "user", "content": "hi"}]) for i in range(5)]),
    "mooncake": lines([mooncake(i) for i in range(5)]),
    "bailian": lines([bailian(i, turn=1 + i % 2) for i in range(5)]),
    "token_ids": lines(
        [token_ids(i, max_tokens=64, priority=1, user="t", session_id="s") for i in range(5)]
    ),
    "azure": AZURE_HEADER + b"".join(azure(i) for i in range(5)),
    "burstgpt": BURST_V1_HEADER + b"".join(burst_v1(i) for i in range(5)),
    "burstgpt_v3": BURST_V3_HEADER + b"".join(burst_v3(i) for i in range(5)),
    "otel": lines([otel_doc(otel_span(i)) for i in range(3)]),
    "otel_document": json.dumps(otel_doc(*(otel_span(i) for i in range(3))), indent=1).encode(),
}

# what JSON and CSV readers tend to disagree on
TOKENS = [
    b"NaN",
    b"-Infinity",
    b"1e309",
    b"9223372036854775808",
    b"1e20",
    b"-1",
    b"0",
    b"12.5",
    b'"12"',
    b"null",
    b"true",
    b'"\\ud800"',
    b'"\\ud83d\\ude00"',
    b"[" * 3000,
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"',
    b"\\",
    b"\n",
    b"\r\n",
    b" " * 300 + b"\n",
    b"\x00",
    b"\xff\xfe",
    b"\xe9",
    b"\xef\xbb\xbf",
    b"inf",
    b"nan",
]


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut", "repeat"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 40))]
        elif op == "cut":
            del data[pos:]
        elif op == "repeat":
            start = data.rfind(b"\n", 0, pos) + 1
            end = data.find(b"\n", pos)
            line = bytes(data[start : end + 1 if end >= 0 else len(data)])
            data[start:start] = line * draw(st.integers(1, 3))
    return bytes(data)


def _ingest(content: bytes, fmt: str | None, name: str = "log") -> None:
    """Ingest ``content`` and check the invariants."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        wh = Warehouse(Path(tmp) / "wh")
        res = ingest_logs([str(path)], wh, IngestOptions(format=fmt, quiet=True))
        (f,) = res.files
        if f.error is not None:
            assert "unexpected error" not in f.error, f.error
            assert len(f.error.splitlines()) == 1
            assert (f.rows_read, f.rows_kept) == (0, 0)
        assert f.rows_read == f.rows_kept + f.rows_quarantined + f.rows_duplicate
        con = wh.connect()
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(f.rows_kept,)]
        assert con.execute("SELECT count(*) FROM quarantine").fetchall() == [(f.rows_quarantined,)]
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]


def _format_of(variant: str) -> str:
    return {"burstgpt_v3": "burstgpt", "otel_document": "otel"}.get(variant, variant)


@pytest.mark.parametrize("variant", sorted(VALID))
def test_valid_samples_land_whole(variant: str) -> None:
    """The fuzzers' starting points are valid: every record lands, detected and forced."""
    for fmt in (None, _format_of(variant)):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "log"
            path.write_bytes(VALID[variant])
            res = ingest_logs([str(path)], Warehouse(Path(tmp) / "wh"), IngestOptions(format=fmt))
            (f,) = res.files
            assert f.error is None and f.format == _format_of(variant)
            assert f.rows_kept == f.rows_read > 0 and f.rows_quarantined == 0


@pytest.mark.parametrize("variant", sorted(VALID))
@FUZZ
@given(data=st.data())
def test_mutated_records(variant: str, data: st.DataObject) -> None:
    content = data.draw(mutated(VALID[variant]))
    _ingest(content, _format_of(variant))


@pytest.mark.parametrize("variant", sorted(VALID))
@FUZZ
@given(data=st.data())
def test_mutated_records_detected(variant: str, data: st.DataObject) -> None:
    _ingest(data.draw(mutated(VALID[variant])), None)


@pytest.mark.parametrize("fmt", sorted({_format_of(v) for v in VALID}))
@FUZZ
@given(content=st.binary(max_size=3000))
def test_random_bytes(fmt: str, content: bytes) -> None:
    _ingest(content, fmt)


@FUZZ
@given(content=st.binary(max_size=3000))
def test_random_bytes_detected(content: bytes) -> None:
    _ingest(content, None)


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
@FUZZ
@given(data=st.data())
def test_mutated_compressed(codec: str, data: st.DataObject) -> None:
    """Damaged compressed files land whole or fail whole, never half."""
    plain = data.draw(mutated(VALID["gateway"])) if data.draw(st.booleans()) else VALID["gateway"]
    packed = gzip.compress(plain) if codec == "gzip" else zstandard.compress(plain)
    damaged = data.draw(mutated(packed))
    _ingest(damaged, "gateway", "log.gz" if codec == "gzip" else "log.zst")
