"""Per-class figures (pipeline.sim.classes): by hand on a few requests, and on a replay
against numpy, plan.slo.evaluate and the class_latency view over the same run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import REQUESTS, SIM_REQUESTS, read_table
from pipeline.plan.slo import evaluate, parse_slos
from pipeline.sim import classes as cl
from pipeline.sim.classes import ClassLabels, labels_of, shown_kinds, summarize_classes
from pipeline.sim.replay import replay
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, make_scenario, requests_table

# six requests: three chat, two batch, one without a tenant; the last one never finished
TENANTS = ["chat", "chat", "chat", "batch", "batch", None]
MODELS = ["m", "m", "m", "m", "m", "m"]
TTFT = np.array([0.10, 0.20, 0.40, 1.00, 3.00, np.nan])
TPOT = np.array([0.01, np.nan, 0.03, 0.05, 0.07, np.nan])  # request 1: one output token
E2E = np.array([1.0, 0.2, 2.0, 5.0, 9.0, np.nan])
QUEUE = np.array([0.0, 0.05, 0.1, 0.5, 2.5, np.nan])
DONE = np.array([True, True, True, True, True, False])
METRICS = {"ttft_s": TTFT, "tpot_s": TPOT, "e2e_s": E2E, "queue_s": QUEUE}


def _classes(slos: Sequence[str] = (), duration_s: float | None = 10.0) -> dict[str, Any]:
    labels = {"tenant": ClassLabels.of(TENANTS), "model": ClassLabels.of(MODELS)}
    return summarize_classes(
        lambda name: METRICS[name], DONE, labels, parse_slos(list(slos)), duration_s
    )


def test_percentiles_per_tenant_by_hand() -> None:
    by_tenant = _classes()["tenant"]
    # ordered by requests, (none) shown like any class
    assert list(by_tenant) == ["chat", "batch", "(none)"]
    chat, batch, none = by_tenant["chat"], by_tenant["batch"], by_tenant["(none)"]
    assert (chat["num_requests"], chat["completed"]) == (3, 3)
    # TTFT of chat 0.1 0.2 0.4: p50 0.2; p90 at 1.8 of 0..2: 0.2 + 0.8 * 0.2
    assert chat["ttft_p50_s"] == pytest.approx(0.2)
    assert chat["ttft_p90_s"] == pytest.approx(0.36)
    assert chat["ttft_p99_s"] == pytest.approx(0.2 + 0.98 * 0.2)
    # TPOT leaves out the one-token request: 0.01 0.03
    assert chat["tpot_p50_s"] == pytest.approx(0.02)
    assert chat["queue_p99_s"] == pytest.approx(0.05 + 0.98 * 0.05)
    # batch: two values, the q-quantile at a + q (b - a)
    assert batch["ttft_p90_s"] == pytest.approx(1.0 + 0.9 * 2.0)
    assert batch["e2e_p50_s"] == pytest.approx(7.0)
    # the unfinished request is replayed but not completed, and has no latency
    assert (none["num_requests"], none["completed"], none["ttft_p99_s"]) == (1, 0, None)
    assert "slo" not in chat  # no SLOs, no verdicts
    # one model only: the table would repeat the whole traffic
    assert shown_kinds(_classes()) == ["tenant"]


def test_the_same_as_numpy_on_the_raw_values() -> None:
    by_tenant = _classes()["tenant"]
    for name, rows in (("chat", [0, 1, 2]), ("batch", [3, 4])):
        for metric, values in METRICS.items():
            v = values[rows]
            v = v[~np.isnan(v)]
            for q in (50, 90, 99):
                key = f"{metric.removesuffix('_s')}_p{q}_s"
                assert by_tenant[name][key] == pytest.approx(np.percentile(v, q)), key


def test_a_class_of_every_request_has_the_whole_traffic_s_figures() -> None:
    """Kinds of one class each (taken once, shared): the whole traffic's figures."""
    labels = {"tenant": ClassLabels.of(["t"] * 6), "model": ClassLabels.of(MODELS)}
    slos = parse_slos(["ttft_p90=1s", "tpot_mean=40ms"])
    got = summarize_classes(lambda name: METRICS[name], DONE, labels, slos, 10.0)
    for kind, name in (("tenant", "t"), ("model", "m")):
        entry = got[kind][name]
        assert (entry["num_requests"], entry["completed"]) == (6, 5)
        for metric, values in METRICS.items():
            v = values[DONE]
            v = v[~np.isnan(v)]
            for q in (50, 90, 99):
                key = f"{metric.removesuffix('_s')}_p{q}_s"
                assert entry[key] == pytest.approx(np.percentile(v, q)), (kind, key)
        assert entry["slo"]["ttft_p90"]["measured_s"] == pytest.approx(np.percentile(TTFT[:5], 90))
        assert entry["slo"]["tpot_mean"]["measured_s"] == pytest.approx(0.04)
        assert entry["num_good"] == 3  # 0, 1 and 2: ttft <= 1 s, tpot <= 40 ms (1: one token)


def test_slos_scoped_to_a_class_judge_only_it_and_unscoped_ones_every_class() -> None:
    slos = [
        "ttft_p99=2s",  # every class
        "ttft_p50@tenant=chat=150ms",  # chat only
        "e2e_p90@tenant=batch=20s",  # batch only
        "tpot_p99@model=m=40ms",  # the model class, never a tenant
        "queue_mean@prompt>100=1s",  # prompt lengths: no class
    ]
    out = _classes(slos)
    chat, batch = out["tenant"]["chat"], out["tenant"]["batch"]
    assert list(chat["slo"]) == ["ttft_p99", "ttft_p50@tenant=chat"]
    assert list(batch["slo"]) == ["ttft_p99", "e2e_p90@tenant=batch"]
    assert chat["slo"]["ttft_p50@tenant=chat"] == {
        "limit_s": 0.15, "measured_s": pytest.approx(0.2), "met": False,
    }  # fmt: skip
    assert chat["slo"]["ttft_p99"]["met"] and not batch["slo"]["ttft_p99"]["met"]
    assert not chat["slo_met"]
    # goodput: chat requests with TTFT <= 2 s and <= 150 ms: 0.1 only; batch: TTFT <= 2 s
    # and E2E <= 20 s: the first only; per second of the whole replay (10 s)
    assert (chat["num_good"], chat["goodput"]) == (1, pytest.approx(0.1))
    assert (batch["num_good"], batch["goodput"]) == (1, pytest.approx(0.1))
    assert out["tenant"]["(none)"]["num_good"] == 0  # it never completed
    m = out["model"]["m"]
    assert list(m["slo"]) == ["ttft_p99", "tpot_p99@model=m"]
    # TPOT of the five completed: 0.01 (0.02 one-token: good) 0.03 0.05 0.07 -> <= 40 ms: 3
    # of them, and TTFT <= 2 s leaves out the 3 s one (whose TPOT fails anyway)
    assert m["num_good"] == 3


def test_unscoped_slos_the_classes_goodputs_add_up_to_the_whole_traffic() -> None:
    slos = parse_slos(["ttft_p99=500ms", "tpot_p50=40ms"])
    out = _classes([str(s).replace("<=", "=") for s in slos], duration_s=4.0)
    done = {k: v[DONE] for k, v in METRICS.items()}
    whole = evaluate(slos, done, 4.0)
    for kind in ("tenant", "model"):
        assert sum(c["goodput"] for c in out[kind].values()) == pytest.approx(whole.goodput)


def test_beyond_max_classes_the_smallest_are_summed_but_not_one_an_slo_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cl, "MAX_CLASSES", 1)
    out = _classes(["ttft_p99@tenant=(none)=1s"])["tenant"]
    # chat kept (largest), (none) kept (an SLO names it), batch summed into (other)
    assert list(out) == ["chat", "(other)", "(none)"]
    assert out["(other)"]["num_requests"] == 2 and out["(other)"]["num_classes"] == 1
    assert out["(other)"]["ttft_p50_s"] == pytest.approx(2.0)


def test_labels_of_a_frame_with_nulls_and_rows() -> None:
    frame = pl.DataFrame({"tenant": ["b", None, "a", "b"], "model": [None] * 4},
                         schema={"tenant": pl.String, "model": pl.String})  # fmt: skip
    labels = labels_of(frame)
    assert labels["tenant"].names == ("(none)", "a", "b")
    assert labels["tenant"].codes.tolist() == [2, 0, 1, 2]
    assert labels["model"].names == ("(none)",)
    picked = labels_of(frame, np.array([3, 2]))
    assert picked["tenant"].codes.tolist() == [2, 1]


# --- on a replay -------------------------------------------------------------------


def _tenant_table(n: int = 120) -> pa.Table:
    rng = np.random.default_rng(3)
    t = requests_table(
        rng.integers(10, 1500, n),
        rng.integers(1, 60, n),
        rng.exponential(0.03, n),
        start=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )
    tenants = pa.array([["chat", "batch", None][i % 3] for i in range(n)], pa.string())
    models = pa.array([["small", "large"][i % 2] for i in range(n)], pa.string())
    t = t.set_column(t.schema.get_field_index("tenant"), "tenant", tenants)
    return t.set_column(t.schema.get_field_index("model"), "model", models)


SLOS = ["ttft_p99=300ms", "ttft_p90@tenant=chat=100ms", "tpot_p50@model=large=20ms",
        "e2e_p99@prompt>1000=5s"]  # fmt: skip


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, Any]:
    root = tmp_path_factory.mktemp("classes") / "wh"
    Warehouse(root).write(REQUESTS, _tenant_table(), {"date": "2024-05-01"}, "src-test")
    sc = make_scenario("vllm", H100_8B_COST, name="v", num_gpu_blocks=400, max_num_seqs=8)
    result = replay(root, [sc], quiet=True, intervals=False, slos=parse_slos(SLOS))
    return Warehouse(root), result


def _sim_frame(wh: Warehouse, result: Any) -> pl.DataFrame:
    (run,) = result.runs
    sim = pl.from_arrow(read_table(run.paths["sim_requests"], SIM_REQUESTS))
    assert isinstance(sim, pl.DataFrame)
    req = pl.from_arrow(_tenant_table().select(["request_id", "tenant", "model"]))
    assert isinstance(req, pl.DataFrame)
    return sim.join(req, on="request_id", how="left")


def test_replay_summary_per_class_is_numpy_on_sim_requests(replayed: tuple[Warehouse, Any]) -> None:
    wh, result = replayed
    sim = _sim_frame(wh, result)
    classes = result.runs[0].summary["classes"]
    assert set(classes) == {"tenant", "model"}
    assert set(classes["tenant"]) == {"chat", "batch", "(none)"}
    for kind in ("tenant", "model"):
        for name, entry in classes[kind].items():
            part = sim.filter(pl.col(kind).fill_null("(none)") == name)
            assert entry["num_requests"] == entry["completed"] == part.height
            for metric in ("ttft", "tpot", "e2e", "queue"):
                v = part[f"{metric}_s"].drop_nulls().to_numpy()
                for q in (50, 90, 99):
                    got = entry[f"{metric}_p{q}_s"]
                    assert got == pytest.approx(float(np.percentile(v, q)), rel=1e-12), (
                        kind, name, metric, q,
                    )  # fmt: skip


def test_replay_whole_traffic_slos_are_plan_slo_evaluate(replayed: tuple[Warehouse, Any]) -> None:
    wh, result = replayed
    sim = _sim_frame(wh, result)
    s = result.runs[0].summary
    metrics = {
        c: sim[c].to_numpy().astype(np.float64) for c in ("ttft_s", "tpot_s", "e2e_s", "queue_s")
    }
    groups = {
        "tenant": sim["tenant"].fill_null("(none)").to_numpy(),
        "model": sim["model"].to_numpy(),
        "prompt_tokens": sim["prompt_tokens"].to_numpy(),
    }
    want = evaluate(parse_slos(SLOS), metrics, s["duration_s"], groups)
    assert {k: v["measured_s"] for k, v in s["slo"].items()} == pytest.approx(want.measured_s)
    assert {k: v["met"] for k, v in s["slo"].items()} == want.met
    assert s["num_good"] == want.num_good and s["goodput"] == pytest.approx(want.goodput)
    assert s["slo_met"] == want.all_met
    # a tenant-scoped SLO has the same value in its class as in the whole traffic's
    key = "ttft_p90@tenant=chat"
    assert s["classes"]["tenant"]["chat"]["slo"][key]["measured_s"] == pytest.approx(
        s["slo"][key]["measured_s"]
    )


def test_class_latency_view_gives_the_summary_s_numbers(replayed: tuple[Warehouse, Any]) -> None:
    wh, result = replayed
    con = wh.connect()
    rows = con.sql(f"SELECT * FROM class_latency WHERE run_id = '{result.run_id}'").pl()
    classes = result.runs[0].summary["classes"]
    assert rows.height == sum(len(v) for v in classes.values())
    for r in rows.to_dicts():
        entry = classes[r["class_kind"]][r["class_name"]]
        assert (r["requests"], r["completed"]) == (entry["num_requests"], entry["completed"])
        for key, value in entry.items():
            if key.endswith("_s"):
                assert r[key] == pytest.approx(value, rel=1e-9), (r["class_name"], key)


# --- the commands' output ----------------------------------------------------------


def _cli_warehouse(tmp_path: Path, table: pa.Table) -> tuple[Path, Path]:
    root = tmp_path / "wh"
    Warehouse(root).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")
    cost = "\n".join(f"{k} = {v!r}" for k, v in H100_8B_COST.items())
    base = tmp_path / "base.toml"
    base.write_text(
        f'policy = "vllm"\nnum_gpu_blocks = 400\nmax_model_len = 4096\n[cost]\n{cost}\n'
    )
    return root, base


def _run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_replay_prints_a_table_per_kind_with_several_classes(tmp_path: Path) -> None:
    root, base = _cli_warehouse(tmp_path, _tenant_table())
    slos = ["--slo", "ttft_p99=300ms", "--slo", "ttft_p90@tenant=chat=100ms"]
    out = _run("replay", "--warehouse", str(root), "--scenario", str(base), "--no-intervals",
               "-q", "--max-num-seqs", "8", *slos)  # fmt: skip
    assert "  per tenant:" in out and "  per model:" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("    ")}
    assert {"(none)", "batch", "chat", "large", "small"} <= set(rows)
    assert "ttft_p90@tenant=chat" in rows["chat"] and "ttft_p90@tenant=chat" not in rows["batch"]
    assert "SLOs: ttft_p99 " in out and "goodput" in out
    data = json.loads(
        _run(
            "replay",
            "--warehouse",
            str(root),
            "--scenario",
            str(base),
            "--no-intervals",
            "-q",
            "--max-num-seqs",
            "8",
            "--json",
            *slos,
        )  # fmt: skip
    )
    (sc,) = data["scenarios"].values()
    chat = sc["summary"]["classes"]["tenant"]["chat"]
    assert set(chat) == {
        "num_requests", "completed", "slo", "slo_met", "num_good", "goodput",
        *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e", "queue") for q in (50, 90, 99)),
    }  # fmt: skip
    assert set(chat["slo"]) == {"ttft_p99", "ttft_p90@tenant=chat"}
    assert set(chat["slo"]["ttft_p99"]) == {"limit_s", "measured_s", "met"}
    assert set(sc["summary"]["slo"]) == {"ttft_p99", "ttft_p90@tenant=chat"}


def test_one_tenant_and_one_model_print_no_class_table(tmp_path: Path) -> None:
    table = _tenant_table()
    table = table.set_column(table.schema.get_field_index("tenant"), "tenant",
                             pa.array(["chat"] * table.num_rows, pa.string()))  # fmt: skip
    table = table.set_column(table.schema.get_field_index("model"), "model",
                             pa.array([None] * table.num_rows, pa.string()))  # fmt: skip
    root, base = _cli_warehouse(tmp_path, table)
    out = _run("replay", "--warehouse", str(root), "--scenario", str(base), "--no-intervals", "-q")
    assert "per tenant" not in out and "per model" not in out
    data = json.loads(_run("replay", "--warehouse", str(root), "--scenario", str(base),
                           "--no-intervals", "-q", "--json"))  # fmt: skip
    (sc,) = data["scenarios"].values()
    assert list(sc["summary"]["classes"]["tenant"]) == ["chat"]  # still in the JSON
    assert list(sc["summary"]["classes"]["model"]) == ["(none)"]


def test_sweep_and_capacity_show_classes(tmp_path: Path) -> None:
    root, base = _cli_warehouse(tmp_path, _tenant_table())
    body = base.read_text().replace("[cost]", "[base.cost]")
    slo = '[slo]\nttft_p99 = "3s"\n"ttft_p90@tenant=chat" = "2.5s"\n'
    grid = tmp_path / "grid.toml"
    grid.write_text(f"[base]\n{body}\n[axes]\nmax_num_seqs = [4, 16]\n{slo}")
    out = _run("sweep", str(grid), "--warehouse", str(root), "-j", "1", "-q")
    tenant_rows = [line.split()[:2] for line in out.split("per tenant:")[1].splitlines()[2:8]]
    assert sorted(tenant_rows) == sorted(
        [s, t] for s in ("max_num_seqs-4", "max_num_seqs-16") for t in ("chat", "batch", "(none)")
    )
    data = json.loads(_run("sweep", str(grid), "--warehouse", str(root), "-j", "1", "-q", "--json"))
    for sc in data["scenarios"].values():
        assert set(sc["summary"]["classes"]["tenant"]) == {"chat", "batch", "(none)"}
    cap = tmp_path / "cap.toml"
    cap.write_text(f"[base]\n{body}\n{slo}")
    args = [str(cap), "--warehouse", str(root), "--search", "concurrency", "--max-concurrency",
            "32", "--no-intervals", "-q"]  # fmt: skip
    out = _run("capacity", *args)
    assert "there, per class (" in out and "    per tenant:" in out
    data = json.loads(_run("capacity", *args, "--json"))
    search = data["searches"]["concurrency"]
    answer = next(p for p in search["probes"] if p["value"] == search["answer"])
    assert search["answer_classes"] == answer["summary"]["classes"]
    assert search["answer_classes"]["tenant"]["chat"]["slo_met"] is True


def test_labels_of_one_frame_are_read_once_and_let_go_with_it() -> None:
    import gc

    frame = pl.DataFrame({"tenant": ["x", "y"], "model": ["m", None]})
    first = labels_of(frame)
    assert labels_of(frame) is first  # a sweep prepares every scenario from one frame
    other = pl.DataFrame({"tenant": ["z"], "model": ["m"]})
    assert labels_of(other)["tenant"].names == ("z",)
    del frame, other
    gc.collect()
    assert not cl._last


def test_replay_bad_slo_is_one_line(tmp_path: Path) -> None:
    root, base = _cli_warehouse(tmp_path, _tenant_table(12))
    r = CliRunner().invoke(
        cli, ["replay", "--warehouse", str(root), "--scenario", str(base), "--slo",
              "ttft_p99@tenant=chat=200"],
    )  # fmt: skip
    assert r.exit_code == 1
    assert "--slo" in r.output and "give a unit" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert not Warehouse(root).files(SIM_REQUESTS)  # checked before anything ran
