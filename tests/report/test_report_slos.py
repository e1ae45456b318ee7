"""The report judges by the SLOs it was given (or the run's), scoped ones too, and says so:
the header, a rule per SLO on the TTFT charts, goodput; with none, it says there is none
and names the 200 ms line an example wherever it appears."""

from __future__ import annotations

import html as htmllib
import json
import re
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.report import build_report
from pipeline.report.slos import ReportSlos, resolve
from pipeline.warehouse import Warehouse
from tests.helpers import specs

SCOPED = ["ttft_p99<=2s", "ttft_p99@tenant=t1<=500ms", "tpot_p90@tenant=t1<=40ms"]


def test_none_given_says_so_and_the_200ms_line_is_an_example() -> None:
    slos = resolve(None, None)
    assert slos.is_example and slos.slos == ()
    assert slos.describe().startswith("none given")
    assert slos.texts() == ["ttft_p99<=200ms"]  # what goodput and the sweeps judge
    (line,) = slos.lines("ttft", ("p99",))
    assert line.limit_s == 0.2 and "example" in line.label
    assert "example" in slos.goodput_basis()


def test_an_unscoped_slo_given_is_the_one_drawn_and_named() -> None:
    slos = resolve(["ttft_p99<=500ms"], json.dumps(["ttft_p99<=2s"]))  # given wins
    assert slos.source == "given" and not slos.is_example
    assert slos.describe() == "ttft_p99 <= 500ms (given to the report (--slo))"
    assert [(x.limit_s, x.label) for x in slos.lines("ttft")] == [(0.5, "ttft_p99 <= 500ms")]
    assert "example" not in slos.goodput_basis()


def test_scoped_slos_each_get_a_rule_named_with_their_scope() -> None:
    slos = resolve(SCOPED, None)
    assert [x.label for x in slos.lines("ttft", ("p99",))] == [
        "ttft_p99 <= 2s",
        "ttft_p99 of tenant=t1 <= 500ms",
    ]
    assert [x.label for x in slos.lines("tpot")] == ["tpot_p90 of tenant=t1 <= 40ms"]
    assert slos.lines("ttft", ("p50",)) == ()  # no p50 SLO: a p50 line gets no rule
    assert "tenant=t1" in slos.describe()


def test_the_runs_own_slos_when_none_is_given() -> None:
    slos = resolve([], json.dumps(["ttft_p99@tenant=chat<=300ms"]))
    assert slos.source == "run" and "the run's own" in slos.describe()
    # a runs row written by hand that does not parse counts as none
    assert resolve(None, "not json").is_example
    assert resolve(None, json.dumps(["ttft_p99 about 2s"])).is_example


def test_bad_slo_input_is_refused_with_the_flag_named() -> None:
    with pytest.raises(ConfigError, match="not both"):
        resolve(["ttft_p99<=1s"], None, slo_ttft_s=0.3)
    with pytest.raises(ConfigError, match=r"--slo: 'ttft_p99=1s': expected KEY<=LIMIT"):
        resolve(["ttft_p99=1s"], None)
    with pytest.raises(ConfigError, match="ttft_p99 is given twice"):
        resolve(["ttft_p99<=1s", "ttft_p99<=2s"], None)


def _header(page: str) -> str:
    m = re.search(r'<dd id="slos"[^>]*>(.*?)</dd>', page, re.S)
    assert m, "no SLOs line in the header"
    return htmllib.unescape(m.group(1))


def _rule_labels(spec: dict) -> list[str]:  # type: ignore[type-arg]
    """The text of every SLO label a chart spec draws (marks of type text with a value)."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            mark = node.get("mark")
            kind = mark.get("type") if isinstance(mark, dict) else mark
            if kind == "text" and isinstance(mark, dict) and "text" in mark:
                found.append(mark["text"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    return found


def test_the_report_page_uses_the_slos_given(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    none = build_report(tiny_warehouse, output=tmp_path / "none.html").read_text()
    given = build_report(tiny_warehouse, output=tmp_path / "given.html", slos=SCOPED).read_text()
    assert _header(none).startswith("none given")
    assert "TTFT SLO 200" not in none and "200.0 ms (p99)" not in none
    head = _header(given)
    assert "ttft_p99 <= 2s" in head and "ttft_p99 of tenant=t1 <= 500ms" in head
    assert "200ms" not in head and "example" not in head
    # p99 TTFT against the cap: a rule per p99 TTFT SLO, scoped too; the TPOT CDF the TPOT one
    assert _rule_labels(specs(given)["chart-queueing-2"]) == [
        "ttft_p99 <= 2s",
        "ttft_p99 of tenant=t1 <= 500ms",
    ]
    assert _rule_labels(specs(given)["chart-latency-2"]) == ["tpot_p90 of tenant=t1 <= 40ms"]
    assert _rule_labels(specs(none)["chart-queueing-2"]) == [
        "ttft_p99 <= 200ms (example: no SLO given)"
    ]
    # goodput is judged by them: the metric definitions say which
    assert "ttft_p99 of tenant=t1 &lt;= 500ms" in given.split('id="metrics"')[1][:3000]


def test_the_deprecated_objective_is_an_unscoped_p99_slo() -> None:
    slos = resolve(None, None, slo_ttft_s=0.25)
    assert slos == ReportSlos(slos.slos, "given")
    assert [x.label for x in slos.lines("ttft")] == ["ttft_p99 <= 250ms"]


def test_per_class_tables_and_panels_judge_each_class_by_its_slos(
    tiny_warehouse: Warehouse, tmp_path: Path
) -> None:
    page = build_report(tiny_warehouse, output=tmp_path / "c.html", slos=SCOPED).read_text()
    section = page[page.index('<section id="classes">') :]
    section = section[: section.index("</section>")]
    # a table per class, each titled with it
    for name in ("tenant=t1", "tenant=t2", "tenant=(none)", "model=m-a", "model=m-b"):
        assert f"<b>{name}</b>" in section
    # one panel per class; the scoped SLO's rule only in its own class's panel
    rows = specs(page)["chart-classes-1"]["data"]["values"]
    rules = {(r["class_label"], r["slo_label"]) for r in rows if r["layer"] == "rule"}
    assert ("tenant=t1", "ttft_p99 of tenant=t1 <= 500ms") in rules
    assert ("tenant=t2", "ttft_p99 <= 2s") in rules
    assert not [r for r in rules if r[0] != "tenant=t1" and "tenant=t1" in r[1]]


def test_legends_label_scenarios_as_run_scenarios_sql_does(tiny_warehouse: Warehouse) -> None:
    from pipeline.report import _layout
    from pipeline.report.sql import query

    rows = query(tiny_warehouse.connect(), "run_scenarios")
    layout = _layout(rows)
    assert {r["scenario"]: r["label"] for r in rows.to_dicts()} == {
        n: layout.label(n) for n in layout.scenarios
    }
