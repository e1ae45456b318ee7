"""``tracereplay capacity``: SLO searches for the highest cap and rate, the fewest replicas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from pipeline.busiest import selection_lines
from pipeline.cli import options as opt
from pipeline.cli.sweep import number, seconds
from pipeline.config import load_config, warehouse_path
from pipeline.errors import ConfigError
from pipeline.objectstore import display
from pipeline.plan.capacity import (
    ALL_SEARCHES,
    CapacityResult,
    SearchOutcome,
    capacity_inputs,
    run_capacity,
)
from pipeline.plan.intervals import FEWEST, Spread
from pipeline.plan.recommend import (
    DEFAULT_MARGIN_PCT,
    default_path,
    format_recommendation,
    recommend,
    recommendation_dict,
    write_recommendation,
)
from pipeline.plan.slo import Slo, format_seconds
from pipeline.pricing import deployment_cost, format_cost, gpu_prices
from pipeline.sim.intervals import LEVEL
from pipeline.text import render_table


def _value(search: SearchOutcome, x: float | None) -> str:
    if x is None:
        return "none"
    return f"{x:,.3g} req/s" if search.spec.kind == "rate" else f"{int(x):,}"


def _bare(search: SearchOutcome, x: float) -> str:
    return f"{x:,.3g}" if search.spec.kind == "rate" else f"{int(x):,}"


def answer_text(search: SearchOutcome) -> str:
    """``3.07 req/s (2.95-3.19 within the 90% interval)``, ``4 (3-5 within ...)``."""
    text = _value(search, search.answer)
    iv = search.interval
    if iv is None or search.answer is None:
        return text
    level = f"the {LEVEL:.0%} interval"
    if search.spec.kind in FEWEST:
        low = _bare(search, iv.lo if iv.lo is not None else search.answer)
        if iv.hi is None:
            return f"{text} ({low} to more than {_bare(search, search.hi)} within {level})"
        return f"{text} ({low}-{_bare(search, iv.hi)} within {level})"
    high = _bare(search, iv.hi if iv.hi is not None else search.answer)
    if iv.lo is None:
        return f"{text} (up to {high} within {level}; none in the range is safe at {LEVEL:.0%})"
    return f"{text} ({_bare(search, iv.lo)}-{high} within {level})"


def _bounded(value: float | None, bounds: tuple[float, float] | None) -> str:
    """``199.5ms (188.1ms-214.2ms)``."""
    if value is None:
        return "-"
    shown = format_seconds(float(f"{value:.4g}"))
    if bounds is None:
        return shown
    lo, hi = (format_seconds(float(f"{b:.3g}")) for b in bounds)
    return f"{shown} ({lo}-{hi})"


def _slo_cell(v: float | None, spread: Spread | None) -> str:
    """A probe's statistic, with its interval when there is one."""
    if spread is None or not v:
        return seconds(v)
    return _bounded(v, spread.bounds(v))


def interval_lines(search: SearchOutcome, slos: list[Slo]) -> list[str]:
    """At the answer: each SLO's statistic with its interval and limit, safe or not; and
    what the interval rests on."""
    iv, at = search.interval, search.answer_probe
    if iv is None or at is None or at.slo is None or search.answer is None:
        return []
    level = f"{LEVEL:.0%}"
    cells = []
    spreads = iv.spread_at(search.answer)
    for s in slos:
        v = at.slo.measured_s[s.key]
        bounds = spreads[s.key].bounds(v) if v else None
        cells.append(f"{s.key} {_bounded(v, bounds)} against {format_seconds(s.limit_s)}")
    if iv.safe:
        verdict = f"safe at {level}: every upper bound is within its limit"
    else:
        verdict = f"not safe at {level}: an upper bound is above its limit"
        unit = {"replicas": "replicas are", "swap_space": "GiB of swap space is"}.get(
            search.spec.kind, "GiB of CPU KV tier is"
        )
        if search.spec.kind in FEWEST and iv.hi is not None:
            verdict += f"; {_bare(search, iv.hi)} {unit} safe at {level}"
        elif search.spec.kind in FEWEST:
            none = {"replicas": "count", "swap_space": "swap space"}.get(
                search.spec.kind, "CPU KV tier size"
            )
            verdict += f"; no {none} in the range is safe at {level}"
        elif iv.lo is not None:
            verdict += f"; safe at {level} up to {_value(search, iv.lo)}"
    unc = iv.uncertainty
    if unc.log_sd:
        kind = "a default: " if unc.is_default else ""
        profile = f"step-time sd {unc.log_sd:.3g} ({kind}{unc.source})"
    else:
        profile = "left out (step-time sd 0)"
    return [
        f"  at {_value(search, search.answer)}: {', '.join(cells)}: {verdict}",
        f"  {level} intervals: arrivals from {iv.num_replicates} replicates ({iv.arrivals}); "
        f"profile: {profile}",
    ]


def answer_cost(search: SearchOutcome, prices: dict[str, float]) -> dict[str, Any] | None:
    """The deployment's cost at the search's answer (None: no answer or no price)."""
    at = search.answer_probe
    if at is None or at.run is None:
        return None
    sc = at.run.scenario
    return deployment_cost(prices, sc.profile, sc.replicas, at.run.summary)


def answer_classes(search: SearchOutcome) -> dict[str, Any] | None:
    """Per tenant and per model at the search's answer (None: no answer)."""
    at = search.answer_probe
    if at is None or at.run is None:
        return None
    classes: dict[str, Any] = at.run.summary.get("classes") or {}
    return classes


def answer_class_lines(search: SearchOutcome) -> list[str]:
    """The per-class tables at the answer, where a kind has several classes."""
    from pipeline.cli.classes import class_lines

    classes, at = answer_classes(search), search.answer_probe
    if not classes or at is None:
        return []
    lines = class_lines({"classes": classes}, indent="    ")
    return [f"  there, per class ({at.name}):", *lines] if lines else []


def format_search(
    search: SearchOutcome,
    slos: list[Slo],
    base_rate: float | None,
    prices: dict[str, float] | None = None,
) -> str:
    kind = search.spec.kind
    rate = search.spec.rate or base_rate
    head = {
        "concurrency": f"highest {search.knob} that meets every SLO at {number(rate)} req/s",
        "rate": f"highest request rate that meets every SLO (within {search.spec.tolerance:.0%})",
        "replicas": f"fewest replicas that meet every SLO at {number(rate)} req/s",
        "swap_space": f"least {search.knob} (GiB per GPU) that meets every SLO at "
        f"{number(rate)} req/s",
        "kv_offloading": f"smallest CPU KV tier ({search.knob}, GiB) that meets every SLO at "
        f"{number(rate)} req/s",
    }[kind]
    first = f"{kind}: {head}: {answer_text(search)}"
    met = [v for v, ok in search.result.probes if ok]
    if kind == "concurrency" and search.result.at_range_end and met:
        # the top of the range is where the search stopped, not a limit: say what meets
        first = (
            f"{kind}: every {search.knob} probed from {int(min(met)):,} to the top of the range "
            f"({int(search.hi):,}) meets every SLO at {number(rate)} req/s: no upper limit "
            "found (what to deploy: the recommendation at the end)"
        )
    lines = [first, *interval_lines(search, slos)]
    at = search.answer_probe
    if at is not None and at.run is not None and at.slo is not None:
        s = at.run.summary
        lines.append(
            f"  there: {number(s['request_throughput'])} req/s, "
            f"{number(s['output_token_throughput'], 0)} output tok/s, "
            f"goodput {number(at.slo.goodput)} req/s ({at.name})"
        )
        cost = format_cost(answer_cost(search, prices or {}))
        if cost:
            lines.append(f"  {cost}")
    lines += answer_class_lines(search)
    if search.note:
        lines.append(f"  note: {search.note}")
    headers = ["probe", search.knob, *[s.key for s in slos], "met", "req/s", "goodput", "preempt"]
    rows = []
    probes = [
        *((v, out, "") for (v, _), out in zip(search.result.probes, search.probes, strict=True)),
        *((v, out, " i") for v, out in search.interval_probes),
    ]
    iv = search.interval
    for i, (value, out, role) in enumerate(probes):
        assert out.run is not None and out.slo is not None
        cell = f"{value:,.4g}" if kind == "rate" else f"{int(value):,}"
        measured = out.slo.measured_s
        spreads = iv.spread_at(value) if iv else None
        rows.append(
            [
                f"{i}{role}",
                cell + (" *" if not role and value == search.answer else ""),
                *[_slo_cell(measured[s.key], spreads[s.key] if spreads else None) for s in slos],
                "yes" if out.slo.all_met else "no",
                number(out.run.summary["request_throughput"]),
                number(out.slo.goodput),
                f"{out.run.summary['num_preemptions']:,}",
            ]
        )
    table = render_table(headers, rows)
    lines += ["  " + line for line in table.splitlines()]
    if search.interval_probes:
        lines.append("  (i: a probe for the interval's ends; * the answer)")
    return "\n".join(lines)


def format_capacity(result: CapacityResult, prices: dict[str, float] | None = None) -> str:
    b = result.base
    out = [
        f"base {b.name} ({b.policy}, {b.profile}, {b.replicas} replica(s)): "
        f"{result.num_requests_read:,} requests offered at {number(result.base_rate)} req/s",
        "SLOs: " + ", ".join(str(s) for s in result.slos),
    ]
    out += [format_search(s, result.slos, result.base_rate, prices) for s in result.searches]
    return "\n".join(out)


def result_dict(
    result: CapacityResult, warehouse: Path, prices: dict[str, float] | None = None
) -> dict[str, Any]:
    def probe(value: float, met: bool, o: Any) -> dict[str, Any]:
        return {
            "value": value,
            "met": met,
            "scenario": o.name,
            "slo": o.slo.to_dict(),
            "summary": o.run.summary,
        }

    return {
        "run_id": result.run_id,
        "warehouse": str(warehouse),
        "base": result.base.to_dict(),
        "base_rate": result.base_rate,
        "num_requests_read": result.num_requests_read,
        "selection": result.selection,
        "slos": [str(s) for s in result.slos],
        "num_replays": result.num_replays,
        "num_interval_replays": result.num_interval_replays,
        "wall_s": result.wall_s,
        "searches": {
            s.spec.kind: {
                "knob": s.knob,
                "range": [s.lo, s.hi],
                "rate": s.spec.rate or (result.base_rate if s.spec.kind != "rate" else None),
                "answer": _json_answer(s),
                "interval": interval_dict(s),
                "cost": answer_cost(s, prices or {}),
                "answer_classes": answer_classes(s),
                "monotone": s.result.monotone,
                "note": s.note,
                "probes": [
                    probe(v, m, o) for (v, m), o in zip(s.result.probes, s.probes, strict=True)
                ],
                "interval_probes": [
                    probe(v, o.slo is not None and o.slo.all_met, o) for v, o in s.interval_probes
                ],
            }
            for s in result.searches
        },
    }


def _json_answer(search: SearchOutcome) -> float | int | None:
    """The answer as JSON: a whole number for caps and replicas, req/s for the rate."""
    if search.answer is None or search.spec.kind == "rate":
        return search.answer
    return int(search.answer)


def interval_dict(search: SearchOutcome) -> dict[str, Any] | None:
    """The answer's interval as JSON-able data (None: intervals off, or no answer)."""
    iv, at = search.interval, search.answer_probe
    if iv is None or at is None or at.slo is None:
        return None
    at_answer = {}
    assert search.answer is not None
    for key, sp in iv.spread_at(search.answer).items():
        v = at.slo.measured_s[key]
        lo, hi = sp.bounds(v) if v else (None, None)
        at_answer[key] = {
            "measured_s": v,
            "lo_s": lo,
            "hi_s": hi,
            "arrivals_log_halfwidth": sp.arrivals,
            "profile_log_halfwidth": [sp.profile_lo, sp.profile_hi],
        }
    return {
        "level": LEVEL,
        "lo": iv.lo,
        "hi": iv.hi,
        "safe": iv.safe,
        "at_answer": at_answer,
        "arrivals": iv.arrivals,
        "num_replicates": iv.num_replicates,
        "replicates": iv.replicates,
        "at_cost": iv.at_cost,
        "cost_log_sd": iv.uncertainty.log_sd,
        "cost_sd_source": iv.uncertainty.source,
        "cost_sd_default": iv.uncertainty.is_default,
        "reversals": [
            {"fails": r.fails, "meets": r.meets, "beyond_interval": r.beyond} for r in iv.reversals
        ],
    }


@click.command(name="capacity")
@click.argument(
    "capacity_file", required=False, type=click.Path(dir_okay=False, exists=True, path_type=Path)
)
@opt.warehouse
@opt.config_file
@opt.selection
@click.option(
    "--slo",
    "slo_items",
    multiple=True,
    metavar="KEY=LIMIT",
    help="Objective every probe must meet, e.g. ttft_p99=200ms, tpot_p99=50ms (repeatable; "
    "metrics ttft, tpot, e2e, queue; statistics p<q>, mean; units us, ms, s).",
)
@click.option(
    "--search",
    "kinds",
    multiple=True,
    type=click.Choice(ALL_SEARCHES),
    help="Run only these searches (repeatable) [default: the file's, else concurrency, rate "
    'and replicas; swap_space (the least swap_space_gb, with preemption_mode = "swap") '
    "only when named].",
)
@click.option(
    "--scenario",
    "scenario_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Base scenario TOML file (over the capacity file's [base]).",
)
# the flags of `replay` (--policy, --router, --replicas, --max-num-seqs, ..., --set), for
# the base scenario: the same group, so the two never drift apart
@opt.scenario_flags
@click.option(
    "--target-rate",
    type=opt.BoundedFloat(0.0, 1e6, lo_open=True),
    default=None,
    help="Requests/s the replicas search must serve [default: the base scenario's].",
)
@click.option(
    "--max-concurrency",
    type=opt.BoundedInt(1, 2**31 - 1),
    default=None,
    help="Top of the concurrency search [default: the file's, else 1024].",
)
@click.option(
    "--max-replicas",
    type=opt.BoundedInt(1, 4096),
    default=None,
    help="Top of the replicas search [default: the file's, else 64].",
)
@click.option(
    "--summary-only",
    is_flag=True,
    help="Write each probe's summary and the search, not its sim_requests and sim_steps.",
)
@click.option(
    "--margin-pct",
    type=opt.BoundedFloat(0.0, 99.0),
    default=DEFAULT_MARGIN_PCT,
    show_default=True,
    metavar="PCT",
    help="The recommendation must meet every SLO with this much to spare, at the upper "
    "end of its 90% interval: statistic <= limit x (1 - PCT/100).",
)
@click.option(
    "--recommend-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Write the recommended scenario TOML here [default: "
    "<warehouse>/reports/<run id>/recommended.toml].",
)
@click.option(
    "--compare-split",
    is_flag=True,
    help="For a fleet (a scenario with [[pool]] tables): also search one shared pool of all "
    "the traffic and print shared against split (replicas, GPUs, $/hour, p99 per class).",
)
@click.option(
    "--shared-like",
    metavar="POOL",
    default=None,
    help="The pool whose settings the shared alternative of --compare-split takes "
    "[default: the first pool].",
)
@opt.intervals
@opt.jobs
@opt.ray
@opt.shards
@opt.gpu_hour_price
@opt.output
@opt.locked
def capacity_command(
    capacity_file: Path | None,
    warehouse: Path | None,
    config_file: Path | None,
    requests: opt.Requests,
    slo_items: tuple[str, ...],
    kinds: tuple[str, ...],
    scenario_file: Path | None,
    scenario_flags: dict[str, Any],
    sets: tuple[str, ...],
    target_rate: float | None,
    max_concurrency: int | None,
    max_replicas: int | None,
    summary_only: bool,
    margin_pct: float,
    recommend_out: Path | None,
    compare_split: bool,
    shared_like: str | None,
    no_intervals: bool,
    jobs: int | None,
    ray_address: str | None,
    shards: int | None,
    shard_warmup_s: float | None,
    gpu_hour_price: float | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Find the highest cap, the highest rate and the fewest replicas within SLOs.

    For the requests and a base scenario: the highest concurrency cap
    (max_num_seqs, max_batch_size, ...) that meets every SLO at the base's
    arrival rate, with the throughput and goodput there; the highest request
    rate (the trace time-scaled) that meets them; and the fewest replicas
    that meet them at a target rate. Each is a bisection; every probe is a
    replay, written under one run id with the search path (capacity_search).
    Each answer comes with its 90% interval (replicates of the arrivals and the
    profile's error at the answer; --no-intervals leaves it out), says whether
    it is safe at that confidence, and flags probes that break the expected
    shape beyond what the interval explains. It ends with a recommendation:
    the cheapest probe that meets every SLO with --margin-pct to spare at the
    upper end of its interval, with the engine command to deploy it, written
    as a scenario TOML that `replay --scenario` takes (--recommend-out).
    CAPACITY_FILE is optional TOML: [base], [slo], [search.<kind>] (see
    docs/capacity.md). For a fleet (a scenario with [[pool]] tables) it finds
    the fewest replicas of each pool, its cost, and with --compare-split
    whether one shared pool would be cheaper.

    --shards N replays each probe in N parts as `replay --shards` does (not
    for fleets or autoscaling), the parts --jobs at once or on the Ray
    cluster, and so each replay of the intervals: for a fleet's day.

    Example:

    \b
        tracereplay capacity --slo ttft_p99=200ms --slo tpot_p99=50ms \\
            --scenario examples/scenarios/vllm.toml
        tracereplay capacity examples/seed_lab/capacity.toml --search rate
        tracereplay capacity --slo ttft_p99=500ms --compare-split \\
            --scenario examples/scenarios/fleet.toml
    """
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    inputs = capacity_inputs(
        capacity_file=capacity_file,
        scenario=scenario_file,
        overrides={**scenario_flags, **opt.parse_sets(sets)},
        defaults=cfg.sections.get("replay", {}),
        slos=slo_items,
        searches=kinds,
        target_rate=target_rate,
        max_concurrency=max_concurrency,
        max_replicas=max_replicas,
    )
    prices = gpu_prices(cfg, gpu_hour_price)
    # where the intervals' independent replays run (replicates, cost-scaled replays)
    parallel: dict[str, Any] = {"jobs": jobs, "ray_address": ray_address}
    if "pool" not in inputs.base and _disaggregated(inputs.base):
        # its knob is the (prefill, decode) pair: searched as a fleet of one pool
        name = str(inputs.base.get("name") or "pd")
        base = {**inputs.base, "pool": [{"name": name}]}
        inputs = dataclasses.replace(inputs, base=base)
    if shards is not None and ("pool" in inputs.base or inputs.base.get("autoscale")):
        raise ConfigError(
            "--shards replays a plain scenario's probes in parts; a fleet's or an autoscaled "
            "capacity search does not run in parts: leave out --shards"
        )
    if "pool" in inputs.base:
        if not kinds:  # the default searches: a fleet's is the replicas one
            specs = [s for s in inputs.specs if s.kind == "replicas"] or inputs.specs
            inputs = dataclasses.replace(inputs, specs=specs)
        _fleet(wh, inputs, requests, summary_only, quiet, no_intervals, compare_split,
               shared_like, prices, margin_pct, recommend_out, as_json, parallel)  # fmt: skip
        return
    if inputs.base.get("autoscale"):
        _autoscaled(wh, inputs, kinds, requests, summary_only, quiet, no_intervals, prices,
                    margin_pct, recommend_out, as_json, parallel)  # fmt: skip
        return
    if compare_split or shared_like is not None:
        flag = "--compare-split" if compare_split else "--shared-like"
        raise ConfigError(
            f"{flag} compares a fleet's pools with one shared pool, but the base scenario has no "
            "[[pool]] tables; give a fleet scenario (docs/capacity.md, Fleets)"
        )
    result = run_capacity(
        wh,
        inputs.base,
        inputs.slos,
        inputs.specs,
        **requests.kwargs(),
        summary_only=summary_only,
        quiet=quiet,
        intervals=not no_intervals,
        **parallel,
        shards=shards,
        shard_warmup_s=shard_warmup_s,
    )
    rec = recommend(result, inputs.base, prices, margin_pct)
    if rec.chosen is not None:
        write_recommendation(rec, result.run_id, recommend_out or default_path(wh, result.run_id))
    if as_json:
        out = result_dict(result, wh, prices)
        out["recommendation"] = recommendation_dict(rec)
        click.echo(json.dumps(out, indent=2))
        return
    for line in selection_lines(result.selection):
        click.echo(line)
    click.echo(format_capacity(result, prices))
    click.echo(_run_line(result, wh))
    click.echo(format_recommendation(rec))


def _run_line(result: Any, wh: Path) -> str:
    """``run <id>: N replays (and M for the intervals) in S s, written to <warehouse>``."""
    intervals = result.num_interval_replays
    return (
        f"run {result.run_id}: {result.num_replays} replays"
        + (f" (and {intervals} for the intervals)" if intervals else "")
        + f" in {result.wall_s:.1f} s, written to {display(wh)}"
    )


def _autoscaled(
    wh: Path,
    inputs: Any,
    kinds: tuple[str, ...],
    requests: opt.Requests,
    summary_only: bool,
    quiet: bool,
    no_intervals: bool,
    prices: dict[str, float],
    margin_pct: float,
    recommend_out: Path | None,
    as_json: bool,
    parallel: dict[str, Any],
) -> None:
    """``capacity`` for an autoscaled scenario: the fewest fixed replicas beside the
    autoscaled replay (``plan/autoscale_plan.py``)."""
    from pipeline.plan.autoscale_plan import (
        fixed_values,
        format_comparison,
        run_autoscale_capacity,
    )

    others = sorted(set(kinds) - {"replicas"})
    if others:
        raise ConfigError(
            f"--search {others[0]}: an autoscaled scenario is compared with the fewest fixed "
            "replicas (the replicas search); drop the [autoscale] table to run the others"
        )
    spec = next((s for s in inputs.specs if s.kind == "replicas"), None)
    result, cmp = run_autoscale_capacity(
        wh,
        inputs.base,
        inputs.slos,
        spec,
        **requests.kwargs(),
        summary_only=summary_only,
        quiet=quiet,
        intervals=not no_intervals,
        **parallel,
    )
    rec = recommend(result, fixed_values(inputs.base), prices, margin_pct)
    if rec.chosen is not None:
        write_recommendation(rec, result.run_id, recommend_out or default_path(wh, result.run_id))
    if as_json:
        out = result_dict(result, wh, prices)
        out["recommendation"] = recommendation_dict(rec)
        out["autoscale"] = cmp.to_dict()
        click.echo(json.dumps(out, indent=2, default=str))
        return
    for line in selection_lines(result.selection):
        click.echo(line)
    click.echo(format_capacity(result, prices))
    for line in format_comparison(cmp):
        click.echo(line)
    click.echo(
        f"run {result.run_id}: {result.num_replays + 1} replays (the fixed search's and the "
        f"autoscaled one) in {result.wall_s:.1f} s, written to {display(wh)}"
    )
    click.echo(format_recommendation(rec))


def _disaggregated(values: dict[str, Any]) -> bool:
    """Whether the base scenario's keys make it disaggregated (prefill and decode workers)."""
    return any(values.get(k) for k in ("prefill_replicas", "decode_replicas"))


def _fleet(
    wh: Path,
    inputs: Any,
    requests: opt.Requests,
    summary_only: bool,
    quiet: bool,
    no_intervals: bool,
    compare_split: bool,
    shared_like: str | None,
    prices: dict[str, float],
    margin_pct: float,
    recommend_out: Path | None,
    as_json: bool,
    parallel: dict[str, Any],
) -> None:
    """``capacity`` for a fleet: each pool's fewest replicas, the total, shared vs split."""
    from pipeline.cli.fleet_capacity import (
        fleet_result_dict,
        format_fleet_capacity,
        format_fleet_recommendation,
    )
    from pipeline.plan.fleet import recommend_fleet, run_fleet_capacity, write_fleet_recommendation

    result = run_fleet_capacity(
        wh,
        inputs.base,
        inputs.slos,
        inputs.specs,
        **requests.kwargs(),
        summary_only=summary_only,
        quiet=quiet,
        intervals=not no_intervals,
        **parallel,
        compare_split=compare_split,
        shared_like=shared_like,
        prices=prices,
    )
    rec = recommend_fleet(result, prices, margin_pct)
    if rec.pools:
        write_fleet_recommendation(
            rec, result.run_id, recommend_out or default_path(wh, result.run_id)
        )
    if as_json:
        click.echo(json.dumps(fleet_result_dict(result, wh, prices, rec), indent=2, default=str))
        return
    for line in selection_lines(result.selection):
        click.echo(line)
    click.echo(format_fleet_capacity(result, prices))
    click.echo(_run_line(result, wh))
    click.echo(format_fleet_recommendation(rec))


capacity = capacity_command
