"""Report layout for many scenarios: natural order, small multiples, interactive legends."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.report import charts
from pipeline.report.charts.common import FADED, FOCUS, LEGEND_PICK
from pipeline.report.charts.engine import engine_timeline
from pipeline.report.charts.latency import latency_cdf
from pipeline.report.charts.trace import arrival_rate, quarantine_reasons
from pipeline.report.layout import build_layout, natural_sorted, sweep_axes


def test_natural_sort_orders_numbers_by_value() -> None:
    names = ["vllm-128", "vllm-16", "vllm-2", "static-4", "vllm-2.5", "10: b", "1: a", "11: c"]
    assert natural_sorted(names) == [
        "1: a", "10: b", "11: c", "static-4", "vllm-2", "vllm-2.5", "vllm-16", "vllm-128"
    ]  # fmt: skip


def _sweep(policies: list[str], caps: list[int], rates: list[float]) -> dict[str, Any]:
    configs = {}
    for p in policies:
        for c in caps:
            for r in rates:
                name = f"{p}-c{c}-r{r}"
                configs[name] = {"name": name, "policy": p, "max_num_seqs": c, "rate": r,
                                 "block_size": 16}  # fmt: skip
    return configs


def test_axes_are_the_keys_that_vary_policy_first() -> None:
    assert sweep_axes(_sweep(["vllm", "sglang"], [16, 64], [1.0])) == ["policy", "max_num_seqs"]


def test_few_scenarios_one_colour_each_no_panels() -> None:
    configs = _sweep(["vllm"], [16, 64, 128], [1.0])
    layout = build_layout(list(configs), configs, {n: "vllm" for n in configs})
    assert not layout.faceted
    assert layout.series == {n: n for n in configs}
    assert list(layout.scenarios) == ["vllm-c16-r1.0", "vllm-c64-r1.0", "vllm-c128-r1.0"]


def test_thirty_scenarios_facet_by_policy_colour_by_the_other_axes() -> None:
    configs = _sweep(["vllm", "sglang", "tgi"], [8, 16, 32, 64, 128], [1.0, 4.0])
    policies = {n: c["policy"] for n, c in configs.items()}
    layout = build_layout(list(configs), configs, policies)
    assert len(layout.scenarios) == 30
    assert layout.facet_by == "policy"
    assert layout.panels == ["policy=sglang", "policy=tgi", "policy=vllm"]
    # ten series, each the same combination (so the same colour) in every panel
    assert len(layout.series_names) == 10
    assert layout.series["vllm-c16-r4.0"] == layout.series["tgi-c16-r4.0"]
    assert layout.series["vllm-c16-r4.0"] == "max_num_seqs=16, rate=4"
    assert layout.series_names[:2] == ["max_num_seqs=8, rate=1", "max_num_seqs=8, rate=4"]


def test_one_policy_facets_by_the_coarsest_axis() -> None:
    configs = _sweep(["vllm"], [8, 16, 32, 64, 128, 256], [1.0, 4.0])
    layout = build_layout(list(configs), configs, {n: "vllm" for n in configs})
    assert layout.facet_by == "rate"
    assert len(layout.panels) == 2 and len(layout.series_names) == 6


def _cdf(names: list[str]) -> pl.DataFrame:
    rows = [{"scenario": n, "metric": "ttft_s", "value_s": v, "num_requests": 1,
             "fraction": f} for n in names for v, f in ((0.01, 0.5), (5.0, 1.0))]  # fmt: skip
    return pl.DataFrame(rows)


def test_many_scenarios_become_small_multiples_with_a_legend_selection() -> None:
    configs = _sweep(["vllm", "sglang", "tgi"], [8, 16, 32, 64, 128], [1.0, 4.0])
    layout = build_layout(list(configs), configs, {n: c["policy"] for n, c in configs.items()})
    opts = charts.ChartOptions(title="t", scenarios=layout.scenarios, layout=layout,
                               extra={"metric": "ttft_s"})  # fmt: skip
    spec = latency_cdf(_cdf(list(configs)), opts).to_dict()
    assert spec["facet"]["field"] == "panel" and spec["columns"] == 2
    params = {p["name"]: p for p in spec["params"]}
    assert params[LEGEND_PICK]["bind"] == "legend"
    assert params[FOCUS]["value"] == ""
    enc = spec["spec"]["layer"][0]["encoding"]  # the lines; the SLO rules layered on them
    assert enc["color"]["scale"]["scheme"] == "tableau10"  # ten series: ten distinct colours
    assert enc["color"]["scale"]["domain"] == layout.series_names
    assert enc["opacity"]["value"] == FADED
    # values spanning 2.7 decades get a log axis, and it says so
    assert enc["x"]["scale"]["type"] == "log" and "log scale" in enc["x"]["title"]


def test_narrow_values_get_a_linear_axis() -> None:
    df = _cdf(["a", "b"]).with_columns(pl.col("value_s") / 5.0 + 0.1)
    spec = latency_cdf(df, charts.ChartOptions(title="t", scenarios=("a", "b"))).to_dict()
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "linear"
    assert "facet" not in spec


def test_arrival_axis_is_utc_on_a_24_hour_clock() -> None:
    t0 = datetime(2024, 5, 1, 18, 20, tzinfo=UTC)
    df = pl.DataFrame({"bucket_start": [t0, t0 + timedelta(minutes=10)], "bucket_s": [600.0] * 2,
                       "num_requests": [1, 2], "requests_per_s": [0.1, 0.2],
                       "prompt_tokens_per_s": [1.0, 2.0]})  # fmt: skip
    spec = arrival_rate(df, charts.ChartOptions(title="t")).to_dict()
    assert spec["encoding"]["x"]["axis"]["format"] == "%H:%M:%S"
    assert spec["data"]["values"][0]["bucket_start"] == "2024-05-01T18:20:00.000Z"
    assert spec["data"]["values"][0]["bucket_start_utc"] == "2024-05-01 18:20:00 UTC"
    # drawn (vl-convert, the engine the browser runs): 18:20, never 06:20 or 6 PM
    import re

    import vl_convert

    svg = vl_convert.vegalite_to_svg(spec)
    labels = re.findall(r">(\d\d:\d\d:\d\d)</text>", svg)
    assert labels and labels[0] == "18:20:00" and all(x.startswith("18:") for x in labels)


def test_a_one_record_quarantine_bar_is_drawn_and_labelled() -> None:
    df = pl.DataFrame({"reason": ["bad time", "rare"], "source_format": ["gateway"] * 2,
                       "num_records": [10_000, 1]})  # fmt: skip
    spec = quarantine_reasons(df, charts.ChartOptions(title="t")).to_dict()
    rows = {r["reason"]: r for r in spec["data"]["values"]}
    assert rows["rare"]["num_records"] == 1
    assert rows["rare"]["num_records_drawn"] >= 0.005 * 10_000  # visible beside the big one
    texts = [layer for layer in spec["layer"] if layer["mark"]["type"] == "text"]
    assert texts[0]["encoding"]["text"]["field"] == "num_records"


def test_engine_axis_is_cut_where_most_scenarios_end() -> None:
    rows = []
    for name, end in (("a", 100.0), ("b", 120.0), ("c", 110.0), ("probe-slow", 6_000_000.0)):
        step = end / 10
        for i in range(10):
            rows.append({"scenario": name, "bucket_start_s": i * step, "bucket_s": step,
                         "kv_usage": 0.5, "mean_running": 1.0, "mean_waiting": 0.0,
                         "max_waiting": 0, "num_preemptions": 0})  # fmt: skip
    spec = engine_timeline(pl.DataFrame(rows), charts.ChartOptions(title="t")).to_dict()
    assert max(v["bucket_start_s"] for v in spec["data"]["values"]) <= 4 * 115.0
    assert "1 scenario run longer" in json.dumps(spec["title"])


def test_header_counts_say_one_model_or_none_recorded() -> None:
    from pipeline.report import _count

    assert _count(1, "model", "models") == "1 model"
    assert _count(3, "model", "models") == "3 models"
    assert _count(0, "tenant", "tenants") == "no tenant recorded"


def test_engine_timeline_query_cuts_one_long_scenario(tmp_path: Path) -> None:
    """Three scenarios end at 10-12 s, a slow probe at 5,000 s: the axis ends at 4 x the
    median end (4 x 11.5 = 46 s), buckets are sized for it, and scenario_end_s keeps 5,000."""
    from pipeline.contracts import SCENARIOS, SIM_STEPS
    from pipeline.report.sql import query
    from pipeline.warehouse import Warehouse
    from tests.helpers import config, step, table, write_run

    wh = Warehouse(tmp_path / "wh")
    write_run(wh, "R", 1)  # a run's rows show once it has its runs row
    ends = {"a": 10.0, "b": 11.0, "c": 12.0, "slow": 5000.0}
    for name, end in ends.items():
        rows = [step(name, 0, i, i * end / 10, end / 10, running=1, used=10) for i in range(10)]
        wh.write(SIM_STEPS, table(SIM_STEPS, rows), {"run_id": "R"}, name)
    meta = [{"scenario": n, "policy": "vllm", "replicas": 1, "profile": "tiny",
             "config_json": config(n, "vllm", 4), "summary_json": "{}"} for n in ends]  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": "R"}, "scenarios")
    df = query(wh.connect(), "engine_timeline")
    assert df["bucket_s"].unique().to_list() == [0.2]  # 46 s / 300 buckets -> 0.2 s
    assert float(df["bucket_start_s"].max()) < 4 * 11.5  # type: ignore[arg-type]
    got = dict(df.group_by("scenario").agg(pl.col("scenario_end_s").first()).iter_rows())
    assert got == ends
    spec = engine_timeline(df, charts.ChartOptions(title="t")).to_dict()
    assert "time axis cut at 46 s; 1 scenario run longer" in json.dumps(spec["title"])


def test_booleans_read_yes_and_no_in_tables() -> None:
    from pipeline.report.render import fmt

    assert fmt(True, "text") == ("yes", False) and fmt(False, "text") == ("no", False)


def test_labels_name_every_key_that_varies_and_only_those() -> None:
    base = {"policy": "vllm", "block_size": 16, "profile": "p", "rate": None, "replicas": 2,
            "num_kv_blocks": 100, "cost": {"fixed_s": 0.01}}  # fmt: skip
    configs = {
        f"s{i}": {**base, "name": f"s{i}", "max_num_seqs": cap, "max_num_batched_tokens": tok,
                  **({"rate": 4.0} if i == 3 else {})}
        for i, (cap, tok) in enumerate([(16, 2048), (64, 2048), (16, 8192), (64, 8192)])
    }  # fmt: skip
    # num_kv_blocks and the profile's cost table follow from other keys: never an axis
    configs["s2"] = {**configs["s2"], "num_kv_blocks": 90, "cost": {"fixed_s": 0.02}}
    layout = build_layout(list(configs), configs, {n: "vllm" for n in configs})
    assert layout.label("s0") == "max_num_batched_tokens=2048, max_num_seqs=16, rate unset"
    assert layout.label("s3") == "max_num_batched_tokens=8192, max_num_seqs=64, rate=4"
    assert layout.label("s2", without=("max_num_seqs",)) == (
        "max_num_batched_tokens=8192, rate unset"
    )
    # one scenario: nothing varies
    one = build_layout(["s0"], {"s0": configs["s0"]}, {"s0": "vllm"})
    assert one.label("s0") == ""


def test_a_null_value_is_unset_in_every_legend_never_none() -> None:
    configs = {
        f"c{c}-r{r}": {"name": f"c{c}-r{r}", "policy": "vllm", "max_num_seqs": c, "rate": r}
        for c in (8, 16, 32, 64, 128, 256)
        for r in (None, 2.0)
    }
    layout = build_layout(list(configs), configs, {n: "vllm" for n in configs})
    shown = [*layout.panels, *layout.series_names, *(layout.label(n) for n in configs)]
    assert not [s for s in shown if "None" in s]
    assert "rate unset" in layout.panels


def test_the_cap_chart_joins_only_scenarios_equal_but_for_the_cap() -> None:
    from pipeline.report.charts.queueing import ttft_vs_concurrency_cap

    # two sweeps of the cap (max_num_batched_tokens 2048 and 8192) and three replica probes
    # at one cap: five lines' worth of series, not one sawtooth
    rows, configs = [], {}
    for name, cap, tok, reps in [("a16", 16, 2048, 1), ("a64", 64, 2048, 1),
                                 ("b16", 16, 8192, 1), ("b64", 64, 8192, 1),
                                 ("r2", 256, 2048, 2), ("r3", 256, 2048, 3)]:  # fmt: skip
        configs[name] = {"name": name, "policy": "vllm", "max_num_seqs": cap,
                         "max_num_batched_tokens": tok, "replicas": reps}  # fmt: skip
        rows.append({"scenario": name, "policy": "vllm", "max_concurrency": cap,
                     "offered_requests_per_s": 2.0, "p99_ttft_s": 0.1 * cap ** 0.5})  # fmt: skip
    layout = build_layout(list(configs), configs, {n: "vllm" for n in configs})
    opts = charts.ChartOptions(title="t", scenarios=layout.scenarios, layout=layout)
    spec = ttft_vs_concurrency_cap(pl.DataFrame(rows), opts).to_dict()
    series = {r["scenario"]: r["series"] for r in spec["data"]["values"]}
    assert series["a16"] == series["a64"] == "max_num_batched_tokens=2048, replicas=1"
    assert series["b16"] == series["b64"] != series["a16"]
    assert len({series["r2"], series["r3"], series["a16"]}) == 3
