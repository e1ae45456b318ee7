"""The token-ids JSONL format: fields, hashes, rejects, the tokenizer path."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import SourceError
from pipeline.ingest.formats import CANONICAL, Block, ParseOptions, token_ids
from pipeline.ingest.hashing import prefix_hashes
from pipeline.ingest.prompt_text import load_tokenizer
from pipeline.samples import SAMPLES_DIR, read_sample
from tests.ingest import offline_tokenizer

SYSTEM = list(range(100, 140))  # 40 tokens: two full 16-token blocks and a partial one


def _line(**rec: Any) -> bytes:
    return json.dumps(rec).encode() + b"\n"


def _parse(data: bytes, first_line: int = 1, offset: int = 0, **opts: Any) -> Any:
    return token_ids.parse(Block(data, first_line, offset), ParseOptions(**opts))


def _check_dtypes(rows: pl.DataFrame) -> None:
    for name, dtype in rows.schema.items():
        if name in ("source_line", "byte_offset"):
            assert dtype == pl.Int64
        else:
            assert dtype == CANONICAL[name], name


def test_fields_and_dtypes() -> None:
    data = _line(
        request_id="cmpl-1",
        timestamp=1714521600.25,
        prompt_token_ids=SYSTEM + [1, 2, 3],
        output_tokens=17,
        model="m",
        user="team-a",
        priority=2,
        max_tokens=64,
        session_id="s1",
    ) + _line(
        request_id=42,
        arrival_time="2024-05-01T00:00:01.5Z",
        prompt_token_ids=SYSTEM,
        output_token_ids=[5, 6, 7],
        tenant="team-b",
    )
    p = _parse(data, first_line=10, offset=1000)
    rows = p.rows
    _check_dtypes(rows)
    assert p.rejects.height == 0
    assert rows["request_id"].to_list() == ["cmpl-1", "42"]
    assert rows["arrival_time"].to_list() == [
        datetime(2024, 5, 1, 0, 0, 0, 250000, tzinfo=UTC),
        datetime(2024, 5, 1, 0, 0, 1, 500000, tzinfo=UTC),
    ]
    assert rows["prompt_tokens"].to_list() == [43, 40]
    assert rows["output_tokens"].to_list() == [17, 3]
    assert rows["tenant"].to_list() == ["team-a", "team-b"]
    assert rows["priority"].to_list() == [2, None]
    assert rows["max_tokens"].to_list() == [64, None]
    assert rows["session_id"].to_list() == ["s1", None]
    assert rows["block_size"].to_list() == [16, 16]
    assert rows["source_line"].to_list() == [10, 11]
    assert rows["byte_offset"].to_list() == [1000, 1000 + len(data.split(b"\n")[0]) + 1]
    h0, h1 = rows["prefix_hashes"].to_list()
    assert h0 == prefix_hashes(SYSTEM + [1, 2, 3]).tolist()
    assert len(h0) == 2 and h0 == h1  # shared system prompt -> equal hashes


def test_output_token_ids_continue_the_chain() -> None:
    # 40 prompt + 30 generated tokens: four full 16-token blocks, two of them the prompt's;
    # the generated blocks' hashes go on from the prompt's (vLLM hashes them by content)
    output = list(range(500, 530))
    data = _line(request_id="a", timestamp=1.0, prompt_token_ids=SYSTEM, output_token_ids=output)
    data += _line(request_id="b", timestamp=2.0, prompt_token_ids=SYSTEM, output_tokens=30)
    data += _line(request_id="c", timestamp=3.0, prompt_tokens=40, output_token_ids=output)
    rows = _parse(data).rows
    whole = prefix_hashes(SYSTEM + output).tolist()
    assert len(whole) == 4
    assert rows["prefix_hashes"].to_list() == [whole[:2], whole[:2], []]
    assert rows["output_hashes"].to_list() == [whole[2:], None, None]  # c has no prompt ids
    assert rows["output_tokens"].to_list() == [30, 30, 30]
    _check_dtypes(rows)


def test_output_token_ids_that_are_not_integers_reject_the_record() -> None:
    data = _line(request_id="a", timestamp=1.0, prompt_token_ids=[1, 2], output_token_ids=["x"])
    p = _parse(data)
    assert p.rows.height == 0
    assert p.rejects["reason"].to_list() == ["output_token_ids: expected a list of integers"]


def test_timestamps_iso_variants_and_numeric_strings() -> None:
    stamps = ["2024-05-01T02:00:00+02:00", "2024-05-01 00:00:00", "1714521600", 1714521600]
    data = b"".join(
        _line(request_id=str(i), timestamp=t, prompt_token_ids=[1], output_tokens=1)
        for i, t in enumerate(stamps)
    )
    rows = _parse(data).rows
    assert rows["arrival_time"].to_list() == [datetime(2024, 5, 1, tzinfo=UTC)] * 4


def test_block_size_and_salts() -> None:
    ids = list(range(64))
    rec = _line(request_id="a", timestamp=1.0, prompt_token_ids=ids, output_tokens=1)
    assert _parse(rec, block_size=32).rows["prefix_hashes"][0].to_list() == (
        prefix_hashes(ids, 32).tolist()
    )
    assert _parse(rec, block_size=32).rows["block_size"][0] == 32
    salted = _parse(rec, hash_salt="pepper").rows["prefix_hashes"][0].to_list()
    assert salted == prefix_hashes(ids, hash_salt="pepper").tolist()
    assert salted != prefix_hashes(ids).tolist()
    rec2 = _line(
        request_id="b", timestamp=1.0, prompt_token_ids=ids, output_tokens=1, cache_salt="t"
    )
    assert _parse(rec2).rows["prefix_hashes"][0].to_list() == (
        prefix_hashes(ids, cache_salt="t").tolist()
    )


def test_unreadable_records_are_rejected_with_line_and_offset() -> None:
    good = _line(request_id="a", timestamp=1.0, prompt_token_ids=[1, 2], output_tokens=1)
    lines = [
        good,
        b'{"request_id": "b", "timestamp": 1.0, "prompt_token_ids": [1, 2\n',  # cut short
        b"\n",  # blank: not a record
        b'{"request_id": "c\xff", "timestamp": 1.0, "prompt_token_ids": [1]}\n',
        b"[1, 2, 3]\n",
        _line(request_id="d", timestamp=1.0, prompt_token_ids=[1, "x"], output_tokens=1),
        _line(request_id="e", timestamp=1.0, prompt_token_ids=[1.5], output_tokens=1),
        _line(request_id="f", timestamp=1.0, prompt_token_ids="1 2 3", output_tokens=1),
        good,
    ]
    data = b"".join(lines)
    starts = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    p = _parse(data, first_line=5, offset=100)
    assert p.rows["source_line"].to_list() == [5, 13]
    rej = p.rejects.to_dicts()
    assert [r["source_line"] for r in rej] == [6, 8, 9, 10, 11, 12]
    assert [r["byte_offset"] for r in rej] == [100 + starts[i] for i in (1, 3, 4, 5, 6, 7)]
    reasons = [r["reason"] for r in rej]
    assert reasons[0].startswith("not valid JSON")
    assert reasons[1].startswith("invalid UTF-8")
    assert "JSON object" in reasons[2]
    assert all(r.startswith("prompt_token_ids:") for r in reasons[3:])


def test_wrong_types_become_null_for_the_validator() -> None:
    data = _line(
        request_id={"x": 1},
        timestamp="yesterday",
        prompt_token_ids=[1, 2, 3],
        output_tokens="many",
        priority="high",
        max_tokens=1.5,
    )
    p = _parse(data)
    assert p.rejects.height == 0
    row = p.rows.row(0, named=True)
    assert row["request_id"] is None and row["arrival_time"] is None
    assert row["output_tokens"] is None and row["priority"] is None
    assert row["max_tokens"] is None and row["prompt_tokens"] == 3


def test_counts_without_ids_keep_the_count_but_no_hashes() -> None:
    rows = _parse(_line(request_id="a", timestamp=1.0, prompt_tokens=77, output_tokens=3)).rows
    assert rows["prompt_tokens"][0] == 77
    assert rows["prefix_hashes"][0].to_list() == []
    assert rows["block_size"][0] is None


def test_text_without_tokenizer_is_a_source_error() -> None:
    data = _line(request_id="a", timestamp=1.0, prompt="secret words", output_tokens=3)
    with pytest.raises(SourceError) as err:
        _parse(data, path=Path("logs/x.jsonl"))
    assert "--tokenizer" in str(err.value) and "pip install tokenizers" in str(err.value)
    assert "secret" not in str(err.value)
    assert err.value.path == "logs/x.jsonl"


def test_text_with_tokenizer_but_no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    load_tokenizer.cache_clear()
    data = _line(request_id="a", timestamp=1.0, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(SourceError, match="pip install tokenizers"):
        _parse(data, tokenizer=Path("tok.json"))
    load_tokenizer.cache_clear()


def test_text_is_tokenized_and_dropped(tmp_path: Path) -> None:
    tok = offline_tokenizer.build(tmp_path / "tok")
    text = " ".join(["s"] * 40)
    data = _line(request_id="a", timestamp=1.0, prompt=text, output_tokens=2) + _line(
        request_id="b",
        timestamp=2.0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        output_tokens=2,
    )
    rows = _parse(data, tokenizer=tok).rows
    vocab = json.loads(tok.read_text())["model"]["vocab"]
    assert rows["prompt_tokens"].to_list() == [41, 4]  # BOS + 40 words; BOS user : hello
    ids = [vocab["<s>"]] + [vocab["s"]] * 40
    assert rows["prefix_hashes"][0].to_list() == prefix_hashes(ids).tolist()
    assert "s s s" not in str(rows.to_dicts())


def test_sniff() -> None:
    assert token_ids.sniff(b'{"request_id": "a", "prompt_token_ids": [1, 2')
    assert token_ids.sniff(b'\n{"timestamp": 1.0, "prompt": "hi"}\n')
    assert token_ids.sniff(b'{"timestamp": 1.0, "messages": [{"role": "user"}]}')
    assert not token_ids.sniff(b'{"timestamp": 0, "input_length": 5, "hash_ids": [0]}')
    assert not token_ids.sniff(b'{"startTime": "x", "prompt_tokens": 5, "prompt": "hi"}')
    assert not token_ids.sniff(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
    assert not token_ids.sniff(b"")


def test_the_sample_file() -> None:
    data = read_sample(SAMPLES_DIR / "token_ids.jsonl")
    p = _parse(data)
    assert p.rejects.height == 0
    rows = p.rows
    assert rows.height == 60
    _check_dtypes(rows)
    assert rows["arrival_time"].null_count() == 0
    assert rows["output_tokens"].null_count() == 0
    # records of one tenant share their system prompt: equal first hash
    firsts = (
        rows.filter(pl.col("prefix_hashes").list.len() > 0)
        .group_by("tenant")
        .agg(pl.col("prefix_hashes").list.first().n_unique().alias("n"))
    )
    assert firsts["n"].to_list() == [1] * firsts.height
    # the salted tenant shares no block with the others
    salted = set(rows.filter(pl.col("tenant") == "team-c")["prefix_hashes"].explode().to_list())
    others = set(rows.filter(pl.col("tenant") != "team-c")["prefix_hashes"].explode().to_list())
    assert salted and not salted & others
    # the records that log their output token ids (every other one) have the hashes of
    # their generated blocks, chained on from the prompt's, salt and all
    records = [json.loads(x) for x in data.splitlines()]
    for rec, got in zip(records, rows["output_hashes"].to_list(), strict=True):
        if "output_token_ids" not in rec:
            assert got is None
            continue
        ids = rec["prompt_token_ids"] + rec["output_token_ids"]
        whole = prefix_hashes(ids, cache_salt=rec.get("cache_salt", "")).tolist()
        assert got == whole[len(rec["prompt_token_ids"]) // 16 :]
    assert rows["output_hashes"].null_count() == 30
