"""SLOs per tenant, per model and per prompt-length bucket: ttft_p99@tenant=chat=200ms."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import ConfigError
from pipeline.plan.slo import evaluate, parse_slos
from pipeline.warehouse import Warehouse
from tests.helpers import build


def test_parse_scopes() -> None:
    a, b, c = parse_slos(["ttft_p99@tenant=chat=200ms", "tpot_p50@prompt<=2000=30ms",
                          "e2e_mean@model=llama-3-8b=20s"])  # fmt: skip
    assert (a.key, a.limit_s, a.scope) == ("ttft_p99@tenant=chat", 0.2, "tenant=chat")
    assert (b.key, b.limit_s) == ("tpot_p50@prompt<=2000", 0.03)
    assert c.key == "e2e_mean@model=llama-3-8b" and str(c) == "e2e_mean@model=llama-3-8b<=20s"
    (d,) = parse_slos({"ttft_p99@prompt>8000": "2s"})
    assert d.scope == "prompt>8000"
    with pytest.raises(ConfigError, match="a scope is tenant=NAME, model=NAME, prompt<=N"):
        parse_slos(["ttft_p99@colour=red=200ms"])
    # the same metric for two scopes is two SLOs
    assert len(parse_slos(["ttft_p99=1s", "ttft_p99@tenant=chat=200ms"])) == 2


def test_a_scoped_slo_judges_only_its_requests() -> None:
    metrics = {k: np.array(v) for k, v in {
        "ttft_s": [0.1, 0.9, 0.3, 0.2], "tpot_s": [0.01] * 4, "e2e_s": [1.0] * 4,
        "queue_s": [0.0] * 4}.items()}  # fmt: skip
    groups = {"tenant": np.array(["chat", "batch", "chat", None], dtype=object),
              "model": np.array(["m"] * 4, dtype=object),
              "prompt_tokens": np.array([100, 9000, 200, 5000])}  # fmt: skip
    slos = parse_slos(["ttft_p100@tenant=chat=250ms", "ttft_p100@prompt>4000=1s"])
    report = evaluate(slos, metrics, 2.0, groups)
    assert report.measured_s == {"ttft_p100@tenant=chat": 0.3, "ttft_p100@prompt>4000": 0.9}
    assert report.met == {"ttft_p100@tenant=chat": False, "ttft_p100@prompt>4000": True}
    # good: r2 (batch, within 1 s), r4 (no tenant, 0.2 s); r3 (chat, 0.3 s) is not
    assert report.num_good == 3 and report.goodput == 1.5
    with pytest.raises(ConfigError, match="cannot tell requests apart by scope"):
        evaluate(slos, metrics, 2.0)


def test_capacity_honours_a_tenant_slo(tmp_path_factory: pytest.TempPathFactory) -> None:
    wh = build(tmp_path_factory.mktemp("scope") / "wh")
    r = CliRunner().invoke(cli, ["capacity", "--warehouse", str(wh.root), "--to", "2024-05-01",
                                 "--slo", "ttft_p99@tenant=t1=60s", "--search", "concurrency",
                                 "--max-concurrency", "2", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["slos"] == ["ttft_p99@tenant=t1<=60s"]
    probe = out["searches"]["concurrency"]["probes"][0]
    con = Warehouse(wh.root).connect()
    (want,) = con.execute(
        "SELECT quantile_cont(s.ttft_s, 0.99) FROM sim_requests s JOIN requests r USING "
        "(request_id) WHERE s.run_id = ? AND s.scenario = ? AND r.tenant = 't1'",
        [out["run_id"], probe["scenario"]],
    ).fetchone()
    assert probe["slo"]["measured_s"]["ttft_p99@tenant=t1"] == pytest.approx(want, rel=1e-12)
    (slo,) = {row[0] for row in con.execute("SELECT slo FROM capacity_search").fetchall()}
    assert slo == "ttft_p99@tenant=t1"
