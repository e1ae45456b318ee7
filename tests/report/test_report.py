"""build_report: sections, offline HTML, escaping, no-data sections, PNGs, chart specs."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError, PipelineError
from pipeline.report import build_report, charts, load_definition, png_dir
from pipeline.report.charts.capacity import slo_capacity
from pipeline.report.charts.throughput import throughput
from pipeline.report.sql import query
from pipeline.warehouse import Warehouse
from tests.helpers import EVIL_FILE, EVIL_MODEL, EVIL_TENANT, R1, R2, build, specs


class Page(HTMLParser):
    """Every tag with its attributes, the text outside scripts, and the inline scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


@pytest.fixture(scope="module")
def tiny_html(tiny_warehouse: Warehouse, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = build_report(tiny_warehouse, output=tmp_path_factory.mktemp("r") / "review.html")
    return out.read_text()


@pytest.fixture(scope="module")
def replayed_html(replayed_warehouse: Warehouse) -> str:
    return build_report(replayed_warehouse).read_text()


def test_every_section_has_a_title_and_a_how_to_read(tiny_html: str) -> None:
    text = " ".join(parse(tiny_html).text)
    # no --compare, and the tiny runs hold no fleet
    shown = [s for s in load_definition().sections if not (s.requires_param or s.requires)]
    for section in shown:
        assert section.title in text
        # {slos}: what goodput judges, filled in by the report
        for part in section.how_to_read.split("{slos}"):
            assert part in text
    assert text.count("How to read this:") == len(shown) + 1  # + scenarios


def test_header_names_trace_dates_scenarios_metrics_and_version(tiny_html: str) -> None:
    text = " ".join(parse(tiny_html).text)
    assert R2 in text  # the latest run
    assert "2024-05-01 00:00:00 UTC to 2024-05-01 00:00:03 UTC" in text
    assert "a.jsonl" in text and "formats: azure, gateway" in text
    assert "tracereplay 0.1.0" in text
    for name in ("static-4", "vllm-2", "vllm-4", "vllm-4-fast"):
        assert name in text
    assert '"time_scale": 0.5' in text  # every parameter of the configuration
    for metric in ("TTFT", "TPOT", "E2E", "Goodput", "Prefix-cache hit rate"):
        assert metric in text


def test_opens_with_no_network(tiny_html: str) -> None:
    page = parse(tiny_html)
    for tag, attrs in page.tags:
        for key in ("src", "href", "action", "data", "poster"):
            value = attrs.get(key) or ""
            assert not re.match(r"(?i)(https?:)?//", value), (tag, key, value)
        assert not (tag == "link" and attrs.get("rel") == "stylesheet"), attrs
    assert all(t != "script" or "src" not in a for t, a in page.tags)
    bundle = max(page.scripts, key=len)
    assert "vegaEmbed" in bundle and "vegaLite" in bundle
    assert "default-src 'none'" in tiny_html  # the page itself forbids fetching anything


def test_sections_without_data_say_so(tiny_html: str) -> None:
    text = " ".join(parse(tiny_html).text)
    assert "No calibration results in this warehouse." in text
    assert "No queue-depth bucket holds enough requests (20) for a p99." in text
    # no empty drawing: a chart without data is a message, not a spec
    assert all(t != "svg" for t, _ in parse(tiny_html).tags)
    assert len(specs(tiny_html)) == tiny_html.count('class="chart"')


def test_chart_specs_are_valid_and_aggregated(replayed_html: str) -> None:
    all_specs = specs(replayed_html)
    assert len(all_specs) >= 10
    points = 0
    for spec in all_specs.values():
        assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
        for rows in _data_values(spec):
            points += len(rows)
            assert all("request_id" not in r for r in rows)  # no per-request rows
    assert points < 5000


@pytest.mark.parametrize("page", ["tiny_html", "replayed_html"])
def test_chart_specs_match_the_vega_lite_schema(page: str, request: pytest.FixtureRequest) -> None:
    # the report builds specs without Altair's checks (charts.spec); this is where they are
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema import load_schema

    schema = load_schema()
    all_specs = specs(request.getfixturevalue(page))
    assert all_specs
    for element_id, spec in all_specs.items():
        error = validate_jsonschema(spec, schema, raise_error=False)
        assert error is None, f"{element_id}: {error.message if error else ''}"


def _data_values(node: Any) -> list[list[dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("values"), list):
            found.append(node["values"])
        for v in node.values():
            found.extend(_data_values(v))
    elif isinstance(node, list):
        for v in node:
            found.extend(_data_values(v))
    return found


def test_names_from_logs_are_escaped(replayed_html: str) -> None:
    for evil in (EVIL_MODEL, EVIL_TENANT, EVIL_FILE):
        assert evil not in replayed_html
    assert "alert(" not in "".join(
        s for s in parse(replayed_html).scripts if "chart-specs" not in s and len(s) < 5000
    )
    # HTML text is entity-escaped; the specs are JSON with < and > as \u003c, \u003e.
    assert "&lt;script&gt;alert(&#34;file&#34;)&lt;.jsonl" in replayed_html
    assert "\\u003c/script\\u003e\\u003cscript\\u003ealert" in replayed_html
    values = [r for s in specs(replayed_html).values() for v in _data_values(s) for r in v]
    assert any(r.get("group_name") == EVIL_MODEL for r in values)
    assert any(r.get("group_name") == EVIL_TENANT for r in values)
    # Exactly two inline scripts run: the bundle and the embedding loop.
    runnable = [a for t, a in parse(replayed_html).tags if t == "script" and not a.get("type")]
    assert len(runnable) == 2


def test_a_named_run_and_an_unknown_one(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    html = build_report(tiny_warehouse, R1, output=tmp_path / "old.html").read_text()
    assert R1 in html and "vllm-4-fast" not in html
    with pytest.raises(PipelineError, match=f"no replay run 'nope'.*latest: {R2}"):
        build_report(tiny_warehouse, "nope", output=tmp_path / "x.html")


def test_trace_only_warehouse(tmp_path: Path) -> None:
    full = build(tmp_path / "full")
    wh = Warehouse(tmp_path / "trace")
    (wh.root / "requests").mkdir(parents=True)
    for p in (full.root / "requests").rglob("*.parquet"):
        dest = wh.root / p.relative_to(full.root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(p.read_bytes())
    out = build_report(wh)
    assert out == wh.root / "reports" / "trace" / "review.html"
    html = out.read_text()
    text = " ".join(parse(html).text)
    assert "No replay run in this warehouse" in text
    assert "every request in the warehouse" in text
    assert {k.split("-")[1] for k in specs(html)} == {"trace"}


def test_empty_warehouse(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.init()
    html = build_report(wh).read_text()
    assert "The warehouse holds no requests" in html
    assert specs(html) == {}
    with pytest.raises(PipelineError, match="no warehouse at"):
        build_report(Warehouse(tmp_path / "missing"))


def test_png_per_chart(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    out = build_report(tiny_warehouse, output=tmp_path / "r.html", png=True)
    pngs = sorted(png_dir(out).glob("*.png"))
    assert [p.stem for p in pngs] == sorted(specs(out.read_text()))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_slo_is_a_parameter(tiny_warehouse: Warehouse, tmp_path: Path) -> None:
    html = build_report(tiny_warehouse, output=tmp_path / "r.html", slo_ttft_s=0.1).read_text()
    assert "ttft_p99 &lt;= 100ms (given to the report (--slo))" in html
    # at 100 ms no sweep point meets the SLO: the capacity table shows dashes
    assert "A dash means no scenario of that sweep meets every SLO." in html
    assert "ttft_p99 &lt;= 100ms" in html


@pytest.mark.parametrize("chart", sorted(charts.CHARTS))
def test_every_chart_function_is_in_the_report(chart: str) -> None:
    used = {i.chart for s in load_definition().sections for i in s.items}
    assert chart in used


def test_chart_golden(tiny_warehouse: Warehouse, golden: Any) -> None:
    con = tiny_warehouse.connect()
    opts = charts.ChartOptions(title="t", scenarios=("static-4", "vllm-2", "vllm-4", "vllm-4-fast"))
    golden("report_throughput_chart", throughput(query(con, "throughput"), opts).to_dict())
    golden("report_capacity_chart", slo_capacity(query(con, "slo_capacity"), opts).to_dict())


def test_bad_definition_names_the_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipeline.report import render

    monkeypatch.setattr(render, "REPORTS_DIR", tmp_path)
    (tmp_path / "bad.toml").write_text(
        '[[sections]]\nid = "a"\ntitle = "A"\nhow_to_read = "x"\n'
        '[[sections.items]]\nkind = "chart"\nquery = "throughput"\nchart = "pie"\n'
    )
    with pytest.raises(ConfigError, match=r"sections\[0\]\.items\[0\]: unknown chart 'pie'"):
        load_definition("bad")
    with pytest.raises(ConfigError, match="no report 'nope'"):
        load_definition("nope")
