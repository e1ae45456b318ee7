"""What to deploy after a capacity run: the cheapest probe that meets every SLO with margin.

Every probe of the ``concurrency`` and ``replicas`` searches is a full replay of
one configuration at the traffic to plan for (the replicas search's target
rate, else the concurrency search's rate); the ``rate`` search's probes replay
other traffic and are not candidates. A probe qualifies when each SLO's
statistic, taken at the conservative end of its 90% interval (the upper
bound, from the search's interval model at that probe; the statistic itself
where the search has no interval), is within the limit less the margin:
``upper <= limit * (1 - margin_pct / 100)``. Of those, the cheapest ($/hour
with a GPU price, else GPUs: replicas x tensor parallel) wins; among equally
cheap ones, the most headroom on its tightest SLO, then the smaller knob.

The winner is written as a scenario TOML (the probe's own keys, so
``tracereplay replay --scenario FILE`` replays what was judged) that names the
engine command to deploy it with (``engine_flags.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.plan.capacity import CapacityResult, SearchOutcome
from pipeline.plan.engine_flags import engine_command
from pipeline.plan.prober import probe_values
from pipeline.plan.slo import format_seconds
from pipeline.plan.tasks import TaskOutcome
from pipeline.pricing import deployment_cost, gpu_kind

DEFAULT_MARGIN_PCT = 10.0
CANDIDATE_SEARCHES = ("concurrency", "replicas")


@dataclass(frozen=True)
class SloCheck:
    """One SLO at a candidate: the statistic, its conservative end, the limit with margin."""

    key: str
    measured_s: float | None
    upper_s: float | None  # the upper bound of its 90% interval (the statistic: none)
    limit_s: float
    allowed_s: float  # limit less the margin

    @property
    def ok(self) -> bool:
        return self.upper_s is not None and self.upper_s <= self.allowed_s

    @property
    def headroom(self) -> float:
        """1 - upper / limit: how far below the limit (the margin not taken off)."""
        if self.upper_s is None:
            return -math.inf
        return 1.0 - self.upper_s / self.limit_s if self.limit_s > 0 else -math.inf


@dataclass(frozen=True)
class Candidate:
    """One probe judged for deployment."""

    search: str
    knob: str
    value: float
    outcome: TaskOutcome
    checks: list[SloCheck]
    gpus: int
    usd_per_hour: float | None
    interval: bool  # judged at its interval's upper bounds

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def headroom(self) -> float:
        return min((c.headroom for c in self.checks), default=-math.inf)

    def rank(self) -> tuple[float, float, float]:
        cost = self.usd_per_hour if self.usd_per_hour is not None else float(self.gpus)
        return (cost, -self.headroom, self.value)


@dataclass
class Recommendation:
    """The configuration to deploy (None when no probe qualifies), and what it rests on."""

    margin_pct: float
    rate: float | None  # req/s the candidates were judged at
    chosen: Candidate | None
    values: dict[str, Any] = field(default_factory=dict)  # the chosen probe's scenario keys
    num_candidates: int = 0
    num_ok: int = 0
    closest: Candidate | None = None  # without a choice: the candidate nearest to qualifying
    path: Path | None = None  # the scenario TOML, once written

    @property
    def command(self) -> str | None:
        return engine_command(self.chosen.outcome.run.scenario) if self.chosen and (
            self.chosen.outcome.run is not None) else None  # fmt: skip


def _search_rate(search: SearchOutcome, base_rate: float | None) -> float | None:
    return search.spec.rate if search.spec.rate is not None else base_rate


def _checks(search: SearchOutcome, value: float, out: TaskOutcome, keep: float) -> list[SloCheck]:
    assert out.slo is not None
    spreads = search.interval.spread_at(value) if search.interval is not None else None
    checks = []
    for s in search.slos:
        v = out.slo.measured_s.get(s.key)
        upper = v
        if v is not None and v > 0 and spreads is not None and s.key in spreads:
            upper = spreads[s.key].bounds(v)[1]
        checks.append(SloCheck(s.key, v, upper, s.limit_s, s.limit_s * keep))
    return checks


def candidates(
    result: CapacityResult, prices: dict[str, float], margin_pct: float
) -> tuple[float | None, list[Candidate]]:
    """The rate to plan for and every probe replayed at it, judged."""
    searches = {s.spec.kind: s for s in result.searches}
    plan = searches.get("replicas") or searches.get("concurrency")
    if plan is None:
        return None, []
    rate = _search_rate(plan, result.base_rate)
    keep = 1.0 - margin_pct / 100.0
    out: list[Candidate] = []
    seen: set[str] = set()
    for search in result.searches:
        if search.spec.kind not in CANDIDATE_SEARCHES:
            continue
        r = _search_rate(search, result.base_rate)
        if (r is None) != (rate is None) or (
            r is not None and rate is not None and not math.isclose(r, rate, rel_tol=1e-9)
        ):
            continue
        probes = [
            *zip((v for v, _ in search.result.probes), search.probes, strict=True),
            *search.interval_probes,
        ]
        for value, o in probes:
            if o.run is None or o.slo is None or o.name in seen:
                continue
            seen.add(o.name)
            sc = o.run.scenario
            cost = deployment_cost(prices, sc.profile, sc.replicas, o.run.summary)
            out.append(
                Candidate(
                    search=search.spec.kind,
                    knob=search.knob,
                    value=value,
                    outcome=o,
                    checks=_checks(search, value, o, keep),
                    gpus=sc.replicas * gpu_kind(sc.profile)[1],
                    usd_per_hour=cost["usd_per_hour"] if cost else None,
                    interval=search.interval is not None,
                )
            )
    return rate, out


def recommend(
    result: CapacityResult,
    base_values: dict[str, Any],
    prices: dict[str, float] | None = None,
    margin_pct: float = DEFAULT_MARGIN_PCT,
) -> Recommendation:
    """The cheapest probe of ``result`` that meets every SLO with ``margin_pct`` to spare at
    the conservative end of its interval (module docstring)."""
    rate, cands = candidates(result, prices or {}, margin_pct)
    ok = sorted((c for c in cands if c.ok), key=Candidate.rank)
    rec = Recommendation(margin_pct, rate, ok[0] if ok else None, num_candidates=len(cands))
    rec.num_ok = len(ok)
    if rec.chosen is None:
        rec.closest = max(cands, key=lambda c: c.headroom, default=None)
        return rec
    c = rec.chosen
    spec = next(s.spec for s in result.searches if s.spec.kind == c.search)
    values = probe_values(base_values, result.base.name, spec, c.knob, c.value)
    values.pop("name", None)
    assert c.outcome.run is not None
    # the engine's settings stated, defaults too: the file says what the command sets
    params = dataclasses.asdict(c.outcome.run.scenario.params)
    rec.values = {
        "name": f"{result.base.name}-recommended",
        **values,
        **{k: v for k, v in params.items() if k not in values},
    }
    return rec


def describe(c: Candidate) -> str:
    """``2 replicas, max_num_seqs 256``: the deployment a candidate is."""
    assert c.outcome.run is not None
    sc = c.outcome.run.scenario
    knob = {"concurrency": c.knob}.get(c.search)
    parts = [f"{sc.replicas} replica{'' if sc.replicas == 1 else 's'}"]
    from pipeline.plan.knobs import concurrency_knob

    cap_knob = knob or concurrency_knob(sc.policy)
    cap = getattr(sc.params, cap_knob, None)
    if cap is not None:
        parts.append(f"{cap_knob} {int(cap):,}")
    return ", ".join(parts)


def check_text(ch: SloCheck) -> str:
    """``ttft_p99 181ms (up to 195ms) within 180ms (200ms less the margin)``."""
    if ch.measured_s is None:
        return f"{ch.key}: no statistic"
    shown = format_seconds(float(f"{ch.measured_s:.4g}"))
    if ch.upper_s is not None and ch.upper_s != ch.measured_s:
        shown += f" (up to {format_seconds(float(f'{ch.upper_s:.4g}'))})"
    verb = "within" if ch.ok else "over"
    return (
        f"{ch.key} {shown} {verb} {format_seconds(float(f'{ch.allowed_s:.4g}'))} "
        f"(of {format_seconds(ch.limit_s)})"
    )


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else
                                                 ("inf" if v > 0 else "-inf"))  # fmt: skip
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML value for {v!r}")


toml_value = _toml_value  # a TOML value's text (public: the fleet's writer uses it)


def toml_text(values: dict[str, Any], header: list[str]) -> str:
    """A scenario TOML of ``values`` (tables last), with ``header`` as comments on top."""
    lines = [f"# {h}" if h else "#" for h in header]
    flat = {k: v for k, v in values.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in values.items() if isinstance(v, dict)}
    lines += [f"{k} = {_toml_value(v)}" for k, v in flat.items()]

    def table(name: str, body: dict[str, Any]) -> None:
        lines.append("")
        lines.append(f"[{name}]")
        inner = {k: v for k, v in body.items() if not isinstance(v, dict) and v is not None}
        lines.extend(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in inner.items())
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{name}.{json.dumps(str(k))}", v)

    for k, v in tables.items():
        table(k, v)
    return "\n".join(lines) + "\n"


def scenario_toml(rec: Recommendation, run_id: str) -> str:
    """The recommendation as a scenario file, its engine command and replicas in comments."""
    c = rec.chosen
    assert c is not None and c.outcome.run is not None
    header = [
        f"What `tracereplay capacity` recommends (run {run_id}): {describe(c)},",
        f"the cheapest probe that meets every SLO with a {rec.margin_pct:g}% margin"
        + (" at the upper end of its 90% interval:" if c.interval else ":"),
        *(f"  {check_text(ch)}" for ch in c.checks),
        "",
    ]
    cmd = rec.command
    replicas = c.outcome.run.scenario.replicas
    if cmd:
        header += [
            f"Deploy: {replicas} replica{'' if replicas == 1 else 's'} of",
            f"  {cmd}",
            "behind one router (replicas: copies of the command; MODEL: your model).",
        ]
    else:
        header.append(f"Policy {c.outcome.run.scenario.policy}: no engine command; the keys are "
                      "the simulator's.")  # fmt: skip
    if "rate" in rec.values:
        header.append(
            f"rate: the traffic it was judged at ({rec.values['rate']:g} req/s); drop it to "
            "replay the trace as logged."
        )
    header.append("Replay it: tracereplay replay --scenario THIS_FILE")
    return toml_text(rec.values, header)


def default_path(warehouse: Path, run_id: str) -> Path:
    """``<warehouse>/reports/<run id>/recommended.toml``: beside the run's report."""
    return warehouse / "reports" / run_id / "recommended.toml"


def write_recommendation(rec: Recommendation, run_id: str, path: Path) -> Path:
    """Write the scenario TOML (atomically) and remember where."""
    from pipeline.storage import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    rec.path = write_atomic(path, scenario_toml(rec, run_id))
    return rec.path


def recommendation_dict(rec: Recommendation) -> dict[str, Any]:
    """The recommendation as JSON-able data."""
    c = rec.chosen

    def checks(cand: Candidate) -> dict[str, Any]:
        return {
            ch.key: {
                "measured_s": ch.measured_s,
                "upper_s": ch.upper_s,
                "limit_s": ch.limit_s,
                "allowed_s": ch.allowed_s,
                "ok": ch.ok,
            }
            for ch in cand.checks
        }

    out: dict[str, Any] = {
        "margin_pct": rec.margin_pct,
        "rate": rec.rate,
        "num_candidates": rec.num_candidates,
        "num_meeting_with_margin": rec.num_ok,
        "found": c is not None,
    }
    if c is None or c.outcome.run is None:
        out["closest"] = (
            {"scenario": rec.closest.outcome.name, "slos": checks(rec.closest)}
            if rec.closest is not None
            else None
        )
        return out
    sc = c.outcome.run.scenario
    out.update(
        {
            "scenario": c.outcome.name,
            "search": c.search,
            "policy": sc.policy,
            "profile": sc.profile,
            "replicas": sc.replicas,
            "gpus": c.gpus,
            "usd_per_hour": c.usd_per_hour,
            "headroom": c.headroom,
            "at_interval_upper_bound": c.interval,
            "slos": checks(c),
            "engine_command": rec.command,
            "values": rec.values,
            "file": str(rec.path) if rec.path is not None else None,
        }
    )
    return out


def format_recommendation(rec: Recommendation) -> str:
    """The closing lines of ``capacity``: what to deploy, or why nothing qualifies."""
    c = rec.chosen
    at = f" at {rec.rate:,.3g} req/s" if rec.rate is not None else ""
    if c is None:
        if not rec.num_candidates:
            return "recommendation: none (run a concurrency or replicas search to get one)"
        lines = [
            f"recommendation: none of the {rec.num_candidates} probes{at} meets every SLO "
            f"with a {rec.margin_pct:g}% margin at the upper end of its interval"
        ]
        if rec.closest is not None:
            lines.append(
                f"  closest: {describe(rec.closest)}: "
                + ", ".join(check_text(ch) for ch in rec.closest.checks)
            )
        lines.append("  raise --max-replicas, lower --margin-pct, or relax the SLOs to get one")
        return "\n".join(lines)
    assert c.outcome.run is not None
    cost = f"${c.usd_per_hour:,.2f}/hour, " if c.usd_per_hour is not None else ""
    lines = [
        f"recommendation: {describe(c)} ({c.outcome.run.scenario.policy}, "
        f"{c.outcome.run.scenario.profile}; {cost}{c.gpus} GPU{'' if c.gpus == 1 else 's'}): "
        + (
            f"the one probe{at} that meets every SLO with a {rec.margin_pct:g}% margin"
            if rec.num_ok == 1
            else f"the cheapest of {rec.num_ok} probes{at} that meet every SLO with a "
            f"{rec.margin_pct:g}% margin"
        )
        + (" at the upper end of the 90% interval" if c.interval else ""),
        "  " + "; ".join(check_text(ch) for ch in c.checks),
    ]
    if rec.command:
        lines.append(f"  deploy {c.outcome.run.scenario.replicas} x: {rec.command}")
    if rec.path is not None:
        lines.append(f"  scenario: {rec.path} (tracereplay replay --scenario {rec.path})")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_MARGIN_PCT",
    "Candidate",
    "Recommendation",
    "SloCheck",
    "default_path",
    "format_recommendation",
    "recommend",
    "recommendation_dict",
    "scenario_toml",
    "toml_text",
    "write_recommendation",
]
