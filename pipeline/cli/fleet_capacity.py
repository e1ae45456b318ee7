"""What ``tracereplay capacity`` prints for a fleet: a line per pool, the total, the split
against one shared pool (``--compare-split``), and the fleet's recommendation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.plan.fleet import (
    SHARED,
    FleetCapacityResult,
    FleetPlan,
    FleetRecommendation,
    PoolPlan,
    fleet_record,
)
from pipeline.plan.recommend import check_text, recommendation_dict
from pipeline.plan.slo import Slo, format_seconds
from pipeline.sim.classes import NONE, judges
from pipeline.text import render_table

KINDS = ("tenant", "model")


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else format_seconds(float(f"{v:.4g}"))


def _limit(slos: list[Slo], metric: str, kind: str | None, name: str | None) -> float | None:
    """The tightest ``<metric>_p99`` SLO judging the class (unscoped or scoped to it)."""
    limits = [
        s.limit_s
        for s in slos
        if s.metric == metric
        and s.stat == "p99"
        and (s.scope is None if kind is None or name is None else judges(s, kind, name))
    ]
    return min(limits) if limits else None


def _kind_of(classes: dict[str, Any]) -> str | None:
    """The kind worth naming classes by: tenant, else model, where one is not ``(none)``."""
    for kind in KINDS:
        names = [n for n in (classes.get(kind) or {}) if n != NONE]
        if names:
            return kind
    return None


def class_cells(summary: dict[str, Any], slos: list[Slo], metric: str = "ttft") -> list[str]:
    """``tenant chat p99 TTFT 89.8ms (SLO 300ms)`` per class of ``summary`` (the whole
    traffic's figure where it has no classes by tenant or model)."""
    classes = summary.get("classes") or {}
    kind = _kind_of(classes)
    label = metric.upper()
    if kind is None:
        lim = _limit(slos, metric, None, None)
        return [
            f"p99 {label} {_ms(summary.get(f'{metric}_p99_s'))}"
            + (f" (SLO {format_seconds(lim)})" if lim else "")
        ]
    out = []
    for name, entry in classes[kind].items():
        lim = _limit(slos, metric, kind, name)
        out.append(
            f"{kind} {name} p99 {label} {_ms(entry.get(f'{metric}_p99_s'))}"
            + (f" (SLO {format_seconds(lim)})" if lim else "")
        )
    return out


def _pool_line(plan: FleetPlan, p: PoolPlan, slos: list[Slo], prices: dict[str, float]) -> str:
    cost = plan.costs(prices)[p.name]
    sc = p.scenario
    if p.replicas is None:
        head = f"no count in [{p.lo}, {p.hi}] meets every SLO"
    elif p.split is not None:
        head = f"{p.split[0]} prefill + {p.split[1]} decode workers"
        best = p.disagg.best if p.disagg is not None else None
        if best is not None and (best.prefill, best.decode) != p.split:
            head += f" (its own fewest: {best.prefill}p{best.decode}d)"
        gpu = f" x {p.gpu}" if p.gpu else ""
        head += f", {p.gpus} GPU{'' if p.gpus == 1 else 's'}{gpu}"
        head += f", {_usd(cost['usd_per_hour'])}/h" if cost else ", no price"
        head += _aggregated_note(p)
    else:
        head = f"{p.replicas} replica{'' if p.replicas == 1 else 's'}"
        if p.minimum is not None and p.minimum != p.replicas:
            head += f" (its own fewest: {p.minimum})"
        gpu = f" x {p.gpu}" if p.gpu else ""
        head += f", {p.gpus} GPU{'' if p.gpus == 1 else 's'}{gpu}"
        head += f", {_usd(cost['usd_per_hour'])}/h" if cost else ", no price"
    where = f"{p.match}; {p.num_requests:,} requests at {_rate(p.share_rate)}"
    cells = class_cells(plan.pool_summary(p.name), slos)
    return f"pool {p.name} ({where}; {sc.policy}, {sc.profile}): {head}; " + "; ".join(cells)


def _aggregated_note(p: PoolPlan) -> str:
    """`` (aggregated: 3 replicas meet; goodput/GPU 4.1 vs 3.2 req/s at 3)`` of a
    disaggregated pool's search: the aggregated fleet of the same GPU beside it."""
    d = p.disagg
    if d is None or d.best is None:
        return ""
    agg = f"{d.aggregated_min.decode} replicas meet" if d.aggregated_min else "none meets"
    same = d.aggregated_same

    def per_gpu(x: float | None) -> str:
        return "-" if x is None else f"{x:,.3g}"

    return (
        f" (aggregated on the same GPU: {agg}; goodput per GPU {per_gpu(d.best.goodput_per_gpu)}"
        f" disaggregated vs {per_gpu(same.goodput_per_gpu if same else None)} req/s aggregated"
        f" at {d.best.workers})"
    )


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:,.3g} req/s"


def total_line(plan: FleetPlan, prices: dict[str, float]) -> str:
    """``total: 4 replicas, 4 GPUs, $8.00/h; ...`` and the fleet check's verdict."""
    usd = plan.usd_per_hour(prices)
    head = (
        f"total: {plan.total_replicas} replicas, {plan.total_gpus} GPUs"
        + (f", {_usd(usd)}/h" if usd is not None else "")
        if plan.total_replicas is not None
        else "total: none (a pool has no count that meets)"
    )
    check = plan.check
    if check is None or check.slo is None:
        return head
    verdict = (
        "meets every SLO" if check.slo.all_met else "fails "
        + ", ".join(k for k, ok in check.slo.met.items() if not ok)
    )  # fmt: skip
    return f"{head}; the whole fleet replayed there {verdict} ({check.name})"


def compare_table(result: FleetCapacityResult, prices: dict[str, float]) -> list[str]:
    """Shared (one pool of all the traffic) against split, at the same SLOs."""
    shared, split = result.shared, result.split
    if shared is None:
        return []
    sp = shared.pools[0]

    def counts(plan: FleetPlan, what: str) -> str:
        if plan.label == SHARED:
            v = sp.replicas if what == "replicas" else sp.gpus
            return "none" if v is None else f"{v:,}"
        parts = [
            f"{p.name} {p.replicas if what == 'replicas' else p.gpus}"
            + (f" {p.gpu}" if what == "gpus" and p.gpu else "")
            for p in plan.pools
        ]
        total = plan.total_replicas if what == "replicas" else plan.total_gpus
        return " + ".join(parts) + (f" = {total:,}" if total is not None else "")

    rows = [
        ["replicas", counts(shared, "replicas"), counts(split, "replicas")],
        ["GPUs", counts(shared, "gpus"), counts(split, "gpus")],
        ["$/hour", _usd(shared.usd_per_hour(prices)), _usd(split.usd_per_hour(prices))],
    ]
    a, b = shared.classes, split.classes
    kind = _kind_of(b) or _kind_of(a)
    names = list(dict.fromkeys([*(b.get(kind) or {}), *(a.get(kind) or {})])) if kind else []
    for metric in ("ttft", "tpot"):
        targets: list[tuple[str, str | None]] = [(f"{kind} {n}", n) for n in names] or [
            ("all", None)
        ]
        for label, name in targets:

            def stat(
                classes: dict[str, Any],
                plan: FleetPlan,
                name: str | None = name,
                metric: str = metric,
            ) -> str:
                if name is None or kind is None:
                    s = plan.check.run.summary if plan.check and plan.check.run else {}
                    return _ms(s.get(f"{metric}_p99_s"))
                return _ms(((classes.get(kind) or {}).get(name) or {}).get(f"{metric}_p99_s"))

            lim = _limit(result.slos, metric, kind, name)
            rows.append(
                [
                    f"{label} p99 {metric.upper()}"
                    + (f" (SLO {format_seconds(lim)})" if lim else ""),
                    stat(a, shared),
                    stat(b, split),
                ]
            )
    table = render_table(["", f"shared (like {result.shared_like})", "split"], rows)
    return [
        "would splitting help? one shared pool of all the traffic (pool "
        f"{result.shared_like}'s settings) against the split, at the same SLOs:",
        *("  " + line for line in table.splitlines()),
        "  " + verdict(result, prices),
    ]


def verdict(result: FleetCapacityResult, prices: dict[str, float]) -> str:
    """Which is cheaper: $/hour with prices, else GPUs."""
    shared, split = result.shared, result.split
    assert shared is not None
    if not shared.found or not split.found:
        missing = [p.label for p in (shared, split) if not p.found]
        return f"no verdict: the {' and the '.join(missing)} arrangement has no answer in range"
    a, b = shared.usd_per_hour(prices), split.usd_per_hour(prices)
    unit = "/hour"
    if a is None or b is None:
        a, b, unit = float(shared.total_gpus or 0), float(split.total_gpus or 0), " GPUs"
        money = False
    else:
        money = True

    def amount(x: float) -> str:
        return f"${x:,.2f}{unit}" if money else f"{x:,.0f}{unit}"

    if b < a:
        return f"splitting helps: it saves {amount(a - b)} ({(a - b) / a:.0%}) over one shared pool"
    if b > a:
        return f"splitting costs more: {amount(b - a)} ({(b - a) / a:.0%}) over one shared pool"
    return "splitting costs the same as one shared pool"


def format_fleet_capacity(
    result: FleetCapacityResult, prices: dict[str, float] | None = None
) -> str:
    from pipeline.cli.capacity import format_search

    prices = prices or {}
    b = result.base
    out = [
        f"fleet {b.name} ({len(b.pools)} pools): {result.num_requests_read:,} requests "
        f"offered at {_rate(result.rate)}",
        "SLOs: " + ", ".join(str(s) for s in result.slos) + " (each on every pool's own requests)",
    ]
    plan = result.split
    out += [_pool_line(plan, p, result.slos, prices) for p in plan.pools]
    out.append(total_line(plan, prices))
    out += [f"  stepped up: {s}" for s in plan.step_ups]
    out += [f"  note: {n}" for n in [*result.notes, *plan.notes]]
    out += compare_table(result, prices)
    if result.shared is not None:
        out += [f"  note: {n}" for n in result.shared.notes]
    for pl_ in [plan, *([result.shared] if result.shared else [])]:
        for p in pl_.pools:
            if p.search is None:
                continue
            who = "shared alternative" if pl_.label == SHARED else f"pool {p.name}"
            out.append(f"{who} ({p.scenario.name}):")
            text = format_search(p.search, p.slos, p.share_rate, prices)
            out += ["  " + line for line in text.splitlines()]
            if p.autoscale is not None:  # an autoscaled pool: its autoscaled replay beside
                from pipeline.plan.autoscale_plan import format_comparison

                out += ["  " + line for line in format_comparison(p.autoscale)]
    return "\n".join(out)


def format_fleet_recommendation(rec: FleetRecommendation) -> str:
    """The closing lines for a fleet: each pool's recommendation and engine command."""
    lines = [
        f"recommendation (per pool, with a {rec.margin_pct:g}% margin at the upper end of "
        "its interval where it has one, each on its own requests):"
    ]
    for name, r in rec.pools.items():
        c = r.chosen
        if c is None or c.outcome.run is None:
            lines.append(f"  pool {name}: none of its probes meets with the margin")
            continue
        sc = c.outcome.run.scenario
        lines.append(
            f"  pool {name}: {sc.replicas} replica{'' if sc.replicas == 1 else 's'} "
            f"({c.gpus} GPU{'' if c.gpus == 1 else 's'}"
            + (f", ${c.usd_per_hour:,.2f}/h" if c.usd_per_hour is not None else "")
            + "): "
            + "; ".join(check_text(ch) for ch in c.checks)
        )
        if r.command:
            lines.append(f"    deploy {sc.replicas} x: {r.command}")
        else:
            lines.append(f"    policy {sc.policy}: no engine command")
    if rec.path is not None:
        lines.append(f"  scenario: {rec.path} (tracereplay replay --scenario {rec.path})")
    return "\n".join(lines)


def fleet_result_dict(
    result: FleetCapacityResult,
    warehouse: Path,
    prices: dict[str, float] | None = None,
    rec: FleetRecommendation | None = None,
) -> dict[str, Any]:
    """``--json`` for a fleet: the run, ``fleet`` (``plan.fleet.fleet_record``), each pool's
    search as ``result_dict`` gives one, and the recommendation."""
    from pipeline.cli.capacity import result_dict

    searches: dict[str, Any] = {}
    for plan in [result.split, *([result.shared] if result.shared else [])]:
        for p in plan.pools:
            if p.search is not None:
                one = result_dict(result.pool_result(p), warehouse, prices)
                key = SHARED if plan.label == SHARED else p.name
                searches[key] = one["searches"]["replicas"]
    out: dict[str, Any] = {
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
        "fleet": fleet_record(result, prices),
        "pool_searches": searches,
    }
    if rec is not None:
        out["recommendation"] = {
            "margin_pct": rec.margin_pct,
            "complete": rec.complete,
            "replicas": rec.replicas,
            "pools": {k: recommendation_dict(r) for k, r in rec.pools.items()},
            "file": str(rec.path) if rec.path is not None else None,
        }
    return out
