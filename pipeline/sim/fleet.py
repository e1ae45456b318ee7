"""A fleet's replay: its pools' replays side by side on one clock, merged into one run.

``prepare_fleet`` makes the fleet's arrivals from the whole trace (the fleet's own
arrival keys), splits the requests by pool (``pools.assign``) and prepares each
pool's share with the pool's scenario, its arrivals kept as the fleet made them.
``simulate_fleet`` replays every pool (each with its own replicas, router and
engine settings) and merges the results: one ``SimResult`` whose requests are in
the fleet's arrival order, with the fleet's replica numbering (pool k's replicas
follow those of the pools before it), and each request's pool.

The merged result's summary is the fleet's (``fleet_summary``): its latencies
are over every request; its KV figures are the fullest pool's, since a KV
block is a different size on each GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.errors import ScenarioError
from pipeline.sim.arrivals import make_arrivals
from pipeline.sim.classes import Slo, class_summary, labels_of, whole_traffic_slos
from pipeline.sim.disagg import simulate_disaggregated
from pipeline.sim.pools import Pool, assign, pool_replicas
from pipeline.sim.replay_input import Prepared, prepare
from pipeline.sim.scenario import ArrivalSpec, Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import (
    NRQ,
    NRQF,
    NST,
    NSTF,
    R_REPLICA,
    S_REPLICA,
    SF_START,
    SimInput,
    SimResult,
)
from pipeline.sim.summary import StepTotals, summarize

# a step sink of one pool: (pool index, st, stf, role per row or None, KV blocks per
# replica), the rows already on the fleet's clock and replica numbering
PoolSink = Callable[
    [int, npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int8] | None, int],
    None,
]
_TRACE = ArrivalSpec(process="trace", time_scale=1.0, rate=None, burstiness=1.0, num_requests=None)


@dataclass
class FleetPrepared(Prepared):
    """A fleet's requests, split by pool and ready for the loop.

    As a ``Prepared`` it holds the merged requests: ``inp`` (arrivals on the fleet's
    clock and lengths, for a stage that sizes or rates its input; the pools replay
    their own), ``request_ids``, ``classes`` and ``groups``, in the fleet's arrival
    order; ``num_lead`` is 0 (the pools' lead-in requests are in none of these).
    """

    pools: list[Pool] = field(default_factory=list)
    prepared: list[Prepared | None] = field(default_factory=list)  # per pool; None: no request
    first_arrival: list[float] = field(default_factory=list)  # per pool: its first measured
    order: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    pool_of: npt.NDArray[np.int16] = field(default_factory=lambda: np.zeros(0, np.int16))
    num_requests_assigned: list[int] = field(default_factory=list)  # per pool, before caps

    @property
    def num_pool_lead(self) -> int:
        """Requests replayed before a busiest window in every pool, not in the result."""
        return sum(p.num_lead for p in self.prepared if p is not None)

    @property
    def num_requests(self) -> int:
        return len(self.order)


def split_frame(frame: pl.DataFrame, sc: Scenario) -> tuple[pl.DataFrame, npt.NDArray[np.int64]]:
    """The requests with the fleet's arrival times (its arrival keys over the whole
    trace, in ``arrival_s``) and each row's pool index (``pools.assign``)."""
    rng = np.random.default_rng(sc.seed)
    idx, arrival = make_arrivals(sc.arrivals, frame["arrival_s"].to_numpy(), rng)
    if len(idx) != frame.height or not np.array_equal(idx, np.arange(frame.height)):
        ids = frame["request_id"].gather(idx)
        if len(np.unique(idx)) < len(idx):  # drawn with replacement: keep ids unique
            ids = ids + "#" + pl.Series(np.arange(len(idx))).cast(pl.String)
        frame = frame[idx].with_columns(ids.alias("request_id"))
    frame = frame.with_columns(pl.Series("arrival_s", arrival, dtype=pl.Float64))
    return frame, assign(frame, sc.pools)


def prepare_fleet(frame: pl.DataFrame, sc: Scenario, *, with_groups: bool = True) -> FleetPrepared:
    """Arrivals for the whole fleet, then each pool's share prepared (``replay_input.prepare``).

    Raises:
        ScenarioError: a pool's share fails its scenario's checks (naming the pool).
    """
    assert sc.pools, "prepare_fleet takes a fleet (a scenario with pools)"
    frame, which = split_frame(frame, sc)
    arrival = frame["arrival_s"].to_numpy()
    preps: list[Prepared | None] = []
    firsts: list[float] = []
    rows_of: list[npt.NDArray[np.int64]] = []
    assigned: list[int] = []
    row_ids = frame.select("request_id").with_row_index("_row")
    for k, pool in enumerate(sc.pools):
        rows = np.flatnonzero(which == k)
        assigned.append(len(rows))
        if not len(rows):
            preps.append(None)
            firsts.append(0.0)
            rows_of.append(np.zeros(0, dtype=np.int64))
            continue
        sub = frame[rows]
        psc = dataclasses.replace(pool.scenario, arrivals=_TRACE)
        try:
            prep = prepare(sub, psc, with_groups=with_groups)
        except ScenarioError as exc:
            raise ScenarioError(f"pool {pool.name!r}: {exc}") from None
        measured = (
            pl.DataFrame({"request_id": pa.array(prep.request_ids)})
            .join(row_ids, on="request_id", how="left", maintain_order="left")["_row"]
            .to_numpy()
            .astype(np.int64)
        )
        preps.append(prep)
        rows_of.append(measured)
        firsts.append(float(arrival[measured[0]]) if len(measured) else 0.0)
    rows = np.concatenate(rows_of) if rows_of else np.zeros(0, dtype=np.int64)
    order = np.argsort(arrival[rows], kind="stable")
    got = [p for p in preps if p is not None]
    lead = [getattr(p.inp, "lead", 0) for p in got]
    inp = SimInput(
        np.ascontiguousarray(arrival[rows][order]),
        np.concatenate([p.inp.prompt_tokens[k:] for p, k in zip(got, lead, strict=True)])[order],
        np.concatenate([p.inp.output_tokens[k:] for p, k in zip(got, lead, strict=True)])[order],
    )
    groups = {
        c: np.concatenate([p.groups[c] for p in got])[order]
        for c in ("tenant", "model")
        if got and all(c in p.groups for p in got)
    }
    pool_of = np.concatenate([np.full(len(r), k, dtype=np.int16) for k, r in enumerate(rows_of)])[
        order
    ]
    merged_rows = rows[order]
    return FleetPrepared(
        num_dropped=sum(p.num_dropped for p in got),
        num_warmup=sum(p.num_warmup for p in got),
        pools=list(sc.pools),
        prepared=preps,
        first_arrival=firsts,
        order=order,
        pool_of=pool_of,
        request_ids=frame["request_id"].gather(merged_rows).to_arrow(),
        classes=labels_of(frame, merged_rows),
        num_requests_assigned=assigned,
        inp=inp,
        groups=groups,
    )


@dataclass
class PoolOutcome:
    """One pool's replay within a fleet, its times on the fleet's clock."""

    pool: Pool
    result: SimResult | None  # None: no request went to it
    steps: StepTotals
    replica_base: int  # the fleet index of its first replica
    prep: Prepared | None


@dataclass
class FleetResult:
    """A fleet's replay: the merged result and each pool's."""

    result: SimResult  # every request, in the fleet's arrival order
    steps: StepTotals  # every pool's timeline
    pools: list[PoolOutcome]
    pool_of: npt.NDArray[np.int16]  # per merged request


def _shift(res: SimResult, dt: float, base: int) -> SimResult:
    """``res`` on the fleet's clock (``dt`` later) and replica numbering (``base`` on)."""
    rq = res.rq.copy()
    rq[:, R_REPLICA] += base
    st, stf = res.st.copy(), res.stf.copy()
    st[:, S_REPLICA] += base
    stf[:, SF_START] += dt
    times = None if res.disagg_times is None else res.disagg_times + dt
    events = res.scale_events.copy()
    events["time"] += dt
    events["replica"] += base
    return dataclasses.replace(
        res, rq=rq, rqf=res.rqf + dt, st=st, stf=stf, disagg_times=times, scale_events=events
    )


def simulate_fleet(
    sc: Scenario,
    fp: FleetPrepared,
    *,
    on_steps: PoolSink | None = None,
    on_progress: Callable[[int], None] | None = None,
    step_rows: int = 1 << 17,
) -> FleetResult:
    """Replay every pool of the fleet ``sc`` and merge the results.

    ``on_steps`` (as ``simulate``'s, with the pool's index first) takes each pool's
    timeline in chunks, already on the fleet's clock and replica numbering; without
    it each pool's timeline is kept whole and the merged result holds them all.
    ``on_progress``: requests replayed so far over the fleet.
    """
    outcomes: list[PoolOutcome] = []
    base = 0
    done = 0
    for k, pool in enumerate(fp.pools):
        prep = fp.prepared[k]
        steps = StepTotals()
        if prep is None:
            outcomes.append(PoolOutcome(pool, None, steps, base, None))
            base += pool_replicas(pool.scenario)
            continue
        # the pool's first measured request arrives at its loop time 0 after a lead-in,
        # else at its input's first arrival: the shift that puts it at its fleet time
        inp = prep.inp
        lead = getattr(inp, "lead", 0)
        t_first = 0.0 if lead else float(inp.arrival_s[0])
        dt = fp.first_arrival[k] - t_first
        sink = None
        blocks = pool.scenario.num_kv_blocks
        if on_steps is not None:
            kk, b = k, base

            def sink(
                st: npt.NDArray[np.int64],
                stf: npt.NDArray[np.float64],
                kk: int = kk,
                b: int = b,
                dt: float = dt,
                steps: StepTotals = steps,
                blocks: int = blocks,
            ) -> None:
                st, stf = st.copy(), stf.copy()
                st[:, S_REPLICA] += b
                stf[:, SF_START] += dt
                steps.add(st, stf)
                on_steps(kk, st, stf, None, blocks)

        progress = None
        if on_progress is not None:
            start = done

            def progress(n: int, start: int = start) -> None:
                on_progress(start + n)

        if pool.scenario.disagg is not None:  # both sides, the timeline whole
            half = None if progress is None else (lambda n, p=progress: p(n // 2))
            res = _shift(
                simulate_disaggregated(inp, pool.scenario, on_progress=half).result, dt, base
            )
            steps.add(res.st, res.stf)
            if on_steps is not None:
                for lo in range(0, len(res.st), step_rows):
                    hi = lo + step_rows
                    role = None if res.step_role is None else res.step_role[lo:hi]
                    on_steps(k, res.st[lo:hi], res.stf[lo:hi], role, res.num_kv_blocks)
                res.st, res.stf, res.step_role = res.st[:0], res.stf[:0], None
        else:
            res = simulate(
                inp,
                pool.scenario.engine(),
                on_steps=sink,
                on_progress=progress,
                step_rows=step_rows,
            )
            res = _shift(res, dt, base)
            if on_steps is None:
                steps.add(res.st, res.stf)
        outcomes.append(PoolOutcome(pool, res, steps, base, prep))
        base += pool_replicas(pool.scenario)
        done += res.num_requests
    return FleetResult(
        result=merge_results([o.result for o in outcomes], fp.order, sc),
        steps=_merged_steps([o.steps for o in outcomes]),
        pools=outcomes,
        pool_of=fp.pool_of,
    )


def merge_results(
    results: Sequence[SimResult | None], order: npt.NDArray[np.int64], sc: Scenario
) -> SimResult:
    """The pools' results as one: requests concatenated then put in ``order``; step rows
    concatenated; the fleet's front end; the largest pool's KV blocks per replica; the
    disaggregated pools' per-request times."""
    got = [r for r in results if r is not None]
    rq = np.concatenate([r.rq for r in got]) if got else np.zeros((0, NRQ), dtype=np.int32)
    rqf = np.concatenate([r.rqf for r in got]) if got else np.zeros((0, NRQF))
    st = np.concatenate([r.st for r in got]) if got else np.zeros((0, NST), dtype=np.int64)
    stf = np.concatenate([r.stf for r in got]) if got else np.zeros((0, NSTF))
    times = None  # per request [prefill done, KV landed]: NaN in the aggregated pools
    if any(r.disagg_times is not None for r in got):
        parts = [
            r.disagg_times if r.disagg_times is not None else np.full((len(r.rq), 2), np.nan)
            for r in got
        ]
        times = np.concatenate(parts)[order]
    events = np.concatenate([r.scale_events for r in got]) if got else None
    if events is not None:
        events = events[np.argsort(events["time"], kind="stable")]
    return SimResult(
        **({"scale_events": events} if events is not None else {}),
        rq=np.ascontiguousarray(rq[order]),
        rqf=np.ascontiguousarray(rqf[order]),
        st=st,
        stf=stf,
        num_kv_blocks=max((r.num_kv_blocks for r in got), default=0),
        frontend=sc.frontend.as_array(),
        disagg_times=times,  # (the step rows' roles stay with each pool's result)
    )


def _merged_steps(parts: Sequence[StepTotals]) -> StepTotals:
    out = StepTotals()
    for p in parts:
        out.merge(p)
    return out


def fleet_summary(
    sc: Scenario,
    fr: FleetResult,
    fp: FleetPrepared,
    facts: dict[str, Any],
    slos: Sequence[Slo] = (),
    pool_extra: Callable[[PoolOutcome], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The fleet's summary: its figures over every request, its per-class figures, and
    ``pools``: each pool's own summary (with its classes, SLO verdicts and match)."""
    out = {**summarize(fr.result, fr.steps), **facts}
    pools: dict[str, Any] = {}
    fullest: dict[str, Any] = {}
    for k, o in enumerate(fr.pools):
        one = pool_summary(o, fp.num_requests_assigned[k], slos)
        if pool_extra is not None and o.result is not None:
            one.update(pool_extra(o))
        pools[o.pool.name] = one
        if float(one.get("kv_peak_usage") or 0.0) >= float(fullest.get("kv_peak_usage") or 0.0):
            fullest = one
    # a KV block is a different size on each pool's GPU: the fullest replica's figures
    for key in ("kv_peak_usage", "kv_peak_blocks", "num_kv_blocks"):
        out[key] = fullest.get(key, 0)
    out["num_replicas"] = sum(pool_replicas(o.pool.scenario) for o in fr.pools)
    if slos:
        out.update(whole_traffic_slos(fr.result, fp.classes, slos, out["duration_s"]))
    out["classes"] = class_summary(fr.result, fp.classes, slos, out["duration_s"])
    out["pools"] = pools
    return out


def pool_summary(o: PoolOutcome, assigned: int, slos: Sequence[Slo] = ()) -> dict[str, Any]:
    """One pool's summary within its fleet (its requests' figures, its replicas')."""
    sc = o.pool.scenario
    head = {
        "match": o.pool.match.describe(),
        "policy": sc.policy,
        "profile": sc.profile,
        "replicas": pool_replicas(sc),
        "num_requests_assigned": assigned,
    }
    if o.result is None or o.prep is None:
        return {**head, "num_requests": 0, "completed": 0}
    out = {**head, **summarize(o.result, o.steps), **scenario_extras(sc, o.result, slos)}
    out["num_dropped"] = o.prep.num_dropped
    if slos:
        out.update(whole_traffic_slos(o.result, o.prep.classes, slos, out["duration_s"]))
    out["classes"] = class_summary(o.result, o.prep.classes, slos, out["duration_s"])
    return out


def scenario_extras(sc: Scenario, res: SimResult, slos: Sequence[Slo] = ()) -> dict[str, Any]:
    """The summary entries a scenario's features add: ``autoscale`` (its scaling, and
    with SLOs the requests that arrived while replicas were starting)."""
    if sc.autoscale is None:
        return {}
    from pipeline.sim.autoscale import autoscale_summary, scale_up_misses

    entry = autoscale_summary(res, sc)
    if slos:
        entry["during_scale_ups"] = scale_up_misses(res, slos)
    return {"autoscale": entry}


def pool_names(fp: FleetPrepared) -> pa.Array:
    """The pool name of each merged request (dictionary-encoded, as a string column)."""
    names = pa.array([p.name for p in fp.pools])
    return pa.DictionaryArray.from_arrays(pa.array(fp.pool_of.astype(np.int32)), names).cast(
        pa.string()
    )
