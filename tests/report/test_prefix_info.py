"""The replay summary and the report say when caching cannot hit (no hashes in the trace),
and put the logged cached_tokens beside the simulated hits (tiny warehouse: r1 and r2 have
hashes; r1 logged 50 of 100 prompt tokens cached, r3 100 of 400)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.warehouse import Warehouse
from tests.helpers import build

WARNING = "warning: prefix caching is on but the trace has no prefix hashes"


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build(tmp_path_factory.mktemp("prefix") / "wh")


def _replay(wh: Warehouse, *args: str) -> str:
    r = CliRunner().invoke(cli, ["replay", "--warehouse", str(wh.root), "--policy", "vllm",
                                 "--to", "2024-05-01", *args])  # fmt: skip
    assert r.exit_code == 0, r.output
    return r.stdout


def test_no_hashes_warns_and_logged_cache_is_shown(wh: Warehouse) -> None:
    out = _replay(wh, "--where", "len(prefix_hashes) = 0")  # r3, r4
    assert WARNING in out
    assert "logged engine cache: 25.0% of prompt tokens (cached_tokens of 1 requests)" in out
    out = _replay(wh)  # r1..r4: two with hashes
    assert WARNING not in out
    assert "logged engine cache: 30.0% of prompt tokens (cached_tokens of 2 requests)" in out
    out = _replay(wh, "--where", "len(prefix_hashes) = 0", "--set", "enable_prefix_caching=false")
    assert WARNING not in out  # caching off: nothing to warn about


def test_summary_json_carries_the_facts(wh: Warehouse) -> None:
    (scenario,) = json.loads(_replay(wh, "--json"))["scenarios"].values()
    s = scenario["summary"]
    assert s["prefix_hashed_requests"] == 2
    assert s["observed_cached_requests"] == 2 and s["observed_cached_tokens"] == 150
    assert s["observed_cached_share"] == pytest.approx(0.3)


def test_report_warns_for_a_gateway_log_without_hashes(replayed_html: str) -> None:
    assert "prefix caching is on but the trace has no prefix hashes: no hit can be simulated" in (
        replayed_html
    )


@pytest.fixture(scope="module")
def replayed_html(replayed_warehouse: Warehouse, tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipeline.report import build_report

    out = tmp_path_factory.mktemp("pr") / "r.html"
    return build_report(replayed_warehouse, output=out).read_text()
