"""``tracereplay replay``: requests -> simulated runs, one per scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from pipeline.busiest import selection_lines
from pipeline.cli import options as opt
from pipeline.cli.classes import class_lines
from pipeline.cli.pools import pool_lines
from pipeline.config import load_config, warehouse_path
from pipeline.objectstore import display
from pipeline.plan.slo import parse_slos
from pipeline.pricing import format_cost, gpu_prices, scenario_cost
from pipeline.sim.policies import POLICIES
from pipeline.sim.replay import ReplayResult, ScenarioRun
from pipeline.sim.replay import replay as replay_requests
from pipeline.sim.scenario import Scenario, resolve_scenarios
from pipeline.sim.trace_prefix import no_hashes_warning, observed_line
from pipeline.text import format_duration, render_table, seconds


def _fmt(x: float | None, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x * scale:,.{digits}f} {unit}"


def format_run(run: ScenarioRun, prices: dict[str, float] | None = None) -> str:
    sc, s = run.scenario, run.summary
    cost = format_cost(scenario_cost(prices or {}, sc, s))
    replicas = f"{sc.replicas} replica" + ("s" if sc.replicas > 1 else "")
    dropped = f", {run.num_dropped:,} dropped (too long)" if run.num_dropped else ""
    return "\n".join(
        [
            f"{sc.name} ({_engines(sc, replicas)}): {s['num_requests']:,} requests{dropped}",
            f"  completed {s['completed']:,} in {format_duration(s['duration_s'])}: "
            f"{_fmt(s['request_throughput'], 'req/s', digits=2)}, "
            f"{_fmt(s['output_token_throughput'], 'output tok/s', digits=0)}, "
            f"{_fmt(s['total_token_throughput'], 'total tok/s', digits=0)}",
            *_latency_lines(s),
            *_disagg_lines(s),
            *_autoscale_lines(s),
            f"  latencies {_basis(s)}",
            *_slo_lines(s),
            *pool_lines(s),
            *class_lines(s),
            f"  queue depth max {s['max_queue_depth']:,} mean {s['mean_queue_depth']:.1f}   "
            f"preemptions {s['num_preemptions']:,}   KV peak {s['kv_peak_usage']:.1%} "
            f"({s['kv_peak_blocks']:,} of {s['num_kv_blocks']:,} blocks)   "
            f"{s['num_steps']:,} steps, simulated in {run.sim_s:.2f} s",
            *_prefix_lines(s),
            *_sharding_lines(s),
            *[
                f"  {x}"
                for x in (observed_line(s), no_hashes_warning(sc.prefix_caching, s), cost)
                if x
            ],
        ]
    )


def _sharding_lines(s: dict[str, Any]) -> list[str]:
    """How a sharded replay was cut (the summary's ``sharding`` entry)."""
    d = s.get("sharding")
    if not d:
        return []
    line = f"  replayed in {d['description']}"
    return [line + (f"; {d['coupling']}" if d.get("coupling") else "")]


def _disagg_lines(s: dict[str, Any]) -> list[str]:
    """A disaggregated replay's TTFT in its parts (the summary's ``disagg`` entry)."""
    d = s.get("disagg")
    if not d or not d.get("num_requests"):
        return []

    def part(name: str) -> str:
        p50, p99 = d.get(f"{name}_p50_s"), d.get(f"{name}_p99_s")
        return f"p50 {format_duration(p50)} p99 {format_duration(p99)}"

    return [
        f"  disaggregated TTFT in parts ({d['num_requests']:,} requests): prefill "
        f"{part('prefill')}; KV transfer {part('kv_transfer')}; decode wait {part('decode_wait')}"
    ]


def _autoscale_lines(s: dict[str, Any], indent: str = "  ") -> list[str]:
    """What an autoscaled replay's (or each autoscaled pool's) scaling came to."""
    out = []
    entries = [("", s.get("autoscale"))] + [
        (f"pool {name}: ", p.get("autoscale")) for name, p in (s.get("pools") or {}).items()
    ]
    for label, a in entries:
        if not a:
            continue
        line = (
            f"{indent}{label}autoscaled: active replicas mean {a['mean_active']:.2f}, peak "
            f"{a['peak_active']}; {a['scale_ups']} scale-ups, {a['scale_downs']} scale-downs; "
            f"{a['gpu_hours']:,.3g} GPU-hours against {a['gpu_hours_at_max']:,.3g} at max "
            f"({a['gpu_hours_saved_share']:.0%} saved); start-up {format_duration(a['startup_s'])}"
        )
        during = a.get("during_scale_ups")
        if during:
            over = ", ".join(f"{n:,} over {k}" for k, n in during["over_limit"].items())
            line += f"; {during['num_requests']:,} requests arrived while replicas were starting"
            line += f" ({over})" if over else ""
        out.append(line)
    return out


def _engines(sc: Scenario, replicas: str) -> str:
    """``vllm, 4 replicas, <profile>``; a fleet's pools' policies and profiles, each once
    (``fleet of 2 pools: vllm, 3 replicas, <profile a> + <profile b>``)."""
    if not sc.pools:
        return f"{sc.policy}, {replicas}, {sc.profile}"
    policies = list(dict.fromkeys(p.scenario.policy for p in sc.pools))
    profiles = list(dict.fromkeys(p.scenario.profile for p in sc.pools))
    return (
        f"fleet of {len(sc.pools)} pools: {' + '.join(policies)}, {replicas}, "
        f"{' + '.join(profiles)}"
    )


def _slo_lines(s: dict[str, Any]) -> list[str]:
    """Each SLO's statistic against its limit, and the goodput (with --slo)."""
    slo = s.get("slo")
    if not slo:
        return []
    cells = [
        f"{key} {seconds(v['measured_s'])} of {seconds(v['limit_s'])} "
        + ("met" if v["met"] else "MISSED")
        for key, v in slo.items()
    ]
    return [
        f"  SLOs: {', '.join(cells)}",
        f"  goodput {_fmt(s.get('goodput'), 'req/s', digits=2)} "
        f"({s.get('num_good', 0):,} requests meet every SLO)",
    ]


def _basis(s: dict[str, Any]) -> str:
    """Which latencies the figures are: a client's (with the profile's front end, and the
    engine core's TTFT beside them) or the engine core's."""
    if s.get("latency_basis") != "client":
        return "at the engine core (the profile has no front end)"
    return (
        f"as a client sees them (the profile's front end included); engine TTFT p50 "
        f"{format_duration(s.get('engine_ttft_p50_s'))} "
        f"p99 {format_duration(s.get('engine_ttft_p99_s'))}"
    )


# rows of the latency table: label, summary key prefix (each cell in the unit that reads)
_LATENCY_ROWS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e"))


def _latency_lines(s: dict[str, Any]) -> list[str]:
    """TTFT and TPOT percentiles on one line; with intervals, a table of TTFT, TPOT and
    E2E p50/p90/p99, each with its 90% interval, and where the intervals come from."""
    iv = s.get("intervals")
    if not iv:
        return [
            f"  TTFT p50 {format_duration(s['ttft_p50_s'])}  "
            f"p90 {format_duration(s['ttft_p90_s'])}  p99 {format_duration(s['ttft_p99_s'])}   "
            f"TPOT p50 {format_duration(s['tpot_p50_s'])}  p99 {format_duration(s['tpot_p99_s'])}"
        ]
    stats = iv.get("stats", {})
    rows = []
    for label, metric in _LATENCY_ROWS:
        cells = [label]
        for q in (50, 90, 99):
            value = s.get(f"{metric}_p{q}_s")
            cell = format_duration(value)
            bounds = stats.get(f"{metric}_p{q}_s")
            if bounds:
                cell += f" ({format_duration(bounds['lo'])} to {format_duration(bounds['hi'])})"
            cells.append(cell)
        rows.append(cells)
    level = f"{iv['level']:.0%}"
    table = render_table(["", "p50", "p90", "p99"], rows)
    lines = ["  " + line for line in table.splitlines()]
    lines.append(f"  ({level} intervals) {interval_sources(iv)}")
    lines += [f"  note: {note}" for note in iv.get("notes", [])]
    return lines


def interval_sources(iv: dict[str, Any]) -> str:
    """Where a summary's intervals come from, in one line."""
    if iv.get("num_windows"):
        arrivals = (
            f"arrivals: a block bootstrap over {iv['num_windows']} windows of "
            f"~{iv['window_requests']:,} requests ({iv['resamples']} resamples)"
        )
    else:
        arrivals = "arrivals: none"
    sd = iv["cost_log_sd"]
    if not sd:
        profile = "profile: left out (step-time sd 0)"
    else:
        kind = "a default, " if iv.get("cost_sd_default") else ""
        profile = f"profile: step-time sd {sd:.3g} ({kind}{iv['cost_sd_source']})"
    return f"{arrivals}; {profile}"


def _prefix_lines(s: dict[str, Any]) -> list[str]:
    """The prefix-cache line, when the scenario looked anything up."""
    if not s.get("prefix_query_tokens"):
        return []
    lines = [
        f"  prefix cache: token hit rate {s['prefix_token_hit_rate']:.1%}, request hit rate "
        f"{s['prefix_request_hit_rate'] or 0:.1%}, evicted {s['prefix_evicted_blocks']:,} "
        "cache units"
    ]
    if s.get("prefix_bridged"):
        lines.append(f"  note: {s['prefix_bridging']}")
    return lines


def result_dict(
    result: ReplayResult, warehouse: Path, prices: dict[str, float] | None = None
) -> dict[str, Any]:
    return {
        "run_id": result.run_id,
        "warehouse": str(warehouse),
        "num_requests_read": result.num_requests_read,
        "inputs": result.inputs,
        "selection": result.selection,
        "scenarios": {
            r.scenario.name: {
                "config": r.scenario.to_dict(),
                "summary": r.summary,
                "cost": scenario_cost(prices or {}, r.scenario, r.summary),
            }
            for r in result.runs
        },
    }


@click.command(name="replay")
@opt.warehouse
@opt.config_file
@opt.selection
@click.option(
    "--scenario",
    "scenario_files",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Scenario TOML file (repeatable); flags below override its values.",
)
@click.option("--name", default=None, help="Scenario name (names the output files).")
@click.option(
    "--slo",
    "slo_items",
    multiple=True,
    metavar="KEY=LIMIT",
    help="Objective for goodput and met/not met, whole traffic and per class, e.g. "
    "ttft_p99=200ms or ttft_p99@tenant=chat=200ms (repeatable).",
)
@opt.scenario_flags
@opt.intervals
@opt.jobs
@opt.shards
@opt.ray
@opt.gpu_hour_price
@opt.output
@opt.locked
def replay_command(
    warehouse: Path | None,
    config_file: Path | None,
    requests: opt.Requests,
    scenario_files: tuple[Path, ...],
    name: str | None,
    slo_items: tuple[str, ...],
    scenario_flags: dict[str, Any],
    sets: tuple[str, ...],
    no_intervals: bool,
    jobs: int | None,
    shards: int | None,
    shard_warmup_s: float | None,
    ray_address: str | None,
    gpu_hour_price: float | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Replay requests through scheduler scenarios; write sim_requests and sim_steps.

    Scenarios come from TOML files (--scenario, repeatable) and/or flags
    (flags override every file; without files the flags make one scenario).
    Policies: {policies}; see docs/replay.md for every key.
    Prints per scenario: throughput, TTFT, TPOT and E2E percentiles with their
    90% intervals (arrivals: a block bootstrap of the replayed requests;
    profile: two more replays at the step cost's error, beside the main one
    on a spare core (--jobs 1: one after the other); --no-intervals leaves
    them out), queue depth, preemptions and KV peak usage; per tenant and per
    model (where there are several) the same percentiles, and with --slo each
    SLO's verdict and the goodput, whole traffic and per class; for a fleet
    ([[pool]] tables), one row per pool: its replicas, policy, profile, TTFT
    and TPOT (and its SLOs met).

    --shards N replays each scenario in N parts, one after the other, so that a
    fleet's day fits in memory: groups of replicas under round_robin (exact:
    the same rows as one replay), else time windows, each after --shard-warmup
    of the traffic before it (approximate; the summary says which). A sharded
    summary has a whole one's figures: SLO verdicts, per-class figures and
    intervals (--no-intervals to keep less in memory).
    The parts run --jobs at once in local processes, or on a Ray cluster with
    --ray ADDRESS (which needs --shards).

    Example:

    \b
        tracereplay replay --policy vllm --max-num-seqs 256
        tracereplay replay --scenario examples/scenarios/vllm.toml \\
            --scenario examples/scenarios/static.toml --from 2023-11-16 --json
    """
    if ray_address is not None and shards is None:
        raise click.UsageError("--ray replays the parts of a sharded replay: give --shards N too")
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    values = {"name": name, **scenario_flags, **opt.parse_sets(sets)}
    scenarios = resolve_scenarios(
        list(scenario_files), values, defaults=dict(cfg.sections.get("replay", {}))
    )
    result = replay_requests(
        wh,
        scenarios,
        **requests.kwargs(),
        quiet=quiet,
        intervals=not no_intervals,
        slos=parse_slos(slo_items),
        jobs=jobs,
        shards=shards,
        shard_warmup_s=shard_warmup_s,
        ray_address=ray_address,
    )
    prices = gpu_prices(cfg, gpu_hour_price)
    if as_json:
        click.echo(json.dumps(result_dict(result, wh, prices), indent=2))
        return
    for line in selection_lines(result.selection):
        click.echo(line)
    for run in result.runs:
        click.echo(format_run(run, prices))
    click.echo(f"run {result.run_id}: {len(result.runs)} scenario(s) written to {display(wh)}")


# the policies as the registry has them, so the help never leaves one out
assert replay_command.help is not None
replay_command.help = replay_command.help.replace("{policies}", ", ".join(POLICIES))

replay = replay_command
