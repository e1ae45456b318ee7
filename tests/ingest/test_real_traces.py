"""Golden tests: the ingesters on the real public traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.ingest import ingest_logs
from pipeline.warehouse import Warehouse


def _requests(wh: Warehouse, fmt: str) -> pl.DataFrame:
    con = wh.connect()
    return con.sql(
        f"SELECT * FROM requests WHERE source_format = '{fmt}' ORDER BY source_line"
    ).pl()


def test_azure_conv_matches_splitwise_seconds_exactly(tmp_path: Path, traces_raw: Path) -> None:
    wh = Warehouse(tmp_path)
    res = ingest_logs([str(traces_raw / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv")], wh)
    assert res.ok and res.total("rows_kept") == 19_366
    got = _requests(wh, "azure")
    want = pl.read_csv(traces_raw / "vidur/splitwise_conv.csv")
    assert got.height == want.height == 19_366
    # exact float equality, row by row, in file order
    assert (got["arrival_s"] == want["arrived_at"]).all()
    assert (got["prompt_tokens"] == want["num_prefill_tokens"]).all()
    assert (got["output_tokens"] == want["num_decode_tokens"]).all()
    assert got["source_line"].to_list() == list(range(2, 19_368))
    assert got["prefix_hashes"].list.len().max() == 0  # no sharing is invented
    assert str(got["arrival_time"][0]) == "2023-11-16 18:15:46.680590+00:00"


def test_mooncake_conversation(tmp_path: Path, traces_raw: Path, golden) -> None:  # type: ignore[no-untyped-def]
    wh = Warehouse(tmp_path)
    res = ingest_logs([str(traces_raw / "mooncake/conversation_trace.jsonl")], wh)
    assert res.ok and res.total("rows_kept") == 12_031
    got = _requests(wh, "mooncake")
    assert got.height == 12_031
    n_blocks = (got["prompt_tokens"] + 511) // 512
    assert (got["prefix_hashes"].list.len() == n_blocks).all()
    assert (got["block_size"] == 512).all()
    assert got["request_id"].n_unique() == 12_031
    # every request shares block 0 (the common system prompt)
    assert (got["prefix_hashes"].list.first() == 0).all()
    summary = {
        "rows": got.height,
        "sum_prompt_tokens": int(got["prompt_tokens"].sum()),
        "sum_output_tokens": int(got["output_tokens"].sum()),
        "max_arrival_s": float(got["arrival_s"].max()),  # type: ignore[arg-type]
        "sum_hash_blocks": int(got["prefix_hashes"].list.len().sum()),
        "null_output_hashes": int(got["output_hashes"].null_count()),  # no output tokens
        "first_rows": got.head(5)
        .select("arrival_s", "prompt_tokens", "output_tokens", "prefix_hashes", "request_id")
        .to_dicts(),
    }
    golden("mooncake_conversation", summary)


def test_reingest_changes_nothing(tmp_path: Path, traces_raw: Path) -> None:
    wh = Warehouse(tmp_path)
    src = [str(traces_raw / "mooncake/conversation_trace.jsonl")]
    ingest_logs(src, wh)
    before = (
        wh.connect().sql("SELECT * EXCLUDE (source_file) FROM requests ORDER BY request_id").pl()
    )
    res = ingest_logs(src, wh)
    after = (
        wh.connect().sql("SELECT * EXCLUDE (source_file) FROM requests ORDER BY request_id").pl()
    )
    assert res.total("rows_kept") == 12_031
    assert before.equals(after)


def test_same_rows_from_another_file_are_duplicates(tmp_path: Path, traces_raw: Path) -> None:
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes((traces_raw / "mooncake/conversation_trace.jsonl").read_bytes())
    wh = Warehouse(tmp_path / "wh")
    ingest_logs([str(traces_raw / "mooncake/conversation_trace.jsonl")], wh)
    res = ingest_logs([str(copy)], wh)
    f = res.files[0]
    assert (f.rows_read, f.rows_kept, f.rows_duplicate) == (12_031, 0, 12_031)
    n = wh.connect().execute("SELECT count(*) FROM requests").fetchone()
    assert n == (12_031,)


def test_every_real_trace_with_requests_ingests(tmp_path: Path, traces_raw: Path) -> None:
    wh = Warehouse(tmp_path)
    res = ingest_logs(
        [
            str(traces_raw / "azure_llm_2023"),
            str(traces_raw / "mooncake"),
        ],
        wh,
    )
    assert res.ok
    assert res.total("rows_kept") == 19_366 + 12_031
