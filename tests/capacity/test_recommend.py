"""capacity's recommendation: the cheapest probe that meets every SLO with margin at the upper
end of its interval, written as a scenario TOML that replay takes as it is."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.plan.capacity import SearchSpec, run_capacity
from pipeline.plan.engine_flags import engine_command
from pipeline.plan.recommend import (
    Candidate,
    Recommendation,
    candidates,
    format_recommendation,
    recommend,
    recommendation_dict,
    write_recommendation,
)
from pipeline.plan.slo import parse_slos
from pipeline.sim.replay import ScenarioRun
from pipeline.sim.scenario import build_scenario
from tests.helpers import small_warehouse_at

SLOS = ["ttft_p99=500ms", "tpot_p99=50ms"]
PROFILE = "llama-3-8b_h100-80gb_tp1"
BASE: dict[str, Any] = {"name": "base", "policy": "vllm", "profile": PROFILE,
                        "num_gpu_blocks": 4000, "max_model_len": 4096,
                        "async_scheduling": False, "replicas": 4}  # fmt: skip
PRICES = {"*": 2.0}


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A concurrency and a replicas search, with intervals, on 150 requests (once)."""
    wh = small_warehouse_at(tmp_path_factory.mktemp("rec") / "wh", 150, 20.0)
    specs = [SearchSpec("concurrency", hi=32), SearchSpec("replicas", hi=8)]
    return wh, run_capacity(wh, dict(BASE), parse_slos(SLOS), specs, quiet=True)


def _chosen(rec: Recommendation) -> Candidate:
    assert rec.chosen is not None and rec.chosen.outcome.run is not None
    return rec.chosen


def _run(c: Candidate) -> ScenarioRun:
    assert c.outcome.run is not None
    return c.outcome.run


def _fits(c: Candidate, margin_pct: float) -> bool:
    """Worked out here from the probe's own figures: every upper bound within the limit less
    the margin."""
    return all(
        ch.upper_s is not None and ch.upper_s <= ch.limit_s * (1 - margin_pct / 100)
        for ch in c.checks
    )


def test_the_cheapest_probe_that_meets_with_margin_is_chosen(searched: Any) -> None:
    _, result = searched
    rec = recommend(result, BASE, PRICES)
    _, cands = candidates(result, PRICES, rec.margin_pct)
    chosen = _chosen(rec)
    assert _fits(chosen, rec.margin_pct)
    # every probe of both searches (each at the trace's rate) was judged
    assert len(cands) == sum(len(s.result.probes) + len(s.interval_probes) for s in result.searches)
    cost = chosen.usd_per_hour
    assert cost is not None
    cheaper = [c for c in cands if c.usd_per_hour is not None and c.usd_per_hour < cost]
    assert cheaper and not any(_fits(c, rec.margin_pct) for c in cheaper)
    # it costs what its GPUs cost: replicas x tp1 x $2
    run = _run(chosen)
    assert cost == pytest.approx(run.scenario.replicas * 2.0)
    assert run.scenario.replicas < int(BASE["replicas"])  # fewer replicas than the base meet
    # judged at the conservative end: each bound is at or above the statistic itself
    for ch in chosen.checks:
        assert ch.upper_s is not None and ch.measured_s is not None
        assert ch.upper_s > ch.measured_s
    # equally cheap ones that fit have no more headroom than the choice
    same = [c for c in cands if c.usd_per_hour == cost and _fits(c, 10.0)]
    assert all(c.headroom <= chosen.headroom for c in same)


def test_the_margin_is_honoured(searched: Any) -> None:
    _, result = searched
    loose = _chosen(recommend(result, BASE, PRICES, margin_pct=0.0))
    # a margin just wider than the loose choice has to spare rules it out
    worst = max((ch.upper_s or 0.0) / ch.limit_s for ch in loose.checks)
    margin = (1 - worst) * 100 + 1
    tight = recommend(result, BASE, PRICES, margin_pct=margin).chosen
    assert tight is None or tight.outcome.name != loose.outcome.name
    if tight is not None:
        assert _fits(tight, margin)
        assert (tight.usd_per_hour or 0.0) >= (loose.usd_per_hour or 0.0)
    # a margin nothing meets: no recommendation, and the closest probe is named
    none = recommend(result, BASE, PRICES, margin_pct=99.0)
    assert none.chosen is None and none.closest is not None
    text = format_recommendation(none)
    assert text.startswith(f"recommendation: none of the {none.num_candidates} probes")
    assert "closest:" in text and "lower --margin-pct" in text
    assert recommendation_dict(none)["found"] is False


def test_the_scenario_toml_replays_as_it_is(searched: Any, tmp_path: Path) -> None:
    wh, result = searched
    rec = recommend(result, BASE, PRICES)
    path = write_recommendation(rec, result.run_id, tmp_path / "rec.toml")
    text = path.read_text()
    values = tomllib.loads(text)
    assert values == rec.values
    sc = _run(_chosen(rec)).scenario
    cmd = engine_command(sc)
    assert cmd is not None and cmd in text
    assert f"--max-num-seqs {sc.params.max_num_seqs} " in cmd
    assert f"--max-num-batched-tokens {sc.params.max_num_batched_tokens} " in cmd
    assert "--tensor-parallel-size 1" in cmd and f"Deploy: {sc.replicas} replicas of" in text
    assert values["max_num_seqs"] == sc.params.max_num_seqs  # stated, not left to a default
    r = CliRunner().invoke(
        cli, ["replay", "--warehouse", str(wh), "--scenario", str(path), "-q", "--json"]
    )
    assert r.exit_code == 0, r.output
    (got,) = json.loads(r.stdout)["scenarios"].values()
    # the replay of the file is the replay the recommendation was judged on
    probe = _run(_chosen(rec)).summary
    for key in ("ttft_p99_s", "tpot_p99_s", "num_requests", "num_preemptions"):
        assert got["summary"][key] == pytest.approx(probe[key]), key


def test_capacity_command_ends_with_the_recommendation(tmp_path: Path) -> None:
    wh = small_warehouse_at(tmp_path / "wh", 120, 20.0)
    base = tmp_path / "base.toml"
    base.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in BASE.items()))
    args = ["capacity", "--warehouse", str(wh), "--scenario", str(base), "-q",
            *(x for s in SLOS for x in ("--slo", s)), "--search", "replicas",
            "--max-replicas", "6", "--gpu-hour-price", "2"]  # fmt: skip
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    tail = r.output[r.output.index("\nrecommendation: ") + 1 :].splitlines()
    assert "every SLO with a 10% margin at the upper end of the 90% interval" in tail[0]
    assert tail[2].startswith("  deploy ") and "vllm serve MODEL --max-num-seqs 256" in tail[2]
    written = next((wh / "reports").glob("*/recommended.toml"))
    assert tail[3] == f"  scenario: {written} (tracereplay replay --scenario {written})"
    out_file = tmp_path / "mine.toml"
    r = CliRunner().invoke(cli, [*args, "--json", "--recommend-out", str(out_file),
                                 "--margin-pct", "5"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    rec = out["recommendation"]
    assert rec["found"] and rec["file"] == str(out_file) and rec["margin_pct"] == 5.0
    assert rec["replicas"] == tomllib.loads(out_file.read_text())["replicas"]
    assert all(s["upper_s"] <= s["limit_s"] * 0.95 for s in rec["slos"].values())
    assert rec["usd_per_hour"] == rec["gpus"] * 2.0
    # the replica answer is a whole number
    assert isinstance(out["searches"]["replicas"]["answer"], int)
    r = CliRunner().invoke(cli, [*args, "--margin-pct", "100"])
    assert r.exit_code != 0 and "--margin-pct" in r.output


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        (
            {"policy": "sglang", "max_running_requests": 48, "chunked_prefill_size": 4096},
            ["--max-running-requests 48", "--chunked-prefill-size 4096", "--tp-size 1",
             "--max-prefill-tokens 16384", "--schedule-policy fcfs"],
        ),
        (
            {"policy": "tgi", "max_batch_total_tokens": 65536, "max_batch_size": 32},
            ["--max-batch-total-tokens 65536", "--max-batch-size 32", "--num-shard 1",
             "--max-batch-prefill-tokens 4096"],
        ),
        (
            {"policy": "vllm", "max_num_seqs": 64, "max_num_batched_tokens": 4096,
             "enable_chunked_prefill": False, "max_model_len": 4096},
            ["--max-num-seqs 64", "--max-num-batched-tokens 4096", "--tensor-parallel-size 1",
             "--no-enable-chunked-prefill"],
        ),
    ],
)  # fmt: skip
def test_engine_commands_use_the_engines_flag_names(
    values: dict[str, Any], flags: list[str]
) -> None:
    sc = build_scenario({"profile": PROFILE, **values})
    cmd = engine_command(sc)
    assert cmd is not None
    for flag in flags:
        assert f" {flag}" in cmd + " ", (flag, cmd)
    assert engine_command(build_scenario({"policy": "static", "profile": PROFILE})) is None


def test_a_range_that_meets_to_the_top_is_not_the_headline(searched: Any) -> None:
    from pipeline.cli.capacity import format_search

    _, result = searched
    conc = result.searches[0]
    # the fixture's traffic: every cap from some small one up meets at 4 replicas
    assert conc.spec.kind == "concurrency" and conc.result.at_range_end
    lowest = int(min(v for v, met in conc.result.probes if met))
    first = format_search(conc, result.slos, result.base_rate).splitlines()[0]
    assert first.startswith(
        f"concurrency: every max_num_seqs probed from {lowest:,} to the top of the range (32) "
        "meets every SLO"
    )
    assert "highest" not in first and "recommendation" in first
