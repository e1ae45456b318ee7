"""Bad input: every good row lands, every bad one is quarantined, counts reconcile."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import zstandard
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import Warehouse


def _rec(i: int, **over: object) -> dict[str, object]:
    r: dict[str, object] = {
        "request_id": f"chatcmpl-{i:06d}",
        "startTime": f"2024-05-01T00:{i // 60 % 60:02d}:{i % 60:02d}.250000Z",
        "endTime": f"2024-05-01T00:{i // 60 % 60:02d}:{i % 60:02d}.950000Z",
        "completionStartTime": f"2024-05-01T00:{i // 60 % 60:02d}:{i % 60:02d}.400000Z",
        "prompt_tokens": 100 + i,
        "completion_tokens": 20 + i % 7,
        "model": "llama-3-8b-instruct",
        "team_id": "team-a" if i % 2 else "team-b",
        "status": "success",
        "metadata": {"usage_object": {"prompt_tokens_details": {"cached_tokens": i % 50}}},
        "messages": [{"role": "user", "content": "secret prompt text"}],
    }
    r.update(over)
    return r


def _line(r: dict[str, object]) -> bytes:
    return json.dumps(r).encode() + b"\n"


def make_bad_log(path: Path) -> tuple[int, dict[int, str]]:
    """Write a gateway log; return (number of good records, {line: expected reason prefix})."""
    lines: list[bytes] = []
    bad: dict[int, str] = {}
    good = 0
    for i in range(400):
        n = len(lines) + 1
        kind = i % 50
        if kind == 7:
            lines.append(_line(_rec(i))[:-40] + b"\n")  # cut short
            bad[n] = "not valid JSON"
        elif kind == 13:
            lines.append(_line(_rec(i, completion_tokens=-3)))
            bad[n] = "negative output token count -3"
        elif kind == 21:
            r = _rec(i)
            del r["prompt_tokens"]
            lines.append(_line(r))
            bad[n] = "missing or non-integer prompt token count"
        elif kind == 29:
            lines.append(_line(_rec(i, startTime="yesterday at noon")))
            bad[n] = "missing or unparseable timestamp"
        elif kind == 33:
            lines.append(_line(_rec(i)).replace(b"team-", b"t\xff\xfeam-"))  # not UTF-8
            bad[n] = "invalid UTF-8"
        elif kind == 41:
            lines.append(_line(_rec(i, status="failure")))
            bad[n] = "status failure"
        elif kind == 45:
            lines.append(_line(_rec(i, prompt_tokens=12.5)))
            bad[n] = "missing or non-integer prompt token count"
        elif kind == 47:
            lines.append(b"\n")  # blank lines are not records
        else:
            lines.append(_line(_rec(i)))
            good += 1
    # duplicates: repeat two earlier good records, with other content
    lines.append(_line(_rec(1, prompt_tokens=999)))
    lines.append(_line(_rec(2)))
    # a final line cut short with no newline (the writer died)
    lines.append(_line(_rec(10_000))[:55])
    bad[len(lines)] = "not valid JSON"
    path.write_bytes(b"".join(lines))
    return good, bad


@pytest.mark.parametrize("block_bytes", [256, 4096, 32 * 1024 * 1024])
def test_bad_records_are_quarantined_and_counts_reconcile(tmp_path: Path, block_bytes: int) -> None:
    log = tmp_path / "gateway.jsonl"
    good, bad = make_bad_log(log)
    wh = Warehouse(tmp_path / "wh")
    res = ingest_logs([str(log)], wh, IngestOptions(block_bytes=block_bytes))
    f = res.files[0]
    assert f.error is None and f.format == "gateway"
    assert f.rows_kept == good
    assert f.rows_quarantined == len(bad)
    assert f.rows_duplicate == 2
    assert f.rows_read == f.rows_kept + f.rows_quarantined + f.rows_duplicate
    con = wh.connect()
    q = con.sql("SELECT source_line, reason, raw_excerpt FROM quarantine ORDER BY 1").pl()
    assert q["source_line"].to_list() == sorted(bad)
    for line, reason in zip(q["source_line"], q["reason"], strict=True):
        assert reason.startswith(bad[line]), (line, reason)
    assert q["raw_excerpt"].null_count() == q.height  # gateway logs may hold prompt text
    kept = con.sql("SELECT * FROM requests").pl()
    assert kept["request_id"].n_unique() == good
    # the first occurrence of a duplicated id is the one kept
    assert kept.filter(pl.col("request_id") == "chatcmpl-000001")["prompt_tokens"].item() == 101
    row = kept.filter(pl.col("request_id") == "chatcmpl-000003").row(0, named=True)
    assert row["observed_ttft_s"] == pytest.approx(0.15)
    assert row["observed_e2e_s"] == pytest.approx(0.7)
    assert row["cached_tokens"] == 3 and row["tenant"] == "team-a"
    # prompt text never reaches the warehouse
    for path in (tmp_path / "wh").rglob("*.parquet"):
        assert b"secret prompt text" not in path.read_bytes()


def test_rerun_changes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "gateway.jsonl"
    make_bad_log(log)
    wh = Warehouse(tmp_path / "wh")
    ingest_logs([str(log)], wh)
    con = wh.connect()
    before = (
        con.sql("FROM requests ORDER BY request_id").pl(),
        con.sql("SELECT * EXCLUDE (run_id) FROM quarantine ORDER BY source_line").pl(),
    )
    res = ingest_logs([str(log)], wh)
    con = wh.connect()
    after = (
        con.sql("FROM requests ORDER BY request_id").pl(),
        con.sql("SELECT * EXCLUDE (run_id) FROM quarantine ORDER BY source_line").pl(),
    )
    assert before[0].equals(after[0]) and before[1].equals(after[1])
    assert res.files[0].rows_duplicate == 2  # only the in-file repeats


def test_csv_wrong_field_counts_and_negative_values(tmp_path: Path) -> None:
    log = tmp_path / "azure.csv"
    log.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2023-11-16 18:15:46.6805900,374,44\r\n"
        b"2023-11-16 18:15:47.0000000,12\r\n"
        b"2023-11-16 18:15:48.0000000,-5,10\r\n"
        b"not a time,10,10\r\n"
        b"2023-11-16 18:15:49.0000000,20,3,7\r\n"
        b"2023-11-16 18:15:50.5000000,30,abc\r\n"
        b"2023-11-16 18:15:51.5000000,40,4"
    )
    wh = Warehouse(tmp_path / "wh")
    f = ingest_logs([str(log)], wh).files[0]
    assert (f.rows_read, f.rows_kept, f.rows_quarantined) == (7, 2, 5)
    q = wh.connect().sql("SELECT source_line, reason, raw_excerpt FROM quarantine ORDER BY 1").pl()
    assert q["source_line"].to_list() == [3, 4, 5, 6, 7]
    assert q["reason"][0] == "2 fields, expected 3"
    assert q["reason"][1] == "negative prompt token count -5"
    assert q["reason"][2] == "missing or unparseable timestamp"
    assert q["raw_excerpt"][1] == "2023-11-16 18:15:48.0000000,-5,10"


def test_file_level_problems_fail_alone(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl.zst"
    body = b"".join(_line(_rec(i)) for i in range(20))
    good.write_bytes(zstandard.ZstdCompressor().compress(body))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(body * 50)[:-200])
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes("TIMESTAMP,ContextTokens,GeneratedTokens\n".encode("utf-16"))
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello\nworld\n")
    wh = Warehouse(tmp_path / "wh")
    runner = CliRunner()
    r = runner.invoke(
        cli, ["ingest", str(good), str(cut), str(utf16), str(unknown), "--warehouse", str(wh.root)]
    )
    assert r.exit_code == 1
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 3
    assert any("cut.jsonl.gz" in e and "truncated" in e for e in errors)
    assert any("utf16.csv" in e and "UTF-16" in e for e in errors)
    assert any("notes.txt" in e and "--log-format" in e for e in errors)
    n = wh.connect().execute("SELECT count(*) FROM requests").fetchone()
    assert n == (20,)  # the good (zstd) file still landed
    status = wh.connect().execute("SELECT status FROM runs").fetchone()
    assert status == ("partial",)


def test_missing_path_is_one_line_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli, ["ingest", str(tmp_path / "nope-*.jsonl"), "--warehouse", str(tmp_path / "wh")]
    )
    assert r.exit_code == 1
    assert "no such file" in r.output and len(r.output.strip().splitlines()) == 1


def test_forced_unknown_format_lists_choices(tmp_path: Path) -> None:
    log = tmp_path / "x.jsonl"
    log.write_text("{}\n")
    r = CliRunner().invoke(cli, ["ingest", str(log), "--log-format", "nope"])
    assert r.exit_code == 2 and "azure" in r.output


def test_unordered_log_gets_arrival_s_from_its_earliest_record(tmp_path: Path) -> None:
    log = tmp_path / "gateway.jsonl"
    recs = [_rec(i) for i in range(40)]
    log.write_bytes(b"".join(_line(r) for r in recs[20:] + recs[:20]))  # later half first
    wh = Warehouse(tmp_path / "wh")
    ingest_logs([str(log)], wh, IngestOptions(block_bytes=2048))
    got = wh.connect().sql("SELECT request_id, arrival_s FROM requests ORDER BY request_id").pl()
    assert got["arrival_s"].to_list() == [float(i) for i in range(40)]


def test_generated_bad_log_reconciles_line_by_line(tmp_path: Path) -> None:
    from tests.gateway_logs import write_gateway_log

    log = write_gateway_log(tmp_path / "g.jsonl", 3000, seed=3, bad_fraction=0.05, compact=True)
    wh = Warehouse(tmp_path / "wh")
    f = ingest_logs([str(log.path)], wh, IngestOptions(block_bytes=64 * 1024)).files[0]
    dups = set(log.bad["duplicate_request_id"])
    rejected = {
        n for kind, lines in log.bad.items() if kind != "duplicate_request_id" for n in lines
    }
    q = wh.connect().sql("SELECT source_line FROM quarantine ORDER BY 1").pl()
    assert set(q["source_line"].to_list()) == rejected
    assert f.rows_duplicate == len(dups)
    assert f.rows_kept == 3000 - len(rejected) - len(dups)
