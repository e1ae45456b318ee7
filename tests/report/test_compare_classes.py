"""compare per class: each tenant's and model's TTFT and TPOT in both runs, worked by hand.

R4 replays vllm-2 again, t1's requests slower: r1 and r3 (tenant t1) TTFT 0.3 and 0.7 s
against R2's 0.1 and 0.3 s; r2 (t2) and r4 (no tenant) as in R2.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.compare import class_changes, compare_runs, comparison_dict, format_comparison
from pipeline.contracts import SCENARIOS, SIM_REQUESTS
from pipeline.warehouse import Warehouse
from tests.helpers import R2, build, config, sim_rows, table, write_run

R4 = "20240504T000000Z-dddd"


@pytest.fixture(scope="module")
def slower_t1(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = build(tmp_path_factory.mktemp("cmpcls") / "wh")
    rows = sim_rows("vllm-2", [0.0, 1.0, 2.0, 3.0], [0.3, 0.2, 0.7, 0.5], [1.0, 2.0, 3.0, 5.0],
                    [0] * 4, [0] * 4)  # fmt: skip
    wh.write(SIM_REQUESTS, table(SIM_REQUESTS, rows), {"run_id": R4}, "vllm-2")
    meta = [{"scenario": "vllm-2", "policy": "vllm", "replicas": 2, "profile": "tiny",
             "config_json": config("vllm-2", "vllm", 2), "summary_json": "{}"}]  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": R4}, "scenarios")
    write_run(wh, R4, 4)
    return wh


def _row(classes, kind: str, name: str, metric: str) -> dict:  # type: ignore[no-untyped-def]
    (row,) = [
        r for r in classes.filter(classes["scenario"] == "vllm-2").to_dicts()
        if (r["class_kind"], r["class_name"], r["metric"]) == (kind, name, metric)
    ]  # fmt: skip
    return row  # type: ignore[no-any-return]


def test_per_tenant_ttft_changes_by_hand(slower_t1: Warehouse) -> None:
    df = compare_runs(slower_t1, R2, R4)
    classes = class_changes(slower_t1, df)
    t1 = _row(classes, "tenant", "t1", "p99_ttft_s")
    # two values a, b: p99 = a + 0.99 (b - a)
    assert t1["value_a"] == pytest.approx(0.1 + 0.99 * 0.2)
    assert t1["value_b"] == pytest.approx(0.3 + 0.99 * 0.4)
    assert t1["change"] == pytest.approx(t1["value_b"] - t1["value_a"])
    assert t1["relative_change"] == pytest.approx(t1["change"] / t1["value_a"])
    assert _row(classes, "tenant", "t2", "p99_ttft_s")["change"] == 0.0
    assert _row(classes, "tenant", "(none)", "num_requests")["value_b"] == 1.0
    m_a = _row(classes, "model", "m-a", "p50_ttft_s")  # r1, r2: 0.15 in A, 0.25 in B
    assert (m_a["value_a"], m_a["value_b"]) == (pytest.approx(0.15), pytest.approx(0.25))
    # a scenario only in A: its classes with B missing
    static = classes.filter(classes["scenario"] == "static-4")
    assert static.height and static["value_b"].is_null().all()
    text = format_comparison(df, classes=classes)
    part = text.split("\nvllm-2")[1].split("\nvllm-4")[0]
    assert "  per tenant:" in part and "  per model:" in part
    (line,) = [x for x in part.splitlines() if x.split()[:3] == ["t1", "p99", "TTFT"]]
    assert "+398 ms" in line and "worse" in line


def test_one_class_per_kind_gives_no_rows(slower_t1: Warehouse) -> None:
    # R1's 'old' replays r1 alone: one tenant, one model
    from tests.helpers import R1

    df = compare_runs(slower_t1, R1, R1)
    assert class_changes(slower_t1, df).is_empty()
    assert comparison_dict(df)["scenarios"]["old"]["classes"] == {}


def test_compare_json_holds_the_classes(slower_t1: Warehouse) -> None:
    r = CliRunner().invoke(cli, ["compare", R2, R4, "--warehouse", str(slower_t1.root), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    t1 = out["scenarios"]["vllm-2"]["classes"]["tenant"]["t1"]
    assert set(t1) == {"num_requests", "p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "p50_tpot_s",
                       "p99_tpot_s"}  # fmt: skip
    assert set(t1["p99_ttft_s"]) == {"a", "b", "change", "relative_change"}
    assert t1["p99_ttft_s"]["change"] == pytest.approx(0.398)
