"""BurstGPT CSV: v1 and v3 layouts, failed (zero-token) rows, bad rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import SourceError
from pipeline.ingest.formats import CANONICAL, Block, ParseOptions, burstgpt
from pipeline.samples import SAMPLES_DIR, read_sample

V1 = b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
V3 = (
    b"Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
    b"Total tokens,Log Type\n"
)


def _parse(header: bytes, body: bytes, first_line: int = 2, offset: int | None = None) -> Any:
    off = len(header) if offset is None else offset
    return burstgpt.parse(Block(body, first_line, off), ParseOptions(header=header))


def _check_dtypes(rows: pl.DataFrame) -> None:
    for name, dtype in rows.schema.items():
        expected = pl.Int64 if name in ("source_line", "byte_offset") else CANONICAL[name]
        assert dtype == expected, name


def test_v1() -> None:
    body = b"5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,API log\n"
    p = _parse(V1, body)
    _check_dtypes(p.rows)
    assert p.rejects.height == 0
    assert p.rows.columns == [
        "arrival_offset_s",
        "model",
        "prompt_tokens",
        "output_tokens",
        "source_line",
        "byte_offset",
    ]
    assert p.rows.to_dicts() == [
        {
            "arrival_offset_s": 5.0,
            "model": "ChatGPT",
            "prompt_tokens": 472,
            "output_tokens": 18,
            "source_line": 2,
            "byte_offset": len(V1),
        },
        {
            "arrival_offset_s": 45.0,
            "model": "GPT-4",
            "prompt_tokens": 1087,
            "output_tokens": 230,
            "source_line": 3,
            "byte_offset": len(V1) + 38,
        },
    ]


def test_v3_sessions_and_blank_session() -> None:
    body = (
        b"19440110.0,1722ac82-0a46-4bf0-aa08-89794e7a2b3f,43,GPT-4,906,446,1352,Conversation log\n"
        b"19440161.0,,2,ChatGPT,36,29,65,API log\n"
    )
    p = _parse(V3, body)
    _check_dtypes(p.rows)
    assert p.rows["session_id"].to_list() == ["1722ac82-0a46-4bf0-aa08-89794e7a2b3f", None]
    assert p.rows["arrival_offset_s"].to_list() == [19440110.0, 19440161.0]
    assert p.rows["prompt_tokens"].to_list() == [906, 36]
    assert "observed_e2e_s" not in p.rows.columns  # Elapsed time is not mapped


def test_header_variants() -> None:
    body = b"1.5,abc,3,GPT-4,10,5,15,API log\r\n"
    for header in (
        V3,
        V3.replace(b"Session ID", b"SessionID"),
        b"\xef\xbb\xbf" + V3.replace(b"\n", b"\r\n"),
    ):
        p = _parse(header, body)
        assert p.rows["session_id"].to_list() == ["abc"]
        assert p.rows["model"].to_list() == ["GPT-4"]  # no stray \r anywhere


def test_no_header_infers_layout_from_field_count() -> None:
    p6 = _parse(b"", b"5,ChatGPT,472,18,490,Conversation log\n", first_line=1, offset=0)
    assert p6.rows["prompt_tokens"].to_list() == [472]
    p8 = _parse(b"", b"5.0,s,3,ChatGPT,472,18,490,Conversation log\n", first_line=1, offset=0)
    assert p8.rows["session_id"].to_list() == ["s"]
    with pytest.raises(SourceError, match="neither 6"):
        _parse(b"", b"1,2,3\n", first_line=1, offset=0)


def test_missing_required_column_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="Response tokens"):
        burstgpt.parse(
            Block(b"1,2\n", 2, 10),
            ParseOptions(path=Path("b.csv"), header=b"Timestamp,Request tokens\n"),
        )


def test_rejects() -> None:
    lines = [
        b"5,ChatGPT,472,18,490,Conversation log\n",
        b"7,GPT-4,100,0,100,API log\n",  # failed: zero response tokens
        b"8,GPT-4,0,12,12,API log\n",  # zero request tokens
        b"9,GPT-4,1,3\n",  # short row
        b"10,Chat\xffGPT,1,2,3,API log\n",  # not UTF-8
        b"\n",  # blank: not a record
        b"11,GPT-4,1,2,3,API log,extra\n",
        b"12,GPT-4,abc,2,3,API log\n",  # not a number: null, the validator rejects it
        b"13,ChatGPT,10,2,12,API log",  # last line, no newline
    ]
    body = b"".join(lines)
    starts = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    p = _parse(V1, body, first_line=2, offset=1000)
    assert p.rows["source_line"].to_list() == [2, 9, 10]
    assert p.rows["prompt_tokens"].to_list() == [472, None, 10]
    rej = p.rejects.to_dicts()
    assert [r["source_line"] for r in rej] == [3, 4, 5, 6, 8]
    assert [r["byte_offset"] for r in rej] == [1000 + starts[i] for i in (1, 2, 3, 4, 6)]
    reasons = [r["reason"] for r in rej]
    assert reasons[:2] == [burstgpt.ZERO_TOKENS] * 2
    assert reasons[2] == "expected 6 comma-separated fields, found 4"
    assert reasons[3].startswith("invalid UTF-8")
    assert reasons[4] == "expected 6 comma-separated fields, found 7"
    assert burstgpt.ZERO_TOKENS == "zero tokens (failed request in BurstGPT)"


def test_sniff() -> None:
    assert burstgpt.sniff(V1 + b"5,ChatGPT,1,2,3,API log\n")
    assert burstgpt.sniff(V3)
    assert burstgpt.sniff(b"\xef\xbb\xbf" + V1)
    assert not burstgpt.sniff(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
    assert not burstgpt.sniff(b'{"timestamp": 0}\n')


@pytest.mark.parametrize("name", ["burstgpt_v1.csv", "burstgpt_v3.csv"])
def test_the_samples(name: str) -> None:
    data = read_sample(SAMPLES_DIR / name)
    header, body = data.split(b"\n", 1)
    p = _parse(header + b"\n", body)
    total = body.count(b"\n")
    zero = sum(1 for line in body.splitlines() if line.split(b",")[-3] == b"0")
    assert p.rows.height + p.rejects.height == total
    assert p.rejects.height == zero
    assert set(p.rejects["reason"].to_list()) == {burstgpt.ZERO_TOKENS}
    assert 0.04 < zero / total < 0.12
    _check_dtypes(p.rows)
    assert p.rows["arrival_offset_s"].is_sorted()
    if name.endswith("v3.csv"):
        assert p.rows["session_id"].null_count() > 0
        assert p.rows["session_id"].drop_nulls().n_unique() < p.rows["session_id"].count()
