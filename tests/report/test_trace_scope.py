"""Which requests the trace overview counts: the whole warehouse when the run read every
request (no semi-join with sim_requests), else the requests the run replayed."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.report import _read_whole_warehouse, build_report
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse


def _inputs(wh: Warehouse) -> list[str]:
    return [
        str(p)
        for p in sorted((wh.root / "requests").glob("date=*/*.parquet"))
        if p.name != "_empty.parquet"
    ]


def test_a_run_that_read_every_request_is_the_whole_warehouse(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.init()
    (wh.root / "requests" / "date=2024-05-01").mkdir(parents=True, exist_ok=True)
    part = wh.root / "requests" / "date=2024-05-01" / "src-a.parquet"
    part.write_bytes(b"")
    row = {"rows_read": 5, "inputs": json.dumps([str(part)])}
    assert _read_whole_warehouse(row, 5, wh)
    # fewer rows (a filter, a day range): the semi-join decides
    assert not _read_whole_warehouse({**row, "rows_read": 4}, 5, wh)
    # a --requests file outside the warehouse may hold other requests
    assert not _read_whole_warehouse({**row, "inputs": json.dumps(["/elsewhere/x.parquet"])}, 5, wh)
    assert not _read_whole_warehouse({**row, "inputs": "[]"}, 5, wh)
    assert not _read_whole_warehouse({**row, "inputs": "not json"}, 5, wh)
    assert not _read_whole_warehouse(row, 0, wh)
    # a warehouse moved elsewhere still matches by the path inside it
    moved = {**row, "inputs": json.dumps([f"/old/place/requests/date=2024-05-01/{part.name}"])}
    assert _read_whole_warehouse(moved, 5, wh)


def test_replayed_report_counts_the_whole_warehouse(replayed_warehouse: Warehouse) -> None:
    con = replayed_warehouse.connect()
    try:
        run = query(con, "replay_runs").to_dicts()[0]
        total = query(con, "trace_summary")["num_requests"][0]
        replayed = query(con, "trace_summary", run_id=run["run_id"])["num_requests"][0]
    finally:
        con.close()
    assert run["rows_read"] == total and set(json.loads(run["inputs"])) == set(
        _inputs(replayed_warehouse)
    )
    assert replayed <= total  # requests dropped as too long are read, not replayed
    html = build_report(replayed_warehouse).read_text()
    assert "every request in the warehouse" in html
    assert f"{total:,} (" in html


def test_tiny_report_counts_the_replayed_requests(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    # the tiny warehouse's runs rows read 0 rows: the semi-join with sim_requests decides
    html = build_report(tiny_warehouse, output=tmp_path / "r.html").read_text()
    assert "the requests this run replayed" in html
    assert "4 (" in html
