"""Capacity searches end to end: answers at the flip, the path stored, the command."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import (
    CAPACITY_SEARCH,
    RUNS,
    SCENARIOS,
    SIM_REQUESTS,
    SIM_STEPS,
    read_table,
)
from pipeline.errors import ConfigError, ScenarioError
from pipeline.plan import replicates
from pipeline.plan.capacity import SearchSpec, run_capacity
from pipeline.plan.knobs import concurrency_knob
from pipeline.plan.slo import parse_slos
from pipeline.report.sql import query
from pipeline.sim import policies
from pipeline.warehouse import Warehouse
from tests.helpers import BASE, capacity_file, seeded_warehouse

SLOS = ["ttft_p99=500ms", "tpot_p99=40ms"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """All three searches on a small warehouse (run once for the module)."""
    wh = seeded_warehouse(tmp_path_factory.mktemp("cap") / "wh")
    specs = [
        SearchSpec("concurrency", hi=256),
        SearchSpec("rate", tolerance=0.05),
        SearchSpec("replicas", rate_scale=4.0, hi=16),
    ]
    # sized for vLLM's synchronous loop: async scheduling's extra step per arrival puts TTFT
    # p99 past 500 ms at every concurrency, leaving that search no answer to check
    base = {**BASE, "name": "base", "async_scheduling": False}
    return wh, run_capacity(wh, base, parse_slos(SLOS), specs, quiet=True)


def _verdicts(search: Any) -> dict[float, bool]:
    return dict(search.result.probes)


def test_each_answer_sits_where_the_verdict_flips(searched: Any) -> None:
    _, result = searched
    conc, rate, reps = result.searches
    assert conc.knob == "max_num_seqs" and rate.knob == "rate" and reps.knob == "replicas"
    v = _verdicts(conc)
    assert conc.answer is not None and v[conc.answer]
    assert conc.result.at_range_end or v[conc.answer + 1] is False
    v = _verdicts(rate)
    assert rate.answer is not None and v[rate.answer]
    above = min(x for x, met in v.items() if not met and x > rate.answer)
    assert above <= rate.answer * 1.05 * 1.001
    v = _verdicts(reps)
    assert reps.answer is not None and v[reps.answer]
    assert reps.answer == 1 or v[reps.answer - 1] is False
    assert reps.spec.rate == pytest.approx(4 * result.base_rate)
    for s in result.searches:
        assert s.result.monotone, s.note
    assert result.num_replays == sum(
        len(s.result.probes) + len(s.interval_probes) for s in result.searches
    )


def test_the_search_path_and_every_probe_are_stored(searched: Any) -> None:
    wh, result = searched
    w = Warehouse(wh)
    (path,) = w.files(CAPACITY_SEARCH)
    rows = read_table(path, CAPACITY_SEARCH).to_pylist()
    assert len(rows) == result.num_replays * len(SLOS)
    for search in result.searches:
        mine = [r for r in rows if r["search"] == search.spec.kind]
        assert {r["answer"] for r in mine} == {search.answer}
        answers = {r["scenario"] for r in mine if r["is_answer"]}
        assert answers == {search.answer_probe.name}
        for r in mine:
            assert r["met"] == all(x["slo_met"] for x in mine if x["probe"] == r["probe"])
            assert r["slo_met"] == (r["measured_s"] <= r["limit_s"])
    # every probe is a scenario of the run, with its requests
    (scen,) = [p for p in w.files(SCENARIOS) if result.run_id in str(p)]
    assert read_table(scen, SCENARIOS).num_rows == result.num_replays
    # the sim tables of the bisection's probes; those only an interval needed are not written
    assert len([p for p in w.files(SIM_REQUESTS) if result.run_id in str(p)]) == (
        sum(len(s.probes) for s in result.searches)
    )
    (run,) = [r for r in (read_table(p, RUNS).to_pylist()[0] for p in w.files(RUNS))]
    assert run["command"] == "capacity" and run["status"] == "ok"
    # the recorded p99 TTFT is the one DuckDB computes from the probe's sim_requests
    con = w.connect()
    probe = result.searches[1].answer_probe
    (p99,) = con.execute(
        "SELECT quantile_cont(ttft_s, 0.99) FROM sim_requests WHERE scenario = ?", [probe.name]
    ).fetchone()
    assert probe.slo.measured_s["ttft_p99"] == pytest.approx(p99, rel=1e-12)
    df = query(con, "capacity_search", slo="ttft_p99")
    assert df.height == result.num_replays
    assert df.filter(df["is_answer"])["search"].to_list() == ["concurrency", "rate", "replicas"]


def test_knob_follows_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [concurrency_knob(p) for p in ("vllm", "orca", "sarathi", "static")] == [
        "max_num_seqs",
        "max_num_seqs",
        "max_num_seqs",
        "max_batch_size",
    ]
    with pytest.raises(ScenarioError, match="unknown policy 'fast'"):
        concurrency_knob("fast")

    class Fake:
        def param_help(self) -> dict[str, str]:
            return {"max_running_requests": "", "chunked_prefill_size": ""}

    monkeypatch.setitem(policies.POLICIES, "sglang-like", Fake())  # type: ignore[arg-type]
    assert concurrency_knob("sglang-like") == "max_running_requests"


def test_static_batching_searches_max_batch_size(small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse(120)
    result = run_capacity(
        wh,
        {**BASE, "policy": "static"},
        parse_slos(["e2e_p50=30s"]),
        [SearchSpec("concurrency", hi=64)],
        summary_only=True,
        quiet=True,
    )
    (search,) = result.searches
    assert search.knob == "max_batch_size"
    assert all(o.name.startswith("static-concurrency-") for o in search.probes)
    assert not Warehouse(wh).files(SIM_REQUESTS)  # summary only


def test_command_with_a_capacity_file(tmp_path: Path, small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse(150)
    cfile = capacity_file(
        tmp_path / "cap.toml",
        '[slo]\nttft_p99 = "2s"\n[search.concurrency]\nmax = 64\n[search.rate]\nmin = 1.0\n',
    )
    r = CliRunner().invoke(
        cli, ["capacity", str(cfile), "--warehouse", str(wh), "--slo", "ttft_p99=1s", "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["slos"] == ["ttft_p99<=1s"] and list(out["searches"]) == ["concurrency", "rate"]
    assert out["searches"]["concurrency"]["range"] == [1.0, 64.0]
    assert out["num_replays"] == sum(
        len(s["probes"]) + len(s["interval_probes"]) for s in out["searches"].values()
    )
    r = CliRunner().invoke(
        cli, ["capacity", str(cfile), "--warehouse", str(wh), "--search", "replicas"]
    )
    assert r.exit_code == 0, r.output
    assert "replicas: fewest replicas that meet every SLO" in r.output
    assert re.search(r"probe +replicas +ttft_p99 +met", r.output)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give at least one SLO, e.g. --slo ttft_p99=200ms"),
        (["--slo", "ttft_p99=200 ms", "--set", "polcy=vllm"], "unknown key 'polcy'"),
        (["--slo", "ttft_p99=200"], "give a unit"),
        (["--slo", "ttft_p99=1s", "--set", "max_num_seqs=0"], "max_num_seqs"),
    ],
)
def test_bad_input_is_one_line_and_runs_nothing(
    small_warehouse: Callable[..., Path], args: list[str], message: str
) -> None:
    wh = small_warehouse(20)
    r = CliRunner().invoke(cli, ["capacity", "--warehouse", str(wh), *args])
    assert r.exit_code == 1 and message in r.output, r.output
    assert not (wh / "capacity_search").exists() and not (wh / "runs").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[slo]\nttft_p99 = '1s'\n[serch]\n", "unknown key(s) serch"),
        ("[slo]\nttft_p99 = '1s'\n[search.speed]\n", "unknown search 'speed'"),
        ("[search.rate]\nmaximum = 3\n", "unknown key(s) maximum; allowed: max, min, tolerance"),
        ("[search.replicas]\nrate = 2\nrate_scale = 2\n", "give rate or rate_scale"),
        ("[search.rate]\nmin = -1\n", "min must be a number > 0"),
    ],
)
def test_bad_capacity_files(tmp_path: Path, text: str, message: str) -> None:
    from pipeline.plan.capacity import load_capacity_file

    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_capacity_file(path)
    assert message in str(exc.value)


def test_an_empty_range_fails_before_running(small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse(20)
    with pytest.raises(ConfigError, match=r"min \(8\) is above max \(4\)"):
        run_capacity(wh, dict(BASE), parse_slos(["ttft_p99=1s"]), [SearchSpec("concurrency", 8, 4)])
    assert not (wh / "runs").exists()


def test_capacity_answers_query_gives_one_row_per_search(searched: Any) -> None:
    wh, result = searched
    rows = query(Warehouse(wh).connect(), "capacity_answers").to_dicts()
    assert [r["search"] for r in rows] == ["concurrency", "rate", "replicas"]
    for row, search in zip(rows, result.searches, strict=True):
        at = search.answer_probe
        assert row["knob"] == search.knob and row["answer"] == search.answer
        assert row["slos"] == "tpot_p99<=40ms, ttft_p99<=500ms"
        assert row["num_probes"] == len(search.probes)
        assert row["answer_scenario"] == at.name
        assert row["replicas"] == at.run.scenario.replicas
        assert row["goodput"] == pytest.approx(at.slo.goodput)
        assert row["request_throughput"] == pytest.approx(at.run.summary["request_throughput"])
    assert rows[2]["replicas"] == result.searches[2].answer
    assert all(r["usd_per_hour"] is None for r in rows)  # no price given
    # BASE has a [cost] table, no profile: only a price for any GPU applies
    priced = query(Warehouse(wh).connect(), "capacity_answers", prices_json='{"*": 2.5}')
    for row, search in zip(priced.to_dicts(), result.searches, strict=True):
        at = search.answer_probe
        assert row["gpus"] == at.run.scenario.replicas
        assert row["usd_per_hour"] == pytest.approx(2.5 * at.run.scenario.replicas)
        per_hour_tokens = at.run.summary["output_token_throughput"] * 3600
        assert row["usd_per_1m_output_tokens"] == pytest.approx(
            2.5 * at.run.scenario.replicas / per_hour_tokens * 1e6
        )


def test_capacity_takes_the_scenario_flags_of_replay(small_warehouse: Callable[..., Path]) -> None:
    wh = small_warehouse(60)
    r = CliRunner().invoke(cli, [
        "capacity", "--warehouse", str(wh), "--slo", "ttft_p99=30s", "--search", "concurrency",
        "--max-concurrency", "4", "--router", "least_outstanding", "--replicas", "2",
        "--max-num-batched-tokens", "4096", "--summary-only", "--json",
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    base = json.loads(r.stdout)["base"]
    assert base["router"] == "least_outstanding" and base["replicas"] == 2
    assert base["max_num_batched_tokens"] == 4096
    r = CliRunner().invoke(cli, ["capacity", "--help"])
    for flag in ("--router", "--replicas", "--max-num-seqs", "--time-scale", "--gpu-hour-price"):
        assert flag in r.output


def test_the_kv_offloading_search_finds_the_smallest_cpu_tier(
    small_warehouse: Callable[..., Path],
) -> None:
    wh = small_warehouse(120)
    base = {
        **BASE,
        "async_scheduling": False,
        "kv_offloading_kv_bytes_per_token": 131072,
        "kv_offloading_link_gb_s": 25.0,
    }
    result = run_capacity(
        wh,
        base,
        parse_slos(["e2e_p50=30s"]),
        [SearchSpec("kv_offloading", hi=8)],
        summary_only=True,
        quiet=True,
        intervals=False,
    )
    (search,) = result.searches
    assert search.knob == "kv_offloading_size_gb"
    v = _verdicts(search)
    assert set(v) <= set(range(1, 9)) and search.answer is not None and v[search.answer]
    assert search.answer == 1 or v[search.answer - 1] is False  # the smallest that meets
    assert all("-kv_offloading-" in o.name for o in search.probes)
    from pipeline.cli.capacity import format_search

    text = format_search(search, parse_slos(["e2e_p50=30s"]), result.base_rate)
    assert text.startswith("kv_offloading: smallest CPU KV tier")
    with pytest.raises(ConfigError, match="policy = vllm"):
        run_capacity(
            wh,
            {**BASE, "policy": "sglang"},
            parse_slos(["e2e_p50=30s"]),
            [SearchSpec("kv_offloading")],
            quiet=True,
        )


def test_probes_in_parts_find_the_answer_of_whole_probes(
    small_warehouse: Callable[..., Path],
) -> None:
    """``--shards``: each probe replayed in replica groups (round_robin: exact) gives the
    verdicts, and so the answer, of the whole probes; its parts' files hold every request."""
    wh = small_warehouse(n=600, rate=60.0)
    base = {**BASE, "name": "rr", "router": "round_robin", "async_scheduling": False}
    specs = [SearchSpec("replicas", rate_scale=1.0, hi=8)]
    slos = parse_slos(SLOS)
    whole = run_capacity(wh, base, slos, specs, quiet=True, intervals=False)
    parts = run_capacity(wh, base, slos, specs, quiet=True, intervals=False, shards=2, jobs=2)
    a, b = whole.searches[0], parts.searches[0]
    assert a.answer is not None and b.answer == a.answer
    assert dict(b.result.probes) == dict(a.result.probes)
    assert len(dict(a.result.probes)) >= 3  # a search, not one probe
    for value in dict(a.result.probes):
        x, y = a.outcome_at(value), b.outcome_at(value)
        assert x is not None and y is not None and x.slo is not None and y.slo is not None
        assert (y.slo.met, y.slo.num_good) == (x.slo.met, x.slo.num_good)
        assert y.run is not None and y.run.summary["sharding"]["exact"]
        files = y.run.paths["sim_requests"].parent.glob(f"{y.name}.*parquet")
        assert sum(read_table(f, SIM_REQUESTS).num_rows for f in files) == 600


def test_intervals_in_parts_are_the_whole_search_intervals(
    small_warehouse: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--shards`` with intervals: the answer's own replay, its replicates and its
    cost-scaled replays run in replica groups too (round_robin: exact), so the interval
    is the whole search's, to the last bit."""
    wh = small_warehouse(n=600, rate=60.0)
    base = {**BASE, "name": "rr", "router": "round_robin", "async_scheduling": False}
    specs = [SearchSpec("replicas", rate_scale=1.0, hi=8)]
    slos = parse_slos(SLOS)
    whole = run_capacity(wh, base, slos, specs, quiet=True, jobs=1)
    real, calls = replicates.measure_all_in_parts, []

    def counted(ms: Any, *args: Any, **kw: Any) -> Any:
        def each() -> Any:
            for m in ms:
                calls.append(m.scenario.name)
                yield m

        return real(each(), *args, **kw)

    monkeypatch.setattr(replicates, "measure_all_in_parts", counted)
    parts = run_capacity(wh, base, slos, specs, quiet=True, shards=2, jobs=2)
    assert len(calls) == parts.num_interval_replays  # every interval replay ran in parts
    a, b = whole.searches[0], parts.searches[0]
    assert a.answer is not None and b.answer == a.answer
    x, y = a.interval, b.interval
    assert x is not None and y is not None and x.num_replicates == 6
    assert (y.lo, y.hi, y.safe) == (x.lo, x.hi, x.safe)
    assert y.replicates == x.replicates and y.at_cost == x.at_cost
    assert y.model.arrivals == x.model.arrivals and y.model.profile == x.model.profile
    assert parts.num_interval_replays == whole.num_interval_replays
    assert [v for v, _ in b.interval_probes] == [v for v, _ in a.interval_probes]
    # a rate search's ends need probes the bisection did not: summarized, not written,
    # as a whole search's are
    rate = [SearchSpec("rate", tolerance=0.05)]
    two = {**base, "replicas": 2}
    found = run_capacity(wh, two, slos, rate, quiet=True, shards=2, jobs=1).searches[0]
    assert found.interval is not None and found.interval_probes
    files = Warehouse(wh).files(SIM_REQUESTS)
    written = {re.sub(r"(\.part-\d+)?\.parquet$", "", f.name) for f in files}
    for _, out in found.interval_probes:
        assert out.run is not None and out.run.paths == {} and out.name not in written
    assert {o.name for o in found.probes} <= written
    path = capacity_file(
        wh.parent / "cap.toml",
        '[slo]\nttft_p99 = "500ms"\n[search.replicas]\nrate_scale = 1\nmax = 8\n',
    )
    args = ["capacity", str(path), "--warehouse", str(wh), "--router", "round_robin"]
    res = CliRunner().invoke(cli, [*args, "--shards", "2", "--jobs", "1"])
    assert res.exit_code == 0, res.output
    assert "intervals: arrivals from 6 replicates" in res.output


def test_summary_only_probes_in_parts_write_no_sim_tables(
    small_warehouse: Callable[..., Path],
) -> None:
    """``--shards`` with ``--summary-only``: the parts replay and add up their totals, and
    write nothing; the probes' summaries (scenarios) and the search path are written."""
    wh = small_warehouse(n=600, rate=60.0)
    base = {**BASE, "name": "rr", "router": "round_robin", "async_scheduling": False}
    specs = [SearchSpec("replicas", rate_scale=1.0, hi=8)]
    slos = parse_slos(SLOS)
    whole = run_capacity(wh, base, slos, specs, quiet=True, intervals=False, summary_only=True)
    for jobs in (1, 2):
        parts = run_capacity(
            wh, base, slos, specs, quiet=True, intervals=False, summary_only=True,
            shards=2, jobs=jobs,
        )  # fmt: skip
        a, b = whole.searches[0], parts.searches[0]
        assert b.answer == a.answer is not None
        assert dict(b.result.probes) == dict(a.result.probes)
        for value in dict(a.result.probes):
            x, y = a.outcome_at(value), b.outcome_at(value)
            assert x is not None and y is not None and x.slo is not None and y.slo is not None
            assert (y.slo.met, y.slo.num_good) == (x.slo.met, x.slo.num_good)
            assert y.run is not None and y.run.paths == {}
    w = Warehouse(wh)
    assert not w.files(SIM_REQUESTS) and not w.files(SIM_STEPS)
    assert len(w.files(SCENARIOS)) == len(w.files(CAPACITY_SEARCH)) == 3  # a run each


def test_probes_in_parts_are_refused_where_they_cannot_run(
    small_warehouse: Callable[..., Path],
) -> None:
    wh = small_warehouse()
    spec = [SearchSpec("replicas", rate_scale=4.0, hi=8)]
    with pytest.raises(ScenarioError, match="shards must be >= 1, got 0"):
        run_capacity(wh, dict(BASE), parse_slos(SLOS), spec, quiet=True, shards=0)
    args = ["capacity", "--warehouse", str(wh), "--slo", "ttft_p99=1s", "--search", "replicas"]
    res = CliRunner().invoke(cli, [*args, "--shards", "0"])
    assert res.exit_code == 1 and "--shards: value must be an integer" in res.output, res.output
    assert "Traceback" not in res.output
    assert not (wh / "runs").exists() or not list((wh / "runs").iterdir())
