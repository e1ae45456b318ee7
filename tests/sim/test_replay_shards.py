"""``replay --shards``: a replay cut into parts writes what the whole replay writes.

Replica groups under round_robin are exact: every sim_requests and sim_steps row, and
the summary, are the whole replay's. Time windows under a load-aware router replay
every request once, within a loose bound of the whole replay's figures. SLOs, whole
traffic and scoped, are judged as the whole replay judges them. Scenarios that cannot
be cut are refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from pipeline.busiest import Busiest
from pipeline.cli import cli
from pipeline.contracts import SIM_REQUESTS, SIM_STEPS, read_table
from pipeline.errors import ScenarioError
from pipeline.plan.slo import parse_slos
from pipeline.selection import RequestFilter
from pipeline.sim.replay import replay
from pipeline.sim.replay_input import select_request_files
from pipeline.sim.replay_windows import WINDOW_REQUESTS, WindowFacts, read_windows
from pipeline.sim.shard import plan_shards
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, assert_nested_close, make_scenario, requests_table
from tests.ray_cluster import local_ray_cluster

N = 1200


def _table(gap_s: float) -> pa.Table:
    rng = np.random.default_rng(11)
    return requests_table(
        rng.integers(10, 1500, N),
        rng.integers(1, 200, N),
        rng.exponential(gap_s, N),
        start=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )


@pytest.fixture
def root(warehouse_with: Callable[..., Path]) -> Path:
    """Overloaded: queues grow over the replay."""
    return warehouse_with(_table(0.01))


@pytest.fixture
def steady(warehouse_with: Callable[..., Path]) -> Path:
    """Loaded but not overloaded: the queues a warm-up must refill stay short."""
    return warehouse_with(_table(0.05))


def _rows(path: Path, contract: Any, keys: list[str]) -> pa.Table:
    """The rows of the file at ``path`` and of its sibling parts (``<scenario>.part-<k>``),
    sorted by ``keys``."""
    scenario = path.name.split(".")[0]
    files = sorted(path.parent.glob(f"{scenario}.*parquet"))
    table = pa.concat_tables([read_table(f, contract) for f in files])
    return table.sort_by([(k, "ascending") for k in keys])


def _scenario(**kw: Any) -> Any:
    kw.setdefault("num_gpu_blocks", 400)  # tight: preemptions
    return make_scenario("vllm", H100_8B_COST, **kw)


def _same_as_whole(whole: Any, cut: Any) -> None:
    """``cut`` (a sharded run) wrote every row, and the summary, of ``whole``: its
    per-class figures and its intervals too (the bootstrap over the parts' requests in
    arrival order, the profile term's replays in parts)."""
    classes = whole.summary.pop("classes")
    assert classes, "a trace with classes"
    assert_nested_close(cut.summary.pop("classes"), classes, "classes")
    intervals = whole.summary.pop("intervals")
    assert intervals["stats"] and intervals["cost_log_sd"] > 0  # the bootstrap, the profile
    assert cut.summary.pop("intervals") == intervals
    assert cut.summary == whole.summary
    for name, contract, keys in (
        ("sim_requests", SIM_REQUESTS, ["request_id"]),
        ("sim_steps", SIM_STEPS, ["replica", "step"]),
    ):
        a = _rows(whole.paths[name], contract, keys)
        b = _rows(cut.paths[name], contract, keys)
        assert a.num_rows == b.num_rows > N // 2
        assert b.equals(a), name


@pytest.mark.parametrize("jobs", [1, 2])
def test_replica_groups_write_the_whole_replay(root: Path, jobs: int) -> None:
    """In this process (jobs 1) or in forked workers, the parts make the whole replay."""
    sc = _scenario(name="rr", replicas=6, router="round_robin")
    whole = replay(root, [sc], quiet=True, run_id="whole").runs[0]
    cut = replay(root, [sc], quiet=True, run_id="cut", shards=4, chunk_rows=50, jobs=jobs)
    cut_run = cut.runs[0]
    sharding = cut_run.summary.pop("sharding")
    assert sharding["by"] == "replicas" and sharding["shards"] == 3  # (the most <= 4 dividing 6)
    assert sharding["exact"] and sharding["coupling"] is None and sharding["workers"] == jobs
    assert whole.summary["num_preemptions"] > 0  # a loaded replay, not an idle one
    _same_as_whole(whole, cut_run)
    files = sorted(p.name for p in cut_run.paths["sim_requests"].parent.iterdir())
    if jobs == 1:  # one file per table, written as the parts end
        assert files == ["rr.parquet"]
    else:  # each part's own files, encoded by its worker
        assert files == [f"rr.part-{k:05d}.parquet" for k in range(3)]


# one met, one missed, a mean, TPOT (NaN for one-token outputs, good on it), and scoped
# to a model and to short prompts
SLOS = (
    "ttft_p99=60s",
    "ttft_p50=10s",
    "tpot_mean=80ms",
    "e2e_p90=90s",
    "ttft_p90@model=a=20s",
    "e2e_p50@prompt<=500=60s",
)


@pytest.mark.parametrize("jobs", [1, 2])
def test_replica_groups_judge_slos_as_the_whole_replay(
    warehouse_with: Callable[..., Path], jobs: int
) -> None:
    root = warehouse_with(_with_models(_table(0.01)))
    sc = _scenario(name="rr", replicas=4, router="round_robin")
    slos = parse_slos(SLOS)
    whole = replay(root, [sc], quiet=True, run_id="whole", slos=slos).runs[0]
    cut = replay(root, [sc], quiet=True, run_id="cut", shards=2, jobs=jobs, slos=slos).runs[0]
    cut.summary.pop("sharding")
    verdicts = {k: e["met"] for k, e in whole.summary["slo"].items()}
    assert verdicts == {
        "ttft_p99": True,
        "ttft_p50": False,
        "tpot_mean": True,
        "e2e_p90": True,
        "ttft_p90@model=a": False,
        "e2e_p50@prompt<=500": True,
    }
    assert 0 < whole.summary["num_good"] < whole.summary["completed"]
    # a mean over the parts' requests may differ in its last bit (another order of the sum)
    a, b = whole.summary.pop("slo"), cut.summary.pop("slo")
    assert {k: e["met"] for k, e in b.items()} == verdicts
    for key, entry in a.items():
        assert b[key]["measured_s"] == pytest.approx(entry["measured_s"], rel=1e-12), key
    _same_as_whole(whole, cut)  # the good requests and goodput too, exactly


def test_time_windows_judge_slos_over_every_window(steady: Path) -> None:
    sc = _scenario(name="lo", replicas=3, router="least_outstanding", num_gpu_blocks=2000)
    slos = parse_slos(SLOS)
    whole = replay(steady, [sc], quiet=True, run_id="whole", intervals=False, slos=slos)
    cut = replay(steady, [sc], quiet=True, run_id="cut", shards=3, slos=slos)
    a, b = whole.runs[0].summary, cut.runs[0].summary
    assert b["sharding"]["by"] == "time"
    assert {k: e["met"] for k, e in b["slo"].items()} == {k: e["met"] for k, e in a["slo"].items()}
    assert b["num_good"] == pytest.approx(a["num_good"], rel=0.1)
    assert b["goodput"] == pytest.approx(b["num_good"] / b["duration_s"])
    assert a["slo"]["ttft_p90@model=a"]["measured_s"] is None  # (this trace has no model a)
    for key, entry in a["slo"].items():
        got = b["slo"][key]["measured_s"]
        assert got == (
            None if entry["measured_s"] is None else pytest.approx(entry["measured_s"], rel=0.2)
        ), key


@pytest.mark.slow
def test_replica_groups_on_a_local_ray_cluster(root: Path) -> None:
    sc = _scenario(name="rr", replicas=4, router="round_robin")
    whole = replay(root, [sc], quiet=True, run_id="whole").runs[0]
    with local_ray_cluster() as address:
        cut = replay(root, [sc], quiet=True, run_id="cut", shards=4, ray_address=address)
    cut_run = cut.runs[0]
    assert cut_run.summary.pop("sharding")["workers"] == f"ray {address}"
    _same_as_whole(whole, cut_run)


def test_time_windows_replay_every_request_once(steady: Path) -> None:
    sc = _scenario(name="lo", replicas=4, router="least_outstanding", num_gpu_blocks=4000)
    whole = replay(steady, [sc], quiet=True, run_id="whole", intervals=False).runs[0]
    cut = replay(steady, [sc], quiet=True, run_id="cut", shards=3, shard_warmup_s=2.0).runs[0]
    sharding = cut.summary["sharding"]
    assert (sharding["by"], sharding["shards"], sharding["warmup_s"]) == ("time", 3, 2.0)
    assert not sharding["exact"] and "coupled" in sharding["coupling"]
    ids = _rows(cut.paths["sim_requests"], SIM_REQUESTS, ["request_id"])["request_id"].to_pylist()
    assert sorted(ids) == sorted(
        read_table(whole.paths["sim_requests"], SIM_REQUESTS)["request_id"].to_pylist()
    )
    assert len(set(ids)) == len(ids) == N
    assert whole.summary["max_queue_depth"] > 0  # loaded: a warm-up has queues to refill
    for key in ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "request_throughput"):
        assert cut.summary[key] == pytest.approx(whole.summary[key], rel=0.2), key


def test_what_cannot_be_sharded_is_refused_before_writing(root: Path) -> None:
    sc = _scenario(name="rr", replicas=2)
    auto = _scenario(
        name="auto", replicas=2, autoscale={"max_replicas": 2, "target": 4.0, "startup_s": 30.0}
    )
    for scenarios, kw, words in (([sc, auto], {}, "autoscaling"),):
        with pytest.raises(ScenarioError, match=words) as err:
            replay(root, scenarios, quiet=True, run_id="bad", shards=2, **kw)
        assert "\n" not in str(err.value)
        assert not list(root.rglob("run_id=bad"))


def test_cli_says_how_the_replay_was_cut(root: Path) -> None:
    args = ["replay", "--warehouse", str(root), "--quiet", "--replicas", "4"]
    res = CliRunner().invoke(cli, [*args, "--router", "round_robin", "--shards", "2"])
    assert res.exit_code == 0, res.output
    assert "replayed in 2 replica groups (exact" in res.output
    res = CliRunner().invoke(cli, [*args, "--router", "least_outstanding", "--shards", "2"])
    assert res.exit_code == 0, res.output
    assert "2 time windows, 60 s warm-up each (approximate)" in res.output
    assert "reads the replicas' load" in res.output
    res = CliRunner().invoke(
        cli, [*args, "--router", "round_robin", "--shards", "2", "--slo", "ttft_p50=10s"]
    )
    assert res.exit_code == 0, res.output
    assert "SLOs: ttft_p50 " in res.output and "requests meet every SLO" in res.output
    res = CliRunner().invoke(cli, [*args, "--shards", "2", "--slo", "e2e_p50@prompt<=500=10s"])
    assert res.exit_code == 0 and "SLOs: e2e_p50@prompt<=500 " in res.output, res.output
    res = CliRunner().invoke(cli, [*args, "--ray", "auto"])
    assert res.exit_code == 2 and "give --shards N too" in res.output
    res = CliRunner().invoke(cli, [*args, "--shards", "0"])
    assert res.exit_code == 1 and "--shards" in res.output and "Traceback" not in res.output


def _with_models(table: pa.Table) -> pa.Table:
    models = pa.array(["a" if i % 3 else "b" for i in range(table.num_rows)])
    return table.set_column(table.schema.get_field_index("model"), "model", models)


def test_time_windows_are_read_one_at_a_time(warehouse_with: Callable[..., Path]) -> None:
    """A replay cut by time reads each window (and its warm-up) alone, never the whole
    selection, and replays every selected request once on the whole replay's clock."""
    prompt = np.random.default_rng(5).integers(10, 1500, N)
    prompt[[7, 700]] = 9000  # longer than max_model_len: dropped, one early, one late
    table = _with_models(_table(0.05).set_column(3, "prompt_tokens", pa.array(prompt, pa.int32())))
    root = warehouse_with(table)
    sc = _scenario(
        name="lo", replicas=4, router="least_outstanding", num_gpu_blocks=4000,
        max_model_len=8192, drop_too_long=True,
    )  # fmt: skip
    plan = plan_shards(sc, 5, warmup_s=3.0)
    files = select_request_files(Warehouse(root))
    facts = WindowFacts()
    read = list(read_windows(files, None, sc, plan, facts))
    span = N * 0.05
    assert len(read) == 5 and facts.windows == 5
    assert facts.num_read == N and facts.num_dropped == 2
    for cut in read:  # each window's rows, and its warm-up's: a fifth and ~3 s more
        assert len(cut.inp) < N / 5 + 3.0 / 0.05 * 2.5
    assert sum(len(cut.rows) for cut in read) == N - 2
    whole = replay(root, [sc], quiet=True, run_id="whole", intervals=False).runs[0]
    cut = replay(root, [sc], quiet=True, run_id="cut", shards=5, shard_warmup_s=3.0).runs[0]
    assert cut.summary["sharding"]["streamed_windows"] == 5
    assert cut.summary["num_dropped"] == whole.summary["num_dropped"] == 2
    a = _rows(whole.paths["sim_requests"], SIM_REQUESTS, ["request_id"])
    b = _rows(cut.paths["sim_requests"], SIM_REQUESTS, ["request_id"])
    assert b["request_id"].equals(a["request_id"]) and b.num_rows == N - 2
    np.testing.assert_allclose(b["arrival_s"].to_numpy(), a["arrival_s"].to_numpy(), atol=1e-9)
    assert float(np.max(b["arrival_s"].to_numpy())) == pytest.approx(span, rel=0.2)
    steps = _rows(cut.paths["sim_steps"], SIM_STEPS, ["replica", "start_s"])
    starts = steps.select(["replica", "start_s"]).to_pylist()
    assert len({(r["replica"], r["start_s"]) for r in starts}) == len(starts)  # no step twice
    # (replica, step) is sim_steps' key: unique across the windows, and in time order
    by_step = _rows(cut.paths["sim_steps"], SIM_STEPS, ["replica", "step"])
    keys = by_step.select(["replica", "step"]).to_pylist()
    assert len({(r["replica"], r["step"]) for r in keys}) == len(keys)
    for r in range(4):
        mine = by_step.filter(pc.equal(by_step["replica"], r))["start_s"].to_numpy()
        assert (np.diff(mine) > 0).all()
    for key in ("ttft_p50_s", "e2e_p50_s", "request_throughput"):
        assert cut.summary[key] == pytest.approx(whole.summary[key], rel=0.2), key
    # per class: each window's own classes, put together (models a and b)
    want, got = whole.summary["classes"]["model"], cut.summary["classes"]["model"]
    assert set(got) == set(want) == {"a", "b"}
    for name, entry in want.items():
        assert got[name]["num_requests"] == entry["num_requests"], name
        assert got[name]["ttft_p50_s"] == pytest.approx(entry["ttft_p50_s"], rel=0.2), name
    # a model filter applies in every window
    only_a = RequestFilter(models=("a",))
    kept = replay(root, [sc], quiet=True, run_id="a", selection=only_a, shards=3).runs[0]
    ids = _rows(kept.paths["sim_requests"], SIM_REQUESTS, ["request_id"])["request_id"]
    assert len(ids) == sum(1 for i in range(N) if i % 3 and i not in (7, 700))


def test_windows_with_other_classes_give_each_its_figures(
    warehouse_with: Callable[..., Path],
) -> None:
    """Streamed windows each name only their own classes (an early tenant, a late one,
    one in every window): the summary's classes are every window's, counted whole."""
    table = _table(0.05)
    tenants = pa.array(
        ["early" if i < N // 3 else "late" if i > 2 * N // 3 else "mid" for i in range(N)]
    )
    table = table.set_column(table.schema.get_field_index("tenant"), "tenant", tenants)
    root = warehouse_with(table)
    sc = _scenario(name="lo", replicas=3, router="least_outstanding", num_gpu_blocks=2000)
    slos = parse_slos(["ttft_p99=60s", "ttft_p90@tenant=late=20s"])
    whole = replay(root, [sc], quiet=True, run_id="whole", intervals=False, slos=slos).runs[0]
    cut = replay(root, [sc], quiet=True, run_id="cut", shards=5, slos=slos).runs[0]
    assert cut.summary["sharding"]["streamed_windows"] == 5
    want, got = whole.summary["classes"]["tenant"], cut.summary["classes"]["tenant"]
    assert list(got) == list(want) and set(want) == {"early", "mid", "late"}
    for name, entry in want.items():
        assert got[name]["num_requests"] == entry["num_requests"], name
        assert got[name]["completed"] == entry["completed"], name
        assert got[name]["slo"].keys() == entry["slo"].keys(), name
        assert got[name]["e2e_p50_s"] == pytest.approx(entry["e2e_p50_s"], rel=0.2), name
    assert "ttft_p90@tenant=late" in got["late"]["slo"]


def test_time_windows_give_intervals_near_the_whole_replay_s(steady: Path) -> None:
    """Streamed windows: the bootstrap over every window's requests and the profile
    term's two replays, each read a window at a time again; off with intervals=False."""
    sc = _scenario(name="lo", replicas=3, router="least_outstanding", num_gpu_blocks=2000)
    whole = replay(steady, [sc], quiet=True, run_id="whole").runs[0].summary["intervals"]
    cut = replay(steady, [sc], quiet=True, run_id="cut", shards=3).runs[0].summary
    assert cut["sharding"]["streamed_windows"] == 3
    got = cut["intervals"]
    assert got["num_windows"] >= 20 and got["cost_log_sd"] == whole["cost_log_sd"] > 0
    for key, want in whole["stats"].items():
        s = got["stats"][key]
        assert s["lo"] <= cut[key] <= s["hi"], key
        assert len(s["at_cost"]) == 2 and s["at_cost"][0] <= cut[key] <= s["at_cost"][1], key
        for end in ("lo", "hi"):
            assert s[end] == pytest.approx(want[end], rel=0.25), (key, end)
    off = replay(steady, [sc], quiet=True, run_id="off", shards=3, intervals=False).runs[0]
    assert "intervals" not in off.summary


def test_more_windows_than_requests(steady: Path) -> None:
    """Asked for far more windows than requests, a replay cut by time reads at most one per
    WINDOW_REQUESTS requests, and replays each request once."""
    sc = _scenario(name="lo", replicas=2, router="least_outstanding", num_gpu_blocks=4000)
    run = replay(steady, [sc], quiet=True, run_id="many", shards=1 << 20, jobs=1).runs[0]
    assert 1 < run.summary["sharding"]["streamed_windows"] <= N // WINDOW_REQUESTS
    assert run.summary["num_requests"] == N


def test_what_cannot_be_read_a_window_at_a_time_is_refused(steady: Path) -> None:
    lo = _scenario(name="lo", replicas=2, router="least_outstanding")
    drawn = _scenario(name="drawn", replicas=2, router="least_outstanding", arrivals="poisson",
                      rate=5.0)  # fmt: skip
    for scenarios, kw, words in (
        ([drawn], {}, "reshape the whole replay's arrivals"),
        ([lo], {"selection": RequestFilter(busiest=Busiest(10.0))}, "--busiest picks"),
    ):
        with pytest.raises(ScenarioError, match=words) as err:
            replay(steady, scenarios, quiet=True, run_id="bad", shards=2, **kw)
        assert "\n" not in str(err.value)
        assert not list(steady.rglob("run_id=bad"))
