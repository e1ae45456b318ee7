"""Capacity for a fleet: the fewest replicas of each pool, and whether splitting helps.

A fleet (a scenario with ``[[pool]]`` tables, ``sim/pools.py``) is searched pool
by pool. Its pools are independent: each has its own router and replicas, and a
request's pool is decided by its own columns (tenant, model, priority, prompt
length), never by load. So pool A's requests meet the same replicas, in the same
order, at the same times, whatever pool B runs on: B's count cannot change one
of A's latencies (``tests/capacity/test_fleet_capacity.py`` holds this). The
fewest replicas of the whole fleet that meet the SLOs are therefore each pool's
own fewest, found apart:

1. The fleet's arrivals are made once over the whole trace (its arrival keys, a
   target rate included) and the requests split by pool (``fleet_frame``), as
   ``sim.fleet.prepare_fleet`` splits them.
2. Each pool's share is searched by the single-pool replicas search
   (``capacity._search`` through a ``prober.Prober``, its intervals included) with
   the pool's own scenario (``pool_values``) at the share's arrival times, the
   share prepared once. Every SLO judges the pool's own requests: an unscoped
   one, or one whose class several pools serve, must hold in each; an SLO scoped
   to a class the pool never sees is met there (no request has the statistic).
3. The whole fleet is replayed once at the counts found, and judged over every
   request (``check``): a percentile over the union can exceed the pools' own by a
   hair (the interpolation), so if an SLO fails there, the pool furthest over
   that SLO's limit gets one more replica and the fleet is replayed again.

``compare_split`` answers "would splitting help?": the same search for the
*shared* alternative, one pool of all the traffic with the settings of one pool
(``shared_values``), at the same SLOs.

A disaggregated pool searches its prefill:decode split (``disagg_plan.py``). An
autoscaled pool (its own ``[pool.autoscale]`` table) is searched as a fixed pool,
without its autoscale keys, and its share is then replayed once autoscaled, as
``autoscale_plan.py`` does for one scenario: the pool's autoscaled-against-fixed
comparison (``PoolPlan.autoscale``, the runs row's ``details.autoscale``). The
fleet check and the recommendation deploy the fixed counts found.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.contracts import CAPACITY_SEARCH
from pipeline.errors import ConfigError, ScenarioError
from pipeline.lock import with_warehouse_lock
from pipeline.plan.autoscale_plan import (
    AUTOSCALED_SUFFIX,
    AutoscaleComparison,
    autoscaled_replay,
    compare,
    fixed_values,
)
from pipeline.plan.capacity import (
    DEFAULT_MAX_REPLICAS,
    CapacityResult,
    SearchOutcome,
    SearchSpec,
    _search,
    _why_none,
    capacity_table,
)
from pipeline.plan.disagg_plan import DisaggPlan, plan_disaggregation
from pipeline.plan.intervals import END_TOLERANCE, Knob
from pipeline.plan.prober import ProbeContext, Prober
from pipeline.plan.recommend import Recommendation, recommend, toml_text, toml_value
from pipeline.plan.replicates import trace_window
from pipeline.plan.slo import Slo
from pipeline.plan.tasks import ScenarioTask, TaskOutcome, offered_rate, run_task, write_scenarios
from pipeline.plan.tasks import write_tables as _write_tables
from pipeline.pricing import deployment_cost, gpu_kind
from pipeline.processes import default_jobs
from pipeline.progress import progress
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter
from pipeline.sim.autoscale import KEY as AUTOSCALE_KEY
from pipeline.sim.fleet import split_frame
from pipeline.sim.frontend import SCENARIO_KEYS as FRONTEND_KEYS
from pipeline.sim.policies import POLICIES
from pipeline.sim.pools import MATCH_KEYS, Pool
from pipeline.sim.replay import load_loop, selection_record
from pipeline.sim.replay_input import prepare, read_window, select_request_files
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.warehouse import Warehouse, new_run_id

SHARED = "shared"  # the name of the shared alternative's one pool
DISAGG_KNOB = "prefill:decode"  # a disaggregated pool's knob: its two worker counts
AUTOSCALE_KNOB = "autoscale"  # an autoscaled pool: its fixed count, then autoscaled against it
MAX_STEP_UPS = 64  # fleet checks after the first, at most
# keys a pool's share is searched without: the fleet's arrivals are already made
_ARRIVAL_KEYS = ("time_scale", "rate", "burstiness", "num_requests")


def search_knob(pool: Pool) -> str:
    """The knob a pool's capacity search turns: its ``replicas``, for a disaggregated
    pool its ``prefill:decode`` workers (``plan.disagg_plan``), for an autoscaled pool
    ``autoscale``: its fixed ``replicas`` without the autoscale keys, then the autoscaled
    replay of its share against that count (``plan.autoscale_plan``).

    The one place that says how capacity searches each kind of pool.
    """
    sc = pool.scenario
    if getattr(sc, "autoscale", None) is not None:
        return AUTOSCALE_KNOB
    if getattr(sc, "disagg", None) is not None:
        return DISAGG_KNOB
    return "replicas"


_search_knob = search_knob  # the name the brief gave it


def search_knob_of(p: PoolPlan) -> str:
    """``search_knob`` of a pool as searched (the shared alternative has no Pool)."""
    return DISAGG_KNOB if p.scenario.disagg is not None else "replicas"


def fleet_frame(frame: pl.DataFrame, fleet: Scenario) -> tuple[pl.DataFrame, npt.NDArray[np.int64]]:
    """The requests with the fleet's arrival times and each row's pool index: what
    ``sim.fleet.prepare_fleet`` splits (``sim.fleet.split_frame``)."""
    return split_frame(frame, fleet)


def pool_slos(slos: list[Slo], share: pl.DataFrame) -> list[Slo]:
    """The SLOs that judge some of a pool's requests: the unscoped ones, and those scoped to
    a class (tenant, model, prompt length) the share holds."""
    n = share.height
    groups: dict[str, Any] = {"prompt_tokens": share["prompt_tokens"].fill_null(0).to_numpy()}
    for col in ("tenant", "model"):
        groups[col] = (
            share[col].to_numpy() if col in share.columns else np.full(n, None, dtype=object)
        )
    return [s for s in slos if n and bool(s.applies(groups, n).any())]


def _as_trace(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` replayed at arrival times already made: trace arrivals, as they are."""
    out = {k: v for k, v in values.items() if k not in _ARRIVAL_KEYS}
    out["arrivals"] = "trace"
    return out


def pool_values(values: dict[str, Any], fleet: Scenario, name: str) -> dict[str, Any]:
    """The scenario keys of pool ``name`` of the fleet ``values`` (built: ``fleet``) alone,
    as its share is searched: the fleet's keys under the pool's own (its policy's
    parameters only), its name ``<fleet>.<pool>``, the fleet's front end, and trace
    arrivals (the share carries the fleet's arrival times).

    Raises:
        ConfigError: no pool of that name (the message lists the pools).
    """
    tables = {t.get("name"): t for t in values.get("pool") or []}
    if name not in tables:
        raise ConfigError(
            f"no pool named {name!r}; the fleet's pools: {', '.join(p.name for p in fleet.pools)}"
        )
    top = {k: v for k, v in values.items() if k != "pool"}
    own = {k: v for k, v in tables[name].items() if k not in MATCH_KEYS and k != "name"}
    inherited = top
    if own.get("policy", fleet.policy) != fleet.policy:  # the fleet's policy's parameters
        theirs = set(POLICIES[fleet.policy].param_help())
        inherited = {k: v for k, v in top.items() if k not in theirs}
    out = {**inherited, **own, "name": f"{fleet.name}.{name}"}
    # the client sees the fleet's front end, whichever GPU serves it (as _build_fleet)
    out.update({k: fleet.frontend.to_dict()[f] for k, f in FRONTEND_KEYS.items()})
    return _as_trace(out)


def shared_values(values: dict[str, Any], fleet: Scenario, like: str) -> dict[str, Any]:
    """The shared alternative: one pool of all the traffic with pool ``like``'s settings,
    named ``<fleet>-shared``."""
    return {**pool_values(values, fleet, like), "name": f"{fleet.name}-{SHARED}"}


def fleet_values_at(
    values: dict[str, Any], counts: dict[str, int | tuple[int, int]], name: str
) -> dict[str, Any]:
    """The fleet ``values`` with each pool's replicas set from ``counts`` (a disaggregated
    pool's as its (prefill, decode) workers), named ``name``."""

    def at(t: dict[str, Any]) -> dict[str, Any]:
        if t.get("name") not in counts:
            return dict(t)
        n = counts[t["name"]]
        if isinstance(n, tuple):
            return {**t, "prefill_replicas": int(n[0]), "decode_replicas": int(n[1])}
        # a count found is a fixed count: it replaces an autoscaled pool's autoscaler
        return {**{k: v for k, v in t.items() if k != AUTOSCALE_KEY}, "replicas": int(n)}

    return {**values, "pool": [at(t) for t in values["pool"]], "name": name}


def _count_label(n: int | tuple[int, int]) -> str:
    return f"{n[0]}p{n[1]}d" if isinstance(n, tuple) else str(n)


def _check_same(built: Scenario, pool: Pool) -> None:
    """The pool's scenario as searched must be the fleet's pool at trace arrivals."""
    want = dataclasses.replace(pool.scenario, arrivals=built.arrivals).to_dict()
    got = built.to_dict()
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise AssertionError(f"pool {pool.name!r}: its search scenario differs in {diff}")


@dataclass
class PoolPlan:
    """One pool's search and the count to deploy."""

    name: str
    match: str  # which requests it takes, in words
    scenario: Scenario  # as searched: the pool's settings at its share's arrival times
    values: dict[str, Any]  # its scenario keys (``pool_values``)
    num_requests: int  # its share of the requests
    share_rate: float | None  # req/s its share offers
    lo: int
    hi: int
    slos: list[Slo] = field(default_factory=list)  # those that judge some of its requests
    search: SearchOutcome | None = None  # None: no request goes to it, or no SLO judges it
    replicas: int | None = None  # to deploy: the answer, stepped up by the fleet check
    # a disaggregated pool: its prefill:decode search, and the (prefill, decode) to deploy
    disagg: DisaggPlan | None = None
    split: tuple[int, int] | None = None
    # an autoscaled pool: its scenario keys with the autoscale table (``values`` and
    # ``scenario`` are the fixed pool searched), and its autoscaled-against-fixed answer
    autoscaled_values: dict[str, Any] | None = None
    autoscale: AutoscaleComparison | None = None

    @property
    def count(self) -> int | tuple[int, int]:
        """What the fleet check deploys: replicas, or (prefill, decode) workers."""
        return self.split if self.split is not None else int(self.replicas or 0)

    @property
    def minimum(self) -> int | None:
        """The fewest replicas (workers) that meet every SLO on the pool's own requests."""
        if self.disagg is not None:
            return None if self.disagg.best is None else self.disagg.best.workers
        if self.search is None:
            return self.lo
        return None if self.search.answer is None else int(self.search.answer)

    @property
    def gpus_per_replica(self) -> int:
        """Tensor parallel GPUs of one replica (the profile's ``_tp<N>``; 1 without one)."""
        return gpu_kind(self.scenario.profile)[1]

    @property
    def gpu(self) -> str | None:
        return gpu_kind(self.scenario.profile)[0]

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.gpus_per_replica

    def cost(self, prices: dict[str, float], summary: dict[str, Any]) -> dict[str, Any] | None:
        """$/hour (and per 1M tokens at ``summary``'s throughput) at ``replicas``."""
        if self.replicas is None:
            return None
        return deployment_cost(prices, self.scenario.profile, self.replicas, summary)


@dataclass
class FleetPlan:
    """One arrangement of the traffic (``split``: the fleet's pools; ``shared``: one pool
    of it all), the count of each pool and the replay that judges the whole."""

    label: str  # split | shared
    pools: list[PoolPlan]
    # the whole traffic replayed at the counts: split, the fleet check; shared, its answer
    check: TaskOutcome | None = None
    checks: list[TaskOutcome] = field(default_factory=list)  # split: every fleet check
    step_ups: list[str] = field(default_factory=list)  # "chat 2 -> 3: ttft_p99 ..."
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        """Every pool has a count, and the whole traffic meets every SLO there."""
        return (
            all(p.replicas is not None for p in self.pools)
            and self.check is not None
            and self.check.slo is not None
            and self.check.slo.all_met
        )

    @property
    def replicas(self) -> dict[str, int | None]:
        return {p.name: p.replicas for p in self.pools}

    @property
    def total_replicas(self) -> int | None:
        counts = [p.replicas for p in self.pools]
        return None if None in counts else sum(c for c in counts if c is not None)

    @property
    def total_gpus(self) -> int | None:
        gpus = [p.gpus for p in self.pools]
        return None if None in gpus else sum(g for g in gpus if g is not None)

    def pool_summary(self, name: str) -> dict[str, Any]:
        """The pool's figures in the whole replay (its answer probe's where it has none)."""
        if self.check is not None and self.check.run is not None:
            pools = self.check.run.summary.get("pools")
            if pools and name in pools:
                return dict(pools[name])
            if self.label == SHARED:
                return dict(self.check.run.summary)
        plan = next(p for p in self.pools if p.name == name)
        at = plan.search.answer_probe if plan.search is not None else None
        return dict(at.run.summary) if at is not None and at.run is not None else {}

    def costs(self, prices: dict[str, float]) -> dict[str, dict[str, Any] | None]:
        return {p.name: p.cost(prices, self.pool_summary(p.name)) for p in self.pools}

    def usd_per_hour(self, prices: dict[str, float]) -> float | None:
        """$/hour of every pool (None: a pool without a count or a price)."""
        costs = self.costs(prices)
        if any(c is None for c in costs.values()):
            return None
        return sum(float(c["usd_per_hour"]) for c in costs.values() if c is not None)

    @property
    def classes(self) -> dict[str, Any]:
        """Per tenant and model over the whole traffic at the counts (the check's)."""
        if self.check is None or self.check.run is None:
            return {}
        return dict(self.check.run.summary.get("classes") or {})


@dataclass
class FleetCapacityResult:
    """What a fleet's capacity run found and wrote."""

    run_id: str
    base: Scenario  # the fleet, at the target rate
    slos: list[Slo]
    base_rate: float | None  # req/s the fleet's arrivals offer (before a target rate)
    rate: float | None  # req/s planned for (the target rate, else the base's)
    num_requests_read: int
    inputs: list[str]
    split: FleetPlan
    shared: FleetPlan | None = None  # with compare_split
    shared_like: str | None = None  # the pool whose settings the shared alternative takes
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    selection: dict[str, Any] = field(default_factory=dict)
    num_replays: int = 0  # probes and fleet checks replayed and stored
    values: dict[str, Any] = field(default_factory=dict)  # the fleet's keys, at the target rate

    @property
    def num_interval_replays(self) -> int:
        plans = [self.split, *([self.shared] if self.shared else [])]
        return sum(
            1 + p.search.interval.num_replicates + p.search.interval.num_profile_replays
            for plan in plans
            for p in plan.pools
            if p.search is not None and p.search.interval is not None
        )

    def pool_result(self, plan: PoolPlan) -> CapacityResult:
        """One pool's search as a single-pool ``CapacityResult`` (for ``recommend`` and
        ``capacity_table``)."""
        return CapacityResult(
            run_id=self.run_id,
            base=plan.scenario,
            slos=plan.slos,
            base_rate=plan.share_rate,
            num_requests_read=plan.num_requests,
            inputs=self.inputs,
            searches=[plan.search] if plan.search is not None else [],
            selection=self.selection,
        )


def search_label(plan: FleetPlan, pool: PoolPlan) -> str:
    """The ``capacity_search.search`` of a pool's search: ``replicas@pool=chat``, and
    ``replicas@shared`` for the shared alternative."""
    return f"replicas@{SHARED}" if plan.label == SHARED else f"replicas@pool={pool.name}"


def _replicas_spec(specs: list[SearchSpec], notes: list[str]) -> SearchSpec:
    kinds = [s.kind for s in specs]
    if "replicas" not in kinds:
        raise ConfigError(
            f"a fleet is searched for the fewest replicas of each pool; --search {kinds[0]} is "
            "for one pool (search a pool's own scenario, or use --search replicas)"
            if kinds
            else "a fleet needs the replicas search"
        )
    others = [k for k in kinds if k != "replicas"]
    if others:
        notes.append(
            f"a fleet is searched for replicas only: the {' and '.join(others)} search"
            f"{'es are' if len(others) > 1 else ' is'} for one pool"
        )
    return next(s for s in specs if s.kind == "replicas")


@with_warehouse_lock
def run_fleet_capacity(
    warehouse: Path,
    base_values: dict[str, Any],
    slos: list[Slo],
    specs: list[SearchSpec],
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    summary_only: bool = False,
    quiet: bool = False,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
    intervals: bool = True,
    jobs: int | None = None,
    ray_address: str | None = None,
    compare_split: bool = False,
    shared_like: str | None = None,
    prices: dict[str, float] | None = None,
) -> FleetCapacityResult:
    """The fewest replicas of each pool of a fleet that meet every SLO (module docstring),
    and with ``compare_split`` the shared alternative's; every probe written as
    ``run_capacity`` writes its own.

    Args: as ``capacity.run_capacity``, and
        specs: the replicas search's range and target rate are used (``min``, ``max``
            per pool; ``rate`` or ``rate_scale`` for the whole fleet); other searches
            are left out with a note.
        compare_split: also search one pool of all the traffic with the settings of
            ``shared_like`` (default: the first pool).
        prices: GPU prices (``pricing.gpu_prices``), for the costs the runs row records.

    Raises:
        ConfigError: no SLO, not a fleet, an unknown pool for ``shared_like``, no
            replicas search, a bad range, no requests.
        ScenarioError: a bad scenario, a disaggregated or autoscaled pool.
    """
    t0 = time.perf_counter()
    started = datetime.now(UTC)
    if not slos:
        raise ConfigError("give at least one SLO, e.g. --slo ttft_p99=200ms")
    fleet = build_scenario(base_values, where="base scenario")
    if not fleet.is_fleet:
        raise ConfigError(
            "the base scenario has no [[pool]] tables: it is one pool (run_capacity searches it)"
        )
    notes: list[str] = []
    spec = _replicas_spec(specs, notes)
    like = None
    if compare_split:
        like = shared_like or fleet.pools[0].name
        if like not in {p.name for p in fleet.pools}:
            raise ConfigError(
                f"--shared-like {like!r}: no such pool; the fleet's pools: "
                + ", ".join(p.name for p in fleet.pools)
            )
    elif shared_like is not None:
        raise ConfigError("--shared-like names the settings of --compare-split: give both")
    for pool in fleet.pools:
        search_knob(pool)
    lo, hi = int(spec.lo or 1), int(spec.hi or DEFAULT_MAX_REPLICAS)
    if spec.lo is not None and spec.lo != lo or spec.hi is not None and spec.hi != hi:
        raise ConfigError("replicas search: min and max must be whole numbers")
    if not lo <= hi:
        raise ConfigError(f"replicas search: min ({lo}) is above max ({hi})")
    wh = Warehouse(warehouse)
    run_id = run_id or new_run_id(started)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    frame, busy = read_window(files, selection)
    chosen = selection_record(selection, busy)
    base_rate = offered_rate(prepare(frame, fleet).inp.arrival_s)
    rate = spec.rate
    if spec.rate_scale is not None:
        if base_rate is None:
            raise ConfigError("replicas search: rate_scale needs a trace with a time span")
        rate = base_rate * spec.rate_scale
    values = dict(base_values)
    if rate is not None:  # the whole fleet at the target rate, split after
        values.pop("time_scale", None)
        values["rate"] = rate
        fleet = build_scenario(values, where="base scenario at the target rate")
    shares, which = fleet_frame(frame, fleet)
    pool_spec = SearchSpec("replicas", lo=float(lo), hi=float(hi))
    share_of = {p.name: shares[np.flatnonzero(which == k)] for k, p in enumerate(fleet.pools)}

    def plan_of(
        pool_name: str, vals: dict[str, Any], share: pl.DataFrame, pool: Pool | None
    ) -> PoolPlan:
        sc = build_scenario(vals, where=f"pool {pool_name}")
        if pool is not None:
            _check_same(sc, pool)
        auto_vals = None
        if sc.autoscale is not None:  # searched as a fixed pool (search_knob)
            auto_vals, vals = vals, fixed_values(vals)
            sc = build_scenario(vals, where=f"pool {pool_name} without its autoscale table")
        for end in (lo, hi) if sc.disagg is None else ():
            build_scenario({**vals, "replicas": end}, where=f"pool {pool_name} at {end} replicas")
        return PoolPlan(
            name=pool_name,
            match=pool.match.describe() if pool is not None else "every request",
            scenario=sc,
            values=vals,
            num_requests=share.height,
            slos=pool_slos(slos, share),
            share_rate=offered_rate(share["arrival_s"].to_numpy()),
            lo=lo,
            hi=hi,
            autoscaled_values=auto_vals,
        )

    split = FleetPlan(
        "split",
        [
            plan_of(p.name, pool_values(values, fleet, p.name), share_of[p.name], p)
            for p in fleet.pools
        ],
    )
    shared = None
    if like is not None:
        shared = FleetPlan(
            SHARED, [plan_of(SHARED, shared_values(values, fleet, like), shares, None)]
        )
        share_of[SHARED] = shares
    wh.init()
    load_loop(fleet.pools[0].scenario.engine())
    outcomes: list[TaskOutcome] = []
    result = FleetCapacityResult(
        run_id=run_id,
        base=fleet,
        slos=slos,
        base_rate=base_rate,
        rate=rate if rate is not None else base_rate,
        num_requests_read=frame.height,
        inputs=[str(f) for f in files],
        split=split,
        shared=shared,
        shared_like=like,
        notes=notes,
        selection=chosen,
        values=values,
    )
    status = "failed"
    try:
        with progress("capacity search", total=None, quiet=quiet) as bar:
            for plan in [split, *([shared] if shared else [])]:
                for p in plan.pools:
                    share = share_of[p.name]
                    if not share.height or not p.slos:
                        p.replicas = lo
                        reason = "no request goes to it" if not share.height else "no SLO judges it"
                        plan.notes.append(
                            f"pool {p.name}: {reason}; {lo} replica(s), the range's least"
                        )
                        continue
                    if search_knob_of(p) == DISAGG_KNOB:
                        bar.describe(f"capacity search: {p.name} prefill:decode")
                        p.disagg = plan_disaggregation(
                            p.scenario, prepare(share, p.scenario), p.slos, max_workers=max(hi, 2)
                        )
                        best = p.disagg.best
                        if best is not None:
                            p.split, p.replicas = (best.prefill, best.decode), best.workers
                        else:
                            plan.notes.append(
                                f"pool {p.name}: no prefill:decode split of up to {max(hi, 2)} "
                                "workers meets every SLO"
                            )
                        continue
                    window = trace_window(share["arrival_s"].to_numpy()) if intervals else None
                    ctx = ProbeContext(
                        share, p.values, p.scenario.name, p.slos, run_id, wh, summary_only,
                        outcomes, bar, window, prepare_once=True,
                        jobs=jobs or default_jobs(), ray_address=ray_address,
                    )  # fmt: skip
                    prober = Prober(ctx, pool_spec, "replicas")
                    found = _search(pool_spec, prober.verdict, lo, hi, None)
                    probes = [prober.done[v] for v, _ in found.probes]
                    why = (
                        _why_none(p.scenario, share, p.slos, probes)
                        if found.answer is None
                        else None
                    )
                    p.search = SearchOutcome(
                        pool_spec, "replicas", lo, hi, found, probes, why, slos=p.slos
                    )
                    if intervals and found.answer is not None:
                        knob = Knob(lo, hi, END_TOLERANCE, integer=True)
                        p.search.interval = prober.answer_interval(found.answer, knob)
                        p.search.interval_probes = prober.interval_probes
                    p.replicas = p.minimum
                    if p.autoscaled_values is not None:
                        name = f"{p.scenario.name}-{AUTOSCALED_SUFFIX}"
                        out = autoscaled_replay(ctx, p.autoscaled_values, None, name=name)
                        p.autoscale = compare(p.search, out, p.slos)
            _check_fleet(split, values, fleet, frame, slos, run_id, wh, summary_only, outcomes, bar)
            if shared is not None:
                s = shared.pools[0].search
                shared.check = s.answer_probe if s is not None else None
        write_scenarios(wh, run_id, [o.run for o in outcomes if o.run is not None])
        wh.write(
            CAPACITY_SEARCH, fleet_capacity_table(result), {"run_id": run_id}, "capacity_search"
        )
        status = "ok"
    finally:
        result.wall_s = time.perf_counter() - t0
        result.num_replays = len(outcomes)
        write_run_row(
            wh,
            run_id=run_id,
            command="capacity",
            started=started,
            status=status,
            inputs=result.inputs,
            rows_read=frame.height,
            rows_kept=sum(o.run.summary["num_requests"] for o in outcomes if o.run is not None),
            details={
                "selection": chosen,
                "base": fleet.to_dict(),
                "slos": [str(s) for s in slos],
                "searches": {},
                "fleet": fleet_record(result, prices),
                "num_replays": len(outcomes),
                **_autoscale_details(split),
            },
        )
    return result


def _autoscale_details(plan: FleetPlan) -> dict[str, Any]:
    """The runs row's ``autoscale``: each autoscaled pool's comparison (none: no key)."""
    auto = {p.name: p.autoscale.to_dict() for p in plan.pools if p.autoscale is not None}
    return {"autoscale": auto} if auto else {}


def _check_fleet(
    plan: FleetPlan,
    values: dict[str, Any],
    fleet: Scenario,
    frame: pl.DataFrame,
    slos: list[Slo],
    run_id: str,
    wh: Warehouse,
    summary_only: bool,
    outcomes: list[TaskOutcome],
    bar: Any,
) -> None:
    """Replay the whole fleet at the pools' counts, judged over every request; step the
    pool furthest over a failing SLO up by one until every SLO holds (or none can grow)."""
    if any(p.replicas is None for p in plan.pools):
        missing = [p.name for p in plan.pools if p.replicas is None]
        plan.notes.append(
            f"no fleet check: no count in [{plan.pools[0].lo}, {plan.pools[0].hi}] meets every "
            f"SLO in pool {', '.join(missing)}"
        )
        return
    for _ in range(MAX_STEP_UPS + 1):
        counts = {p.name: p.count for p in plan.pools}
        name = f"{fleet.name}-fleet-" + "-".join(f"{k}{_count_label(v)}" for k, v in counts.items())
        sc = build_scenario(fleet_values_at(values, counts, name), where="fleet check")
        bar.describe(f"capacity search: fleet check {name}")
        task = ScenarioTask(
            len(outcomes), sc, prepare(frame, sc), tuple(slos), run_id, tables=not summary_only
        )
        out = run_task(task)
        if out.error is not None or out.slo is None:
            raise ScenarioError(f"fleet check {name} failed: {out.error}")
        if not summary_only:
            _write_tables(wh, run_id, out, out.tables)
        out.tables = {}
        outcomes.append(out)
        bar.advance(1)
        plan.checks.append(out)
        plan.check = out
        if out.slo.all_met:
            return
        grow = _pool_to_grow(plan, out, slos)
        if grow is None:
            plan.notes.append(
                "the whole fleet fails an SLO at these counts and no failing pool can grow "
                "(raise --max-replicas)"
            )
            return
        p, why = grow
        if p.split is not None:  # TTFT: one more prefill worker; else one more decode worker
            x, y = p.split
            p.split = (x + 1, y) if why.startswith("ttft") else (x, y + 1)
            plan.step_ups.append(f"{p.name} {x}p{y}d -> {_count_label(p.split)}: {why}")
            p.replicas = sum(p.split)
            continue
        plan.step_ups.append(f"{p.name} {p.replicas} -> {int(p.replicas or 0) + 1}: {why}")
        p.replicas = int(p.replicas or 0) + 1
    plan.notes.append(f"the fleet check stopped after {MAX_STEP_UPS} step-ups")


def _pool_to_grow(
    plan: FleetPlan, out: TaskOutcome, slos: list[Slo]
) -> tuple[PoolPlan, str] | None:
    """The pool furthest over (by measured / limit, its own requests) an SLO the whole
    fleet fails, among those below the top of the range."""
    assert out.slo is not None and out.run is not None
    pools = out.run.summary.get("pools") or {}
    best: tuple[float, PoolPlan, str] | None = None
    for s in slos:
        if out.slo.met[s.key]:
            continue
        for p in plan.pools:
            if p.replicas is None or p.replicas >= p.hi:
                continue
            entry = (pools.get(p.name) or {}).get("slo", {}).get(s.key) or {}
            measured = entry.get("measured_s")
            if measured is None:
                continue
            ratio = float(measured) / s.limit_s
            if best is None or ratio > best[0]:
                fleet_v = out.slo.measured_s[s.key]
                why = f"{s.key} {fleet_v:.4g}s over the fleet, {float(measured):.4g}s in the pool"
                best = (ratio, p, why)
    return None if best is None else (best[1], best[2])


def fleet_capacity_table(result: FleetCapacityResult) -> pa.Table:
    """The capacity_search rows of every pool's search (``search``: ``search_label``)."""
    tables = []
    for plan in [result.split, *([result.shared] if result.shared else [])]:
        for p in plan.pools:
            if p.search is None:
                continue
            t = capacity_table(result.pool_result(p))
            label = pa.array([search_label(plan, p)] * t.num_rows, pa.string())
            tables.append(t.set_column(t.schema.get_field_index("search"), "search", label))
    if not tables:
        return capacity_table(result.pool_result(result.split.pools[0]))
    return pa.concat_tables(tables)


def plan_record(plan: FleetPlan, prices: dict[str, float] | None = None) -> dict[str, Any]:
    """One arrangement as JSON-able data: per pool its minimum, count, GPUs and cost, and
    the whole traffic's verdicts and classes at the counts."""
    prices = prices or {}
    costs = plan.costs(prices)
    check = plan.check
    return {
        "found": plan.found,
        "pools": {
            p.name: {
                "match": p.match,
                "policy": p.scenario.policy,
                "profile": p.scenario.profile,
                "num_requests": p.num_requests,
                "offered_rate": p.share_rate,
                "minimum": p.minimum,
                "replicas": p.replicas,
                "gpu": p.gpu,
                "gpus_per_replica": p.gpus_per_replica,
                "gpus": p.gpus,
                "cost": costs[p.name],
                "search": p.search.brief() if p.search is not None else None,
                "prefill_decode": list(p.split) if p.split is not None else None,
                "disagg_search": p.disagg.to_dict() if p.disagg is not None else None,
                "autoscale": p.autoscale.to_dict() if p.autoscale is not None else None,
                "slo": plan.pool_summary(p.name).get("slo"),
                "classes": plan.pool_summary(p.name).get("classes"),
            }
            for p in plan.pools
        },
        "replicas": plan.total_replicas,
        "gpus": plan.total_gpus,
        "usd_per_hour": plan.usd_per_hour(prices),
        "check": None
        if check is None or check.slo is None
        else {"scenario": check.name, **check.slo.to_dict()},
        "step_ups": plan.step_ups,
        "notes": plan.notes,
        "classes": plan.classes,
    }


def fleet_record(
    result: FleetCapacityResult, prices: dict[str, float] | None = None
) -> dict[str, Any]:
    """The run's fleet answer (the runs row's ``details.fleet``, ``--json``'s ``fleet``):
    ``split`` and, with --compare-split, ``shared`` and ``shared_like``."""
    out: dict[str, Any] = {
        "rate": result.rate,
        "pools": [p.name for p in result.split.pools],
        "split": plan_record(result.split, prices),
        "notes": result.notes,
    }
    if result.shared is not None:
        out["shared_like"] = result.shared_like
        out["shared"] = plan_record(result.shared, prices)
    return out


@dataclass
class FleetRecommendation:
    """What to deploy per pool: each pool's own recommendation (``recommend.recommend`` over
    its probes: the cheapest that meets every SLO with the margin at the upper end of its
    interval), and the fleet scenario that deploys them all."""

    margin_pct: float
    pools: dict[str, Recommendation]  # per searched pool
    replicas: dict[str, int | tuple[int, int]]  # per pool: its recommendation's, else the count
    # found; a disaggregated pool's (prefill, decode) workers
    values: dict[str, Any]  # the fleet's keys with those counts
    path: Path | None = None

    @property
    def complete(self) -> bool:
        """Every searched pool has a recommendation."""
        return all(r.chosen is not None for r in self.pools.values())


def recommend_fleet(
    result: FleetCapacityResult, prices: dict[str, float] | None = None, margin_pct: float = 10.0
) -> FleetRecommendation:
    """Each pool's recommendation from its own probes, and the fleet at those counts.

    Cheap: no replay; each pool's candidates are its search's probes. The fleet as a
    whole is judged at the counts found (``check``), not at these."""
    recs: dict[str, Recommendation] = {}
    counts: dict[str, int | tuple[int, int]] = {}
    for p in result.split.pools:
        if p.split is not None:  # a disaggregated pool: the split its search found
            counts[p.name] = p.split
            continue
        if p.search is not None:
            rec = recommend(result.pool_result(p), p.values, prices, margin_pct)
            recs[p.name] = rec
            if rec.chosen is not None and rec.chosen.outcome.run is not None:
                counts[p.name] = rec.chosen.outcome.run.scenario.replicas
                continue
        if p.replicas is not None:
            counts[p.name] = p.replicas
    name = f"{result.base.name}-recommended"
    return FleetRecommendation(
        margin_pct, recs, counts, fleet_values_at(result.values, counts, name)
    )


def fleet_toml(rec: FleetRecommendation, run_id: str) -> str:
    """The fleet recommendation as a scenario file: the fleet's keys, each ``[[pool]]`` with
    its count, and per pool the engine command in the comments."""
    header = [
        f"What `tracereplay capacity` recommends for the fleet (run {run_id}): per pool, the",
        f"cheapest probe that meets every SLO with a {rec.margin_pct:g}% margin on its own",
        "requests (the fleet as a whole was checked at the counts the search found).",
        "",
    ]
    for name, r in rec.pools.items():
        n = rec.replicas.get(name)
        if r.chosen is None:
            header.append(f"pool {name}: no probe meets with the margin; {n} replica(s), as found")
            continue
        cmd = r.command
        header.append(
            f"pool {name}: {n} replica{'' if n == 1 else 's'} of "
            + (cmd or f"policy {r.chosen.outcome.run.scenario.policy} (no engine command)")  # type: ignore[union-attr]
        )
    header.append("Replay it: tracereplay replay --scenario THIS_FILE")
    top = {k: v for k, v in rec.values.items() if k != "pool"}
    lines = [toml_text(top, header).rstrip("\n")]
    for table in rec.values.get("pool", []):
        lines += ["", "[[pool]]"]
        flat = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
        lines += [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in flat.items()]
        for k, v in table.items():
            if isinstance(v, dict):
                lines += ["", f"[pool.{json.dumps(str(k))}]"]
                lines += [f"{json.dumps(str(a))} = {toml_value(b)}" for a, b in v.items()]
    return "\n".join(lines) + "\n"


def write_fleet_recommendation(rec: FleetRecommendation, run_id: str, path: Path) -> Path:
    """Write the fleet scenario TOML (atomically) and remember where."""
    from pipeline.storage import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    rec.path = write_atomic(path, fleet_toml(rec, run_id))
    return rec.path


__all__ = [
    "SHARED",
    "FleetCapacityResult",
    "FleetPlan",
    "FleetRecommendation",
    "PoolPlan",
    "fleet_capacity_table",
    "fleet_frame",
    "fleet_record",
    "fleet_toml",
    "fleet_values_at",
    "plan_record",
    "recommend_fleet",
    "pool_slos",
    "pool_values",
    "run_fleet_capacity",
    "search_knob",
    "search_label",
    "shared_values",
    "write_fleet_recommendation",
]
