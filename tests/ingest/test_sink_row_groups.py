"""Buffered row groups: every kept row lands once, in order, whatever the group size."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline.ingest import IngestOptions, ingest_logs, sink
from pipeline.samples import write_gateway_log
from pipeline.warehouse import Warehouse


@pytest.mark.parametrize("group_rows", [7, 1 << 16])
def test_every_kept_row_lands_once_across_days_and_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_rows: int
) -> None:
    log = tmp_path / "gw.jsonl"
    # 0.002 requests a second: 400 records over about two and a half days
    write_gateway_log(log, 400, seed=3, bad_fraction=0.05, rate=0.002, compact=True)
    monkeypatch.setattr(sink, "ROW_GROUP_ROWS", group_rows)
    wh = Warehouse(tmp_path / "wh")
    res = ingest_logs([str(log)], wh, IngestOptions(quiet=True, block_bytes=4096))
    assert res.ok
    d = res.to_dict()
    files = wh.files(sink.REQUESTS)
    assert len(files) >= 3  # one per day
    rows = pl.concat([pl.read_parquet(f) for f in files])
    assert rows.height == d["rows_kept"] == rows["request_id"].n_unique()
    assert rows["source_line"].n_unique() == rows.height
    groups = []
    for f in files:
        lines = pl.read_parquet(f)["source_line"]
        assert lines.is_sorted()  # a time-ordered log: blocks land in order
        groups.append(pq.ParquetFile(f).metadata.num_row_groups)
    if group_rows == 7:
        assert max(groups) > 1  # several flushes a day
    else:
        assert groups == [1] * len(files)  # each day buffered to the end
