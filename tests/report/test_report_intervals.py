"""The report draws the intervals: latency percentiles and capacity probes with error bars,
the answers' intervals in a table, from the sql/ files; old runs without them still build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.report import build_report
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import specs


def _encodes(spec: dict[str, Any], channel: str, field: str) -> bool:
    """Whether some layer of ``spec`` encodes ``field`` on ``channel`` (x2, y2, ...)."""
    text = json.dumps(spec)
    return f'"{channel}": {{"field": "{field}"' in text or f'"{channel}": "{field}' in text


def _validate(all_specs: dict[str, Any]) -> None:
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema import load_schema

    schema = load_schema()
    for element_id, spec in all_specs.items():
        error = validate_jsonschema(spec, schema, raise_error=False)
        assert error is None, f"{element_id}: {error.message if error else ''}"


def _chart(all_specs: dict[str, Any], title: str) -> dict[str, Any]:
    (spec,) = [s for s in all_specs.values() if title in str(s.get("title"))]
    return spec


def test_latency_percentiles_are_drawn_with_their_intervals(
    replayed_warehouse: Warehouse, tmp_path: Path
) -> None:
    df = query(replayed_warehouse.connect(), "latency_percentiles")
    assert df.height and df["p99_ttft_lo_s"].null_count() == 0
    assert (df["p99_ttft_lo_s"] <= df["p99_ttft_s"]).all()
    assert (df["p99_ttft_s"] <= df["p99_ttft_hi_s"]).all()
    all_specs = specs(build_report(replayed_warehouse, output=tmp_path / "r.html").read_text())
    _validate(all_specs)
    chart = _chart(all_specs, "each with its 90% interval")
    assert _encodes(chart, "x2", "hi_s")  # a bar from each interval's low to its high end
    cap = _chart(all_specs, "p99 TTFT against the concurrency cap")
    assert _encodes(cap, "y2", "p99_ttft_hi_s")


def test_capacity_probes_and_answers_carry_their_intervals(
    sweep_warehouse: tuple[Warehouse, str, str, str], tmp_path: Path
) -> None:
    wh, _, cap_id, none_id = sweep_warehouse
    html = build_report(wh, cap_id, output=tmp_path / "c.html").read_text()
    all_specs = specs(html)
    _validate(all_specs)
    probes = _chart(all_specs, "Every probe of each search")
    assert _encodes(probes, "y2", "share_hi")  # error bars
    assert _encodes(probes, "x2", "answer_hi")  # the band of the answer's interval
    assert "How sure each answer is: its 90% interval" in html and "safe at 90%" in html
    answers = query(wh.connect(), "capacity_answers", run_id=cap_id)
    assert answers["interval_level"].drop_nulls().to_list()  # at least one answered
    # a search that found nothing has no interval; the report says so
    none = build_report(wh, none_id, output=tmp_path / "n.html").read_text()
    assert "No interval: the searches ran with --no-intervals, or found no answer." in none


@pytest.fixture
def old_copy(replayed_warehouse: Warehouse, tmp_path: Path) -> Warehouse:
    """The replayed warehouse with its summaries stripped of intervals (as before them)."""
    import json
    import shutil

    import pyarrow.parquet as pq

    from pipeline.contracts import SCENARIOS, write_table

    root = tmp_path / "old"
    shutil.copytree(replayed_warehouse.root, root)
    wh = Warehouse(root)
    for path in wh.files(SCENARIOS):
        table = pq.read_table(path)
        summaries = [json.loads(s) for s in table.column("summary_json").to_pylist()]
        for s in summaries:
            s.pop("intervals", None)
        col = table.schema.get_field_index("summary_json")
        table = table.set_column(col, "summary_json", [[json.dumps(s) for s in summaries]])
        write_table(table.drop_columns(["run_id"]) if "run_id" in table.column_names else table,
                    SCENARIOS, path)  # fmt: skip
    return wh


def test_a_run_without_intervals_still_reports(old_copy: Warehouse, tmp_path: Path) -> None:
    df = query(old_copy.connect(), "latency_percentiles")
    assert df.height and df["p99_ttft_lo_s"].null_count() == df.height
    html = build_report(old_copy, output=tmp_path / "o.html").read_text()
    assert "No scenario of this run carries intervals" in html


def test_the_probe_table_is_in_the_order_each_search_ran_its_probes(
    sweep_warehouse: tuple[Warehouse, str, str, str], tmp_path: Path
) -> None:
    import re

    wh, _, cap_id, _ = sweep_warehouse
    con = wh.connect()
    try:
        df = query(con, "capacity_search", run_id=cap_id)
    finally:
        con.close()
    for search in ("concurrency", "rate", "replicas"):
        probes = df.filter(df["search"] == search)["probe"].to_list()
        assert probes == sorted(probes) and len(set(probes)) > 2, search
    # the rate search bisects: the order it ran its probes in is not their values' order
    values = df.filter((df["search"] == "rate") & (df["probe_role"] == "search"))
    assert values["value"].to_list() != sorted(values["value"].to_list())
    page = build_report(wh, cap_id, output=tmp_path / "cap.html").read_text()
    table = page[page.index("Probes, in the order each search ran them") :]
    table = table[: table.index("</table>")]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in table.split("<tr>")[2:]]
    shown = [(c[0], int(c[1])) for c in cells if c]
    assert shown == sorted(
        shown, key=lambda r: (("concurrency", "rate", "replicas").index(r[0]), r[1])
    )
