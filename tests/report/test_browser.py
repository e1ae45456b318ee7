"""The report in a real browser: Debian's chromium, driven by Playwright, no network.

scripts/test.sh installs chromium (apt) and Playwright (the test extra); Playwright's
own browser download is never used. The screenshot lands in out/test-artifacts/.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.report import build_report
from pipeline.warehouse import Warehouse
from tests.extras import needs
from tests.helpers import EVIL_FILE, EVIL_MODEL, EVIL_TENANT

CHROMIUM = Path("/usr/bin/chromium")
# skipped, before the warehouses are built, without Playwright or the browser
pytestmark = [
    needs("playwright"),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"needs Debian's chromium at {CHROMIUM}: apt-get install chromium "
        "(scripts/test.sh does it)",
    ),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(
    os.environ.get("TRACEREPLAY_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "out")
) / "test-artifacts"  # fmt: skip

# Elements Vega draws for data (role-mark groups), not axes, legends or titles.
COUNT_MARKS = """() => Array.from(document.querySelectorAll('div.chart')).map(d => ({
    id: d.id,
    marks: d.querySelectorAll('svg g.role-mark > path, svg g.role-mark > line, '
        + 'svg g.role-mark > rect, svg g.role-mark > g').length,
}))"""


def test_report_renders_offline_in_chromium(replayed_warehouse: Warehouse, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    html = build_report(replayed_warehouse, output=tmp_path / "review.html")
    url = html.resolve().as_uri()
    console_errors: list[str] = []
    requests: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
            # Only the report itself may load; anything else is aborted (and recorded).
            context.route(
                "**/*",
                lambda route: route.continue_() if route.request.url == url else route.abort(),
            )
            page = context.new_page()
            page.on("console", lambda m: m.type == "error" and console_errors.append(m.text))
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            page.on("request", lambda r: r.url != url and requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(url)
            page.wait_for_function(
                "() => { const d = document.documentElement.dataset;"
                " return d.chartsTotal !== undefined && d.chartsDone === d.chartsTotal; }",
                timeout=60_000,
            )
            data = page.evaluate("() => ({...document.documentElement.dataset})")
            marks = page.evaluate(COUNT_MARKS)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report_review.png"), full_page=True)
            shown_model = page.locator("svg text", has_text=EVIL_MODEL).count()
            shown_file = page.get_by_text(EVIL_FILE).count()
            body = page.inner_text("body")
        finally:
            browser.close()

    assert int(data["chartsTotal"]) >= 10
    assert data["chartsFailed"] == "0"
    assert len(marks) == int(data["chartsTotal"])
    assert [m["id"] for m in marks if m["marks"] == 0] == []
    assert console_errors == []
    assert requests == []
    assert dialogs == []  # no injected script ran
    # The hostile names are shown as text, not interpreted.
    assert shown_model >= 1 and shown_file >= 1
    assert EVIL_TENANT not in body or "onerror" in body


FADED_PATHS = """(id) => Array.from(document.querySelectorAll('#' + id + ' g.role-mark path'))
    .map(p => p.getAttribute('opacity') || getComputedStyle(p).opacity)
    .filter(o => Math.abs(parseFloat(o) - 0.12) < 1e-6).length"""
ALL_PATHS = "(id) => document.querySelectorAll('#' + id + ' g.role-mark path').length"


def _open(page, url: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    page.goto(url)
    page.wait_for_function(
        "() => { const d = document.documentElement.dataset;"
        " return d.chartsTotal !== undefined && d.chartsDone === d.chartsTotal; }",
        timeout=120_000,
    )
    return page.evaluate("() => ({...document.documentElement.dataset})")  # type: ignore[no-any-return]


def _offline_page(browser, urls: set[str], errors: list[str], requests: list[str]):  # type: ignore[no-untyped-def]
    """A page that may load only ``urls``: any other request is aborted and recorded, every
    console error and page error is recorded."""

    def route(r):  # type: ignore[no-untyped-def]
        return r.continue_() if r.request.url in urls else r.abort()

    context = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: r.url not in urls and requests.append(r.url))
    return page


def test_a_30_scenario_sweep_and_capacity_report_in_chromium(
    sweep_warehouse: tuple[Warehouse, str, str, str], tmp_path: Path
) -> None:
    """Every chart renders, a legend click and the scenario selector highlight one series,
    no console error, no request; screenshots land in out/test-artifacts/."""
    from playwright.sync_api import sync_playwright

    wh, sweep_id, cap_id, none_id = sweep_warehouse
    # the sweep charts judge scoped SLOs too (a hostile tenant name among them)
    slos = ["ttft_p99<=2s", "ttft_p99@tenant=team-a<=1s", f"tpot_p90@tenant={EVIL_TENANT}<=40ms"]
    sweep_html = build_report(wh, sweep_id, output=tmp_path / "sweep.html", slos=slos)
    cap_html = build_report(wh, cap_id, output=tmp_path / "capacity.html",
                            gpu_prices={"h100-80gb": 2.49})  # fmt: skip
    none_html = build_report(wh, none_id, output=tmp_path / "none.html")
    urls = {p.resolve().as_uri() for p in (sweep_html, cap_html, none_html)}
    errors: list[str] = []
    requests: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            page = _offline_page(browser, urls, errors, requests)
            data = _open(page, sweep_html.resolve().as_uri())
            marks = page.evaluate(COUNT_MARKS)
            page.screenshot(path=str(ARTIFACTS / "report_sweep30.png"), full_page=True)
            # the TTFT CDF: small multiples, 30 lines; click the first legend entry
            cdf = "chart-latency-1"
            total = page.evaluate(ALL_PATHS, cdf)
            before = page.evaluate(FADED_PATHS, cdf)
            page.locator(f"#{cdf} g.role-legend-label text").first.click()
            page.wait_for_timeout(300)
            after = page.evaluate(FADED_PATHS, cdf)
            page.locator(f"#{cdf}").screenshot(path=str(ARTIFACTS / "report_sweep30_legend.png"))
            # the selector: one scenario, every chart that has the parameter
            page.locator(f"#{cdf} g.role-legend-label text").first.click()  # toggle off
            page.select_option("#focus-scenario", "vllm-16-x2")
            page.wait_for_timeout(300)
            picked = page.evaluate(FADED_PATHS, "chart-queueing-1")
            queue_total = page.evaluate(ALL_PATHS, "chart-queueing-1")
            page.locator("#chart-queueing-1").screenshot(
                path=str(ARTIFACTS / "report_sweep30_selector.png")
            )
            toc_sticky = page.evaluate(
                "() => getComputedStyle(document.querySelector('nav.toc')).position"
            )
            slo_headers = page.evaluate(
                "() => Array.from(document.querySelectorAll('#capacity svg text'))"
                ".map(t => t.textContent)"
            )
            page.locator("#capacity [id^=chart-capacity-]").last.screenshot(
                path=str(ARTIFACTS / "report_sweep30_slos.png")
            )

            cap_data = _open(page, cap_html.resolve().as_uri())
            cap_marks = page.evaluate(COUNT_MARKS)
            page.screenshot(path=str(ARTIFACTS / "report_capacity.png"), full_page=True)
            page.locator("#capacity").screenshot(
                path=str(ARTIFACTS / "report_capacity_section.png")
            )
            cap_text = page.inner_text("#capacity")
            none_data = _open(page, none_html.resolve().as_uri())
            page.locator("#capacity").screenshot(
                path=str(ARTIFACTS / "report_capacity_none_section.png")
            )
            none_text = page.inner_text("#capacity")
        finally:
            browser.close()

    assert none_data["chartsFailed"] == "0"
    assert "even unloaded, ttft_p99 is" in none_text and "above the 5ms limit" in none_text
    assert "prefill of the longest 1% of prompts" in none_text
    assert "$ per hour there" in cap_text
    for d, m in ((data, marks), (cap_data, cap_marks)):
        assert d["chartsFailed"] == "0"
        assert len(m) == int(d["chartsTotal"]) >= 8
        assert [x["id"] for x in m if x["marks"] == 0] == []
    assert errors == [] and requests == []
    assert total >= 30 and before == 0
    assert 0 < after < total  # the clicked series stays, the others fade
    assert 0 < picked < queue_total
    assert toc_sticky == "sticky"
    # one row of panels per scoped SLO, in each sweep kind, named with its scope
    assert slo_headers.count("ttft_p99 of tenant=team-a <= 1s") == 2
    assert slo_headers.count(f"tpot_p90 of tenant={EVIL_TENANT} <= 40ms") == 2
    assert "What each capacity search found" in cap_text
    assert "ttft_p99<=2s" in cap_text and "concurrency" in cap_text and "replicas" in cap_text


# The label boxes of every axis of every chart, as the browser laid them out; the pairs that
# overlap (a label Vega hid for overlap has opacity 0 and is left out).
AXIS_LABEL_OVERLAPS = """() => {
  const out = []; let n = 0;
  for (const chart of document.querySelectorAll('div.chart')) {
    for (const axis of chart.querySelectorAll('g.role-axis-label')) {
      const boxes = [];
      for (const t of axis.querySelectorAll('text')) {
        if (parseFloat(t.getAttribute('opacity') ?? '1') === 0 || !t.textContent) continue;
        const r = t.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;
        boxes.push({s: t.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom});
        n += 1;
      }
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i], b = boxes[j];
        if (a.l < b.r - 0.5 && b.l < a.r - 0.5 && a.t < b.b - 0.5 && b.t < a.b - 0.5)
          out.push(chart.id + ': ' + a.s + ' / ' + b.s);
      }
    }
  }
  return {labels: n, overlaps: out};
}"""
# The table under the heading ``title``: whether it is wider than its box (a horizontal
# scroll would hide its right-hand columns), and its column labels.
TABLE_FITS = """(title) => {
  const h = Array.from(document.querySelectorAll('h3')).find(e => e.textContent === title);
  if (!h) return null;
  const wrap = h.nextElementSibling;
  return {fits: wrap.scrollWidth <= wrap.clientWidth + 1,
          columns: Array.from(wrap.querySelectorAll('th')).map(th => th.textContent)};
}"""


def test_no_axis_label_overlaps_at_1_30_and_100_scenarios(
    many_warehouse: tuple[Warehouse, str, str],
    sweep_warehouse: tuple[Warehouse, str, str, str],
    fleet_warehouse: tuple[Warehouse, str, str],
    autoscale_warehouse: tuple[Warehouse, str, str],
    tmp_path: Path,
) -> None:
    """Every axis label box of every chart, at 1, 30 and 100 scenarios (two tenants, so the
    per-class panels are drawn), of a fleet's run (the per-pool panels) and of an autoscaled
    run (the replicas over the arrivals), is clear of the
    others; the capacity answers' table keeps its cost columns in view; a full-page
    screenshot of each lands in out/test-artifacts/."""
    from playwright.sync_api import sync_playwright

    wh, one_id, hundred_id = many_warehouse
    swh, sweep_id, cap_id, _ = sweep_warehouse
    fwh, fleet_id, _ = fleet_warehouse
    awh, auto_id, _ = autoscale_warehouse
    slos = ["ttft_p99<=2s", "ttft_p99@tenant=team-a<=1s"]
    pages = {
        "report_1_scenario": build_report(wh, one_id, output=tmp_path / "one.html", slos=slos),
        "report_30_scenarios": build_report(swh, sweep_id, output=tmp_path / "s30.html",
                                            slos=slos),
        "report_100_scenarios": build_report(wh, hundred_id, output=tmp_path / "s100.html",
                                             slos=slos),
        "report_capacity": build_report(swh, cap_id, output=tmp_path / "cap.html",
                                        gpu_prices={"h100-80gb": 2.49}),
        "report_fleet": build_report(fwh, fleet_id, output=tmp_path / "fleet.html", slos=slos),
        "report_autoscale": build_report(awh, auto_id, output=tmp_path / "auto.html",
                                         slos=slos[:1]),
    }  # fmt: skip
    urls = {p.resolve().as_uri() for p in pages.values()}
    errors: list[str] = []
    requests: list[str] = []
    found: dict[str, dict] = {}  # type: ignore[type-arg]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            page = _offline_page(browser, urls, errors, requests)
            for name, html in pages.items():
                data = _open(page, html.resolve().as_uri())
                found[name] = {
                    "failed": data["chartsFailed"],
                    "classes": page.locator("#chart-classes-1 svg.marks").count(),
                    "pools": page.locator("#chart-pools-1 svg.marks").count(),
                    "autoscaling": page.locator("#chart-autoscaling-1 svg.marks").count(),
                    **page.evaluate(AXIS_LABEL_OVERLAPS),
                    "answers": page.evaluate(TABLE_FITS, "What each capacity search found"),
                }
                page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
                if page.locator("#classes .chart").count():
                    page.locator("#classes").screenshot(path=str(ARTIFACTS / f"{name}_classes.png"))
                if page.locator("#autoscaling .chart").count():
                    page.locator("#autoscaling").screenshot(
                        path=str(ARTIFACTS / f"{name}_autoscaling.png")
                    )
                if page.locator("#pools .chart").count():
                    page.locator("#pools").screenshot(path=str(ARTIFACTS / f"{name}_pools.png"))
        finally:
            browser.close()

    assert errors == [] and requests == []
    for name, f in found.items():
        assert f["failed"] == "0", name
        assert f["labels"] > 50, name  # the check saw the axes
        assert f["overlaps"] == [], name
    # the capacity answers' table keeps its cost columns in view
    answers = found["report_capacity"]["answers"]
    assert answers["fits"] and "$ per hour there" in answers["columns"]
    for name in ("report_1_scenario", "report_30_scenarios", "report_100_scenarios"):
        assert found[name]["classes"] == 1, name  # two tenants: the per-class panels
        assert found[name]["pools"] == 0, name  # no fleet: no per-pool section
    assert found["report_fleet"]["pools"] == 1  # the fleet's per-pool panels
    for name, f in found.items():  # the autoscaling section: only for the autoscaled run
        assert f["autoscaling"] == (1 if name == "report_autoscale" else 0), name


def test_the_swap_and_speculation_sections_in_chromium(
    features_warehouse: Warehouse, tmp_path: Path
) -> None:
    """A run that swapped and drafted tokens: its two charts render with marks, no label
    overlaps, no console error; screenshots of both sections land in out/test-artifacts/."""
    from playwright.sync_api import sync_playwright

    html = build_report(features_warehouse, output=tmp_path / "features.html")
    url = html.resolve().as_uri()
    errors: list[str] = []
    requests: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            page = _offline_page(browser, {url}, errors, requests)
            data = _open(page, url)
            marks = {m["id"]: m["marks"] for m in page.evaluate(COUNT_MARKS)}
            labels = page.evaluate(AXIS_LABEL_OVERLAPS)
            for sid in ("swaps", "speculation", "sched_cpu"):
                page.locator(f"#{sid}").screenshot(path=str(ARTIFACTS / f"report_{sid}.png"))
        finally:
            browser.close()

    assert data["chartsFailed"] == "0"
    assert marks["chart-swaps-1"] > 0 and marks["chart-speculation-1"] > 0
    assert [k for k, n in marks.items() if n == 0] == []
    assert labels["overlaps"] == []
    assert errors == [] and requests == []
