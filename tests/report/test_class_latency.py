"""The class_latency view over the tiny warehouse of conftest.py, worked out by hand.

R2's vllm-2 replays r1..r4 with TTFT 0.1 0.2 0.3 0.5 and E2E 1 1 1 2; r1 and r3 are
tenant t1 (model m-a and m-b), r2 tenant t2 (m-a), r4 has neither: the class '(none)'.
Linear percentiles over two sorted values a, b: the q-quantile is a + q (b - a).
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from pipeline.contracts import RUNS, SIM_REQUESTS
from pipeline.errors import UnknownQueryError
from pipeline.report.sql import available, load_query
from pipeline.warehouse import SQL_DIR, VIEWS_SQL, Warehouse, load_sql
from tests.helpers import R2, sim_rows, table

COLUMNS = [
    "run_id", "scenario", "class_kind", "class_name", "requests", "completed",
    *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e", "queue") for q in (50, 90, 99)),
]  # fmt: skip


def _rows(con: duckdb.DuckDBPyConnection, where: str) -> list[dict[str, Any]]:
    df = con.sql(f"SELECT * FROM class_latency WHERE {where} ORDER BY class_kind, class_name").pl()
    return df.to_dicts()


def test_columns_are_the_header_s_and_the_documented_ones(tiny_warehouse: Warehouse) -> None:
    con = tiny_warehouse.connect()
    cols = [r[0] for r in con.execute("DESCRIBE class_latency").fetchall()]
    assert cols == COLUMNS
    header = (SQL_DIR / "class_latency.sql").read_text()
    for c in COLUMNS:
        assert re.search(rf"\b{c}\b", header), c


def test_per_tenant_and_model_percentiles_by_hand(tiny_warehouse: Warehouse) -> None:
    rows = _rows(tiny_warehouse.connect(), f"run_id = '{R2}' AND scenario = 'vllm-2'")
    got = {(r["class_kind"], r["class_name"]): r for r in rows}
    assert sorted(got) == [
        ("model", "(none)"), ("model", "m-a"), ("model", "m-b"),
        ("tenant", "(none)"), ("tenant", "t1"), ("tenant", "t2"),
    ]  # fmt: skip
    t1 = got[("tenant", "t1")]  # r1, r3: TTFT 0.1, 0.3; E2E 1.0, 1.0
    assert (t1["requests"], t1["completed"]) == (2, 2)
    assert t1["ttft_p50_s"] == pytest.approx(0.2)
    assert t1["ttft_p90_s"] == pytest.approx(0.1 + 0.9 * 0.2)
    assert t1["ttft_p99_s"] == pytest.approx(0.1 + 0.99 * 0.2)
    assert t1["e2e_p99_s"] == pytest.approx(1.0)
    # TPOT: r1 (1.0 - 0.1) / 9, r3 (1.0 - 0.3) / 4
    lo, hi = sorted([0.9 / 9, 0.7 / 4])
    assert t1["tpot_p90_s"] == pytest.approx(lo + 0.9 * (hi - lo))
    none = got[("tenant", "(none)")]  # r4 alone: one output token, so no TPOT
    assert (none["requests"], none["ttft_p50_s"], none["tpot_p50_s"]) == (1, 0.5, None)
    m_a = got[("model", "m-a")]  # r1, r2: TTFT 0.1, 0.2
    assert m_a["ttft_p99_s"] == pytest.approx(0.1 + 0.99 * 0.1)
    # every request is in one class of each kind
    for kind in ("tenant", "model"):
        assert sum(r["requests"] for r in rows if r["class_kind"] == kind) == 4


def test_a_drawn_copy_finds_its_request_and_an_unfinished_one_is_not_completed(
    tmp_path: object, tiny_warehouse: Warehouse
) -> None:
    import shutil
    from pathlib import Path

    root = Path(str(tmp_path)) / "wh"
    shutil.copytree(tiny_warehouse.root, root)
    wh = Warehouse(root)
    rid = "20240503T000000Z-cccc"
    rows = sim_rows("drawn", [0.0, 1.0, 2.0, 3.0], [0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0],
                    [0] * 4, [0] * 4)  # fmt: skip
    rows[0]["request_id"] = "r1#0"
    rows[1]["request_id"] = "r1#1"
    rows[3]["finished_s"] = float("nan")  # r4 never finished
    wh.write(SIM_REQUESTS, table(SIM_REQUESTS, rows), {"run_id": rid}, "drawn")
    run = pa.Table.from_pylist(
        [{**r, "run_id": rid} for r in wh.connect().sql("FROM runs LIMIT 1").pl().to_dicts()],
        schema=pa.schema([(n, t) for n, t in RUNS.columns]),
    )
    wh.write(RUNS, run, {}, rid)
    got = {(r["class_kind"], r["class_name"]): r for r in _rows(wh.connect(), f"run_id = '{rid}'")}
    # r1#0, r1#1 and r3 are t1; r2 is t2; the unfinished r4 counts as replayed only
    assert got[("tenant", "t1")]["requests"] == 3
    assert got[("tenant", "t1")]["ttft_p50_s"] == pytest.approx(0.2)
    assert (got[("tenant", "(none)")]["requests"], got[("tenant", "(none)")]["completed"]) == (
        1,
        0,
    )
    assert got[("tenant", "(none)")]["ttft_p99_s"] is None


def test_pastes_into_the_duckdb_shell_after_views_sql(tiny_warehouse: Warehouse) -> None:
    con = duckdb.connect()
    con.execute(f"SET file_search_path = '{tiny_warehouse.root.resolve()}'")
    con.execute(load_sql(VIEWS_SQL))
    con.execute((SQL_DIR / "class_latency.sql").read_text())
    q = "SELECT * FROM class_latency ORDER BY ALL"
    assert con.execute(q).fetchall() == tiny_warehouse.connect().execute(q).fetchall()


def test_is_a_view_not_a_query() -> None:
    assert "class_latency" not in available()
    with pytest.raises(UnknownQueryError, match="is a view, not a query: SELECT"):
        load_query("class_latency")
