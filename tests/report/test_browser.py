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
from tests.report.conftest import EVIL_FILE, EVIL_MODEL, EVIL_TENANT

CHROMIUM = Path("/usr/bin/chromium")
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
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium")
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
