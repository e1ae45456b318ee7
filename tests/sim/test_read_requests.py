"""read_requests: arrival order (ties by request id) whether or not the files are in order."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contracts import REQUESTS, check_file, conform, read_table
from pipeline.selection import RequestFilter
from pipeline.sim.replay_input import read_requests
from pipeline.warehouse import Warehouse
from tests.helpers import requests_table


def _expected(table: pa.Table) -> pl.DataFrame:
    """The plain way: sort by (arrival, request id)."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df.sort(["arrival_time", "request_id"])


@pytest.mark.parametrize("order", ["sorted", "shuffled", "ties reversed"])
def test_rows_in_arrival_then_id_order(order: str, warehouse_with: Callable[..., Path]) -> None:
    n = 200
    rng = np.random.default_rng(3)
    gaps = rng.choice([0.0, 0.5, 1.0], size=n)  # many ties
    table = requests_table(rng.integers(1, 100, n), rng.integers(1, 50, n), gaps)
    if order == "shuffled":
        table = table.take(pa.array(rng.permutation(n)))
    elif order == "ties reversed":  # arrivals in order, equal ones by descending id
        df = _expected(table).sort(["arrival_time", "request_id"], descending=[False, True])
        table = df.to_arrow()
    wh = warehouse_with(table)
    got = read_requests(Warehouse(wh).files(REQUESTS))
    want = _expected(table)
    assert got["request_id"].to_list() == want["request_id"].to_list()
    assert got["prompt_tokens"].to_list() == want["prompt_tokens"].to_list()
    us = want["arrival_time"].dt.epoch("us").to_numpy()
    assert np.array_equal(got["arrival_s"].to_numpy(), (us - us[0]) / 1e6)


def test_files_of_several_days_out_of_order(tmp_path: Path) -> None:
    early = requests_table([5, 6], [1, 2], prefix="a")
    late = requests_table([7, 8], [3, 4], prefix="b")
    late = late.set_column(
        1, "arrival_time", pa.array([t.as_py().replace(day=2) for t in late["arrival_time"]],
                                    pa.timestamp("us", tz="UTC")))  # fmt: skip
    wh = Warehouse(tmp_path / "wh")
    wh.write(REQUESTS, late, {"date": "2024-05-02"}, "src-b")
    wh.write(REQUESTS, early, {"date": "2024-05-01"}, "src-a")
    files = sorted(wh.files(REQUESTS), reverse=True)  # the later day first
    got = read_requests(files)
    assert got["request_id"].to_list() == ["a000000", "a000001", "b000000", "b000001"]
    assert got["arrival_s"][0] == 0.0


def _write_old(wh: Warehouse, table: pa.Table, day: str, stem: str) -> Path:
    """A requests file as tracereplay wrote it before output_hashes existed."""
    old = conform(table, REQUESTS, stem).drop_columns(["output_hashes"])
    path = wh.partition_path(REQUESTS, {"date": day}, stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([f for f in REQUESTS.schema() if f.name != "output_hashes"],
                       metadata=REQUESTS.schema().metadata)  # fmt: skip
    pq.write_table(old.cast(schema), path)
    return path


@pytest.mark.parametrize("selected", [False, True])
def test_files_from_before_output_hashes_still_read(tmp_path: Path, selected: bool) -> None:
    wh = Warehouse(tmp_path / "wh")
    old = _write_old(wh, requests_table([5, 6], [1, 2], prefix="a"), "2024-05-01", "src-old")
    new = requests_table([7, 8], [3, 4], prefix="b", start=datetime(2024, 5, 2, tzinfo=UTC))
    new = new.append_column("output_hashes", pa.array([[11, 12], None], pa.list_(pa.uint64())))
    wh.write(REQUESTS, new, {"date": "2024-05-02"}, "src-new")
    files = wh.files(REQUESTS)
    assert len(files) == 2 and "output_hashes" not in pq.read_schema(old).names
    for path in files:
        check_file(path, REQUESTS)
    assert read_table(old, REQUESTS).column("output_hashes").null_count == 2
    selection = RequestFilter(where="prompt_tokens > 0") if selected else None
    got = read_requests(files, selection)
    assert got["request_id"].to_list() == ["a000000", "a000001", "b000000", "b000001"]
    assert got["output_hashes"].to_list() == [None, None, [11, 12], None]
    only_old = read_requests([old], selection)
    assert only_old["output_hashes"].to_list() == [None, None]
    con = wh.connect()
    assert con.execute("SELECT count(output_hashes) FROM requests").fetchone() == (1,)
