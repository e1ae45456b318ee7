"""Autoscaling: a pool of replicas whose size follows the load over a replay.

The model is concurrency autoscaling as Knative's KPA (and KServe on it) does
it, and what a KEDA queue-length trigger amounts to: a controller looks at
the requests outstanding (routed and not finished, the routers' load
measure) every ``interval_s`` of replay time and wants

    desired = clamp(ceil(outstanding over all replicas / target), min_replicas, max_replicas)

At the control tick ``T = j * interval_s`` (j = 1, 2, ...; replay time 0 counts
as a scale-up of the initial ``replicas``):

- a replica that was told to stop and holds no request any more is off (it
  can be started again);
- if ``desired > active + starting``, the lowest-numbered replicas that are
  off start (as many as are off, up to the difference), their prefix caches
  empty (``cache.flush``); each becomes routable at ``T + startup_s`` (weights
  loaded, engine warmed up);
- else if ``desired < active`` and no scale-up happened in the last
  ``cooldown_s`` and the last scale-down is ``cooldown_s`` or more ago, the
  highest-numbered active replicas stop getting requests until ``desired``
  are left; they finish what they hold (drain), then are off.

A replica is routable from its ``routable`` time (inclusive) until the tick
that stops it (exclusive): a tick at time T runs before the arrivals at T.
The loops run the ticks up to each arrival before routing it (``loop.py``,
``reference.py``), so the controller runs while requests arrive, not after
the last one. GPU time counts from a replica's start to its drain (or the end
of the replay: the last request's finish).

This module holds the scenario table (``Autoscale``), the controller the
compiled loop calls (``control``, ``promote``), the events both loops' results
carry (``scale_events``) and what a replay's scaling came to
(``autoscale_summary``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline import validation
from pipeline.errors import ScenarioError
from pipeline.sim.state import F_ARRIVAL, F_FINISH, R_REPLICA, SCALE_EVENT_DTYPE

if TYPE_CHECKING:
    from pipeline.sim.classes import Slo
    from pipeline.sim.scenario import Scenario
    from pipeline.sim.state import SimResult

KEY = "autoscale"  # the scenario key: a TOML table of the keys below

# Defaults and where they come from (docs/replay.md, section Autoscaling).
DEFAULT_INTERVAL_S = 30.0  # KEDA's pollingInterval default
DEFAULT_COOLDOWN_S = 300.0  # KEDA's cooldownPeriod; Kubernetes HPA's scale-down stabilization
DEFAULT_LOAD_GBPS = 2.0  # weights read from local NVMe into the GPU, GB/s (an assumption)
DEFAULT_WARMUP_S = 20.0  # engine start besides the weights: compile, CUDA graphs (assumption)

# key -> (type, default, help)
KEYS: dict[str, tuple[type, Any, str]] = {
    "min_replicas": (int, 1, "fewest replicas routable (>= 1: no scale to zero)"),
    "max_replicas": (int, None, "most replicas (required)"),
    "target": (float, None, "outstanding requests per active replica the controller aims at"),
    "interval_s": (float, DEFAULT_INTERVAL_S, "control period, s of replay time"),
    "cooldown_s": (float, DEFAULT_COOLDOWN_S, "no scale-down within this of a scale event, s"),
    "startup_s": (float, None, "start to routable, s; default: weights / load_gbps + warmup_s"),
    "load_gbps": (float, None, f"weight load bandwidth, GB/s (default {DEFAULT_LOAD_GBPS})"),
    "warmup_s": (float, None, f"engine warm-up after the weights, s (default {DEFAULT_WARMUP_S})"),
}
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "target": (1e-6, 1e9),
    "interval_s": (1e-3, 1e7),
    "cooldown_s": (0.0, 1e9),
    "startup_s": (0.0, 1e7),
    "load_gbps": (1e-3, 1e6),
    "warmup_s": (0.0, 1e7),
}
MAX_REPLICAS = 4096  # as scenario.INT_RANGES["replicas"]

# replica states (Scaling.rs)
OFF = 0  # not started, or drained after a stop
STARTING = 1  # started, not routable yet (Scaling.up: when it is)
ACTIVE = 2  # routable
DRAINING = 3  # stopped: finishing what it holds

# event kinds (SimResult.scale_events["kind"])
STOP = 0
DRAINED = 1
START = 2
ROUTABLE = 3
KINDS = ("stop-routing", "drained", "start", "routable")
EVENT_DTYPE = SCALE_EVENT_DTYPE  # time, replica, kind

# Autoscale.as_array(): what the loops read
A_INITIAL = 0
A_MIN = 1
A_MAX = 2
A_TARGET = 3
A_INTERVAL = 4
A_STARTUP = 5
A_COOLDOWN = 6
NA = 7

# Scaling.gi / Scaling.gf
GI_TICK = 0  # the next tick's j (its time: j * interval_s)
GI_NEV = 1  # events written
GI_RR = 2  # round robin: the replica the latest request went to
NGI = 3
GF_LAST_UP = 0  # time of the latest scale-up (0: the initial replicas)
GF_LAST_DOWN = 1  # time of the latest scale-down (-inf: none)
GF_NEXT_UP = 2  # the earliest time a starting replica becomes routable (inf: none starting)
NGF = 3


@dataclass(frozen=True)
class Autoscale:
    """The ``[autoscale]`` table of a scenario, resolved."""

    min_replicas: int  # fewest routable replicas, >= 1
    max_replicas: int  # most replicas (the loops allocate this many)
    target: float  # outstanding requests per active replica aimed at, > 0
    interval_s: float  # control period
    cooldown_s: float  # scale-down cool-off
    startup_s: float  # start to routable
    startup_source: str  # how startup_s was found ("given" or the arithmetic)
    initial_replicas: int  # the scenario's replicas, clamped to [min, max]

    def as_array(self) -> npt.NDArray[np.float64]:
        """The parameters as the loops read them (A_*)."""
        a = np.zeros(NA)
        a[A_INITIAL] = self.initial_replicas
        a[A_MIN] = self.min_replicas
        a[A_MAX] = self.max_replicas
        a[A_TARGET] = self.target
        a[A_INTERVAL] = self.interval_s
        a[A_STARTUP] = self.startup_s
        a[A_COOLDOWN] = self.cooldown_s
        return a

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_table(value: Any, where: str) -> dict[str, Any]:
    """The ``autoscale`` table's keys, each of its type and in its range (the checks
    across keys wait for ``resolve``).

    Raises:
        ScenarioError: one line naming the key, what it takes and how to fix it.
    """
    if not isinstance(value, dict):
        raise ScenarioError(
            f"{where}: autoscale must be a table of {', '.join(KEYS)}, got "
            f"{validation.type_name(value)}"
        )
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key autoscale.{unknown[0]}; allowed: {', '.join(KEYS)}"
        )
    out: dict[str, Any] = {}
    for key, v in value.items():
        typ = KEYS[key][0]
        name = f"autoscale.{key}"
        if typ is int:
            out[key] = validation.integer(
                v, name, where, lo=1, hi=MAX_REPLICAS, integral_floats=True, error=ScenarioError
            )
        else:
            lo, hi = FLOAT_RANGES[key]
            out[key] = validation.finite_float(v, name, where, lo=lo, hi=hi, error=ScenarioError)
    return out


def resolve(
    table: dict[str, Any], replicas: int, weight_bytes: int | None, where: str
) -> Autoscale:
    """The checked table (``check_table``) with its defaults, for a scenario of
    ``replicas`` whose profile holds ``weight_bytes`` (None: an explicit [cost]).

    Raises:
        ScenarioError: min_replicas > max_replicas, a missing key, or startup_s both
            given and derived.
    """
    for key in ("max_replicas", "target"):
        if key not in table:
            raise ScenarioError(f"{where}: autoscale.{key} is required ({KEYS[key][2]})")
    lo = int(table.get("min_replicas", KEYS["min_replicas"][1]))
    hi = int(table["max_replicas"])
    if lo > hi:
        raise ScenarioError(
            f"{where}: autoscale.min_replicas ({lo}) must be <= autoscale.max_replicas ({hi})"
        )
    derived = [k for k in ("load_gbps", "warmup_s") if k in table]
    if "startup_s" in table:
        if derived:
            raise ScenarioError(
                f"{where}: give autoscale.startup_s or autoscale.{derived[0]} (which derives "
                "it), not both"
            )
        startup = float(table["startup_s"])
        source = "given"
    else:
        if weight_bytes is None:
            raise ScenarioError(
                f"{where}: autoscale.startup_s is required with a [cost] table (no profile "
                "weights to derive it from)"
            )
        gbps = float(table.get("load_gbps", DEFAULT_LOAD_GBPS))
        warm = float(table.get("warmup_s", DEFAULT_WARMUP_S))
        startup = weight_bytes / (gbps * 1e9) + warm
        source = f"{weight_bytes / 1e9:.1f} GB of weights / {gbps:g} GB/s + {warm:g} s warm-up"
    return Autoscale(
        min_replicas=lo,
        max_replicas=hi,
        target=float(table["target"]),
        interval_s=float(table.get("interval_s", DEFAULT_INTERVAL_S)),
        cooldown_s=float(table.get("cooldown_s", DEFAULT_COOLDOWN_S)),
        startup_s=startup,
        startup_source=source,
        initial_replicas=min(max(replicas, lo), hi),
    )


# --- the controller, as the compiled loop runs it ---------------------------------


class Scaling(NamedTuple):
    """The autoscaler's state in the compiled loop (every array empty: no autoscaling)."""

    par: npt.NDArray[np.float64]  # Autoscale.as_array()
    rs: npt.NDArray[np.int64]  # per replica: OFF / STARTING / ACTIVE / DRAINING
    up: npt.NDArray[np.float64]  # per replica: when a STARTING one becomes routable
    out: npt.NDArray[np.int64]  # per replica: outstanding requests at the tick (scratch)
    mask: npt.NDArray[np.uint64]  # routable replicas as bits (prefix_aware's candidates)
    gi: npt.NDArray[np.int64]  # GI_*
    gf: npt.NDArray[np.float64]  # GF_*
    ev: npt.NDArray[np.int64]  # events: replica, kind (START or STOP)
    evf: npt.NDArray[np.float64]  # ... their times


def new_scaling(params: npt.NDArray[np.float64], events: int = 256) -> Scaling:
    """The controller's state before the replay: replicas 0..initial-1 active
    (``params`` empty: no autoscaling, every array empty)."""
    if len(params) == 0:
        z = np.zeros(0, dtype=np.int64)
        return Scaling(
            params,
            z,
            np.zeros(0),
            z,
            np.zeros(0, np.uint64),
            z,
            np.zeros(0),
            z.reshape(0, 2),
            np.zeros(0),
        )
    m = int(params[A_MAX])
    rs = np.full(m, OFF, dtype=np.int64)
    rs[: int(params[A_INITIAL])] = ACTIVE
    gi = np.zeros(NGI, dtype=np.int64)
    gi[GI_TICK] = 1
    gi[GI_RR] = -1
    gf = np.array([0.0, -np.inf, np.inf])
    sc = Scaling(
        params,
        rs,
        np.full(m, np.inf),
        np.zeros(m, dtype=np.int64),
        np.zeros((m + 63) // 64, dtype=np.uint64),
        gi,
        gf,
        np.zeros((events, 2), dtype=np.int64),
        np.zeros(events),
    )
    set_mask(sc.rs, sc.mask)
    return sc


def grow_events(sc: Scaling) -> Scaling:
    """``sc`` with twice the room for events (the loop returned RET_SCALE_FULL)."""
    n = len(sc.evf)
    ev = np.zeros((2 * n, 2), dtype=np.int64)
    evf = np.zeros(2 * n)
    ev[:n] = sc.ev
    evf[:n] = sc.evf
    return sc._replace(ev=ev, evf=evf)


@njit(cache=True, error_model="numpy")
def set_mask(rs: npt.NDArray[np.int64], mask: npt.NDArray[np.uint64]) -> None:
    """The routable replicas' bits."""
    mask[:] = 0
    for r in range(rs.shape[0]):
        if rs[r] == ACTIVE:
            mask[r // 64] |= np.uint64(1) << np.uint64(r % 64)


@njit(cache=True, error_model="numpy", inline="always")
def next_tick(par: npt.NDArray[np.float64], gi: npt.NDArray[np.int64]) -> float:
    """Time of the next control tick."""
    return gi[GI_TICK] * par[A_INTERVAL]  # type: ignore[no-any-return]


@njit(cache=True, error_model="numpy", inline="always")
def room(sc: Scaling) -> bool:
    """Whether one tick's events fit (at most one per replica)."""
    return sc.ev.shape[0] - sc.gi[GI_NEV] >= sc.rs.shape[0]


@njit(cache=True, error_model="numpy")
def promote(sc: Scaling, t: float) -> bool:
    """Starting replicas routable by ``t`` become active; whether any did."""
    rs, up, gf = sc.rs, sc.up, sc.gf
    if t < gf[GF_NEXT_UP]:  # (an arrival's test: none is due)
        return False
    nxt = math.inf
    for r in range(rs.shape[0]):
        if rs[r] == STARTING:
            if up[r] <= t:
                rs[r] = ACTIVE
                up[r] = math.inf
            else:
                nxt = min(nxt, up[r])
    gf[GF_NEXT_UP] = nxt
    set_mask(rs, sc.mask)
    return True


@njit(cache=True, error_model="numpy", inline="always")
def _event(sc: Scaling, t: float, r: int, kind: int) -> None:
    j = sc.gi[GI_NEV]
    sc.ev[j, 0] = r
    sc.ev[j, 1] = kind
    sc.evf[j] = t
    sc.gi[GI_NEV] = j + 1


@njit(cache=True, error_model="numpy")
def control(sc: Scaling, t: float) -> None:
    """One control tick at ``t``, on ``sc.out`` (each replica's outstanding requests at
    ``t``); ``promote(sc, t)`` has run. Room for the events: ``room``."""
    par, rs, up, out, gf = sc.par, sc.rs, sc.up, sc.out, sc.gf
    m = rs.shape[0]
    total = 0
    active = 0
    starting = 0
    for r in range(m):
        total += out[r]
        if rs[r] == DRAINING and out[r] == 0:
            rs[r] = OFF
        elif rs[r] == ACTIVE:
            active += 1
        elif rs[r] == STARTING:
            starting += 1
    desired = math.ceil(total / par[A_TARGET])
    desired = max(min(desired, int(par[A_MAX])), int(par[A_MIN]))
    if desired > active + starting:
        need = desired - active - starting
        for r in range(m):
            if need == 0:
                break
            if rs[r] == OFF:
                rs[r] = STARTING
                up[r] = t + par[A_STARTUP]
                gf[GF_NEXT_UP] = min(gf[GF_NEXT_UP], up[r])
                _event(sc, t, r, START)
                need -= 1
                gf[GF_LAST_UP] = t
    elif (
        desired < active
        and t - gf[GF_LAST_UP] >= par[A_COOLDOWN]
        and t - gf[GF_LAST_DOWN] >= par[A_COOLDOWN]
    ):
        for r in range(m - 1, -1, -1):
            if active == desired:
                break
            if rs[r] == ACTIVE:
                rs[r] = DRAINING
                _event(sc, t, r, STOP)
                active -= 1
        gf[GF_LAST_DOWN] = t
        set_mask(rs, sc.mask)


@njit(cache=True, error_model="numpy", inline="always")
def next_routable(sc: Scaling) -> int:
    """Round robin over the routable replicas: the first after the latest one used."""
    rs = sc.rs
    m = rs.shape[0]
    r = sc.gi[GI_RR]
    for _ in range(m):
        r = (r + 1) % m
        if rs[r] == ACTIVE:
            break
    sc.gi[GI_RR] = r
    return int(r)


# --- what both loops' results carry ------------------------------------------------


def replay_end(rqf: npt.NDArray[np.float64]) -> float:
    """End of the replay: the last request's finish (0 without requests)."""
    fin = rqf[:, F_FINISH]
    fin = fin[~np.isnan(fin)]
    return float(max(fin.max(), rqf[:, F_ARRIVAL].max())) if len(fin) else 0.0


def scale_events(
    auto: npt.NDArray[np.float64],
    changes: list[tuple[float, int, int]],
    rq: npt.NDArray[np.int32],
    rqf: npt.NDArray[np.float64],
) -> npt.NDArray[np.void]:
    """Every scale event of a replay (EVENT_DTYPE, by time; events at one time in the
    order they happen: a start before its routable, a routable before its stop, a stop
    before its drain, a drain before a restart).

    ``changes`` are the controller's (time, replica, START or STOP), in order;
    the initial replicas start and are routable at 0; a start's replica is
    routable ``startup_s`` later (if that is before the replay's end); a stopped
    replica is drained when its last request routed before the stop finishes (at
    the stop if it holds none).
    """
    if len(auto) == 0:
        return np.zeros(0, dtype=EVENT_DTYPE)
    end = replay_end(rqf)
    rows: list[tuple[float, int, int]] = []
    for r in range(int(auto[A_INITIAL])):
        rows += [(0.0, r, START), (0.0, r, ROUTABLE)]
    started = dict.fromkeys(range(int(auto[A_INITIAL])), -math.inf)
    replica = rq[:, R_REPLICA]
    arrival = rqf[:, F_ARRIVAL]
    finish = rqf[:, F_FINISH]
    for t, r, kind in changes:
        rows.append((t, r, kind))
        if kind == START:
            started[r] = t
            up = t + float(auto[A_STARTUP])
            if up <= end:
                rows.append((up, r, ROUTABLE))
        else:
            mine = (replica == r) & (arrival >= started[r]) & (arrival < t)
            drained = max(t, float(finish[mine].max())) if mine.any() else t
            rows.append((drained, r, DRAINED))
    out = np.array(rows, dtype=EVENT_DTYPE)
    return out[np.argsort(out["time"], kind="stable")]  # at one time: in causal order


# --- what a replay's scaling came to -------------------------------------------------

_TP_RE = re.compile(r"_tp(\d+)$")


def gpus_per_replica(profile: str) -> int:
    """Tensor-parallel GPUs of a replica, from a profile name ``<model>_<gpu>_tp<N>``
    (1 for any other name)."""
    m = _TP_RE.search(profile or "")
    return int(m[1]) if m else 1


def timeline(events: npt.NDArray[np.void]) -> list[tuple[float, int, int]]:
    """(time, active, starting) after the events at each time where either changed."""
    state: dict[int, int] = {}
    out: list[tuple[float, int, int]] = []
    i = 0
    n = len(events)
    while i < n:
        t = float(events["time"][i])
        while i < n and float(events["time"][i]) == t:
            r, kind = int(events["replica"][i]), int(events["kind"][i])
            state[r] = {START: STARTING, ROUTABLE: ACTIVE, STOP: DRAINING, DRAINED: OFF}[kind]
            i += 1
        states = list(state.values())
        point = (t, states.count(ACTIVE), states.count(STARTING))
        if not out or out[-1][1:] != point[1:]:
            out.append(point)
    return out


def autoscale_summary(res: SimResult, sc: Scenario) -> dict[str, Any]:
    """What a replay's autoscaling came to, from its scale events (no SLO in it).

    Keys: ``replica_hours`` and ``gpu_hours`` (start to drain, or to the replay's
    end), ``gpus_per_replica``, ``gpu_hours_at_max`` (max_replicas the whole
    replay) and ``gpu_hours_saved_share``, ``peak_active``, ``mean_active``
    (time-weighted over [0, end]), ``peak_billed`` and ``mean_billed`` (replicas
    paid for: starting, active or draining), ``starting_replica_hours`` and
    ``draining_replica_hours`` (paid and not routable), ``scale_ups`` and
    ``scale_downs`` (ticks that started or stopped replicas), ``replicas_started``
    and ``replicas_stopped`` (after the initial ones), ``time_at_max_s`` and
    ``time_at_min_s`` (active at max_replicas, at min_replicas), ``end_s`` and
    ``timeline``: (time, active, starting) at each change.

    Raises:
        ValueError: the scenario has no autoscaling.
    """
    auto = sc.autoscale
    if auto is None:
        raise ValueError(f"scenario {sc.name!r} has no autoscale table")
    ev = res.scale_events
    end = replay_end(res.rqf)
    tl = timeline(ev)
    billed: dict[int, float] = {}  # replica -> its latest start (while paid)
    booting: dict[int, float] = {}  # ... of those not routable yet
    since: dict[int, float] = {}  # ... of those draining: their stop
    paid = starting = draining = 0.0
    for t, r, kind in ev.tolist():
        if kind == START:
            billed[r] = booting[r] = t
        elif kind == ROUTABLE:
            starting += t - booting.pop(r)
        elif kind == STOP:
            since[r] = t
        else:
            paid += t - billed.pop(r)
            draining += t - since.pop(r)
    paid += sum(end - t0 for t0 in billed.values())  # running at the end
    starting += sum(end - t0 for t0 in booting.values())
    draining += sum(end - t0 for t0 in since.values())
    ups = {float(t) for t, k in zip(ev["time"], ev["kind"], strict=True) if k == START and t > 0}
    downs = {float(t) for t, k in zip(ev["time"], ev["kind"], strict=True) if k == STOP}
    # piecewise constant between timeline points, up to the end
    spans = [(t, a, s) for t, a, s in tl if t <= end]
    active_s = at_max = at_min = 0.0
    peak_active = max((a for _, a, _ in tl), default=0)
    for (t, a, _), nxt in zip(spans, [*spans[1:], (end, 0, 0)], strict=True):
        dt = nxt[0] - t
        active_s += a * dt
        at_max += dt if a == auto.max_replicas else 0.0
        at_min += dt if a == auto.min_replicas else 0.0
    billed_now = 0
    peak_billed = 0
    for kind in ev["kind"]:
        billed_now += 1 if kind == START else -1 if kind == DRAINED else 0
        peak_billed = max(peak_billed, billed_now)
    gpus = gpus_per_replica(sc.profile)
    at_max_h = auto.max_replicas * end / 3600 * gpus
    return {
        "end_s": end,
        "replica_hours": paid / 3600,
        "gpus_per_replica": gpus,
        "gpu_hours": paid / 3600 * gpus,
        "gpu_hours_at_max": at_max_h,
        "gpu_hours_saved_share": 1 - paid / 3600 * gpus / at_max_h if at_max_h > 0 else 0.0,
        "peak_active": peak_active,
        "mean_active": active_s / end if end > 0 else float(auto.initial_replicas),
        "peak_billed": peak_billed,
        "mean_billed": paid / end if end > 0 else float(auto.initial_replicas),
        "starting_replica_hours": starting / 3600,
        "draining_replica_hours": draining / 3600,
        "scale_ups": len(ups),
        "scale_downs": len(downs),
        "replicas_started": int(np.sum((ev["kind"] == START) & (ev["time"] > 0))),
        "replicas_stopped": int(np.sum(ev["kind"] == STOP)),
        "time_at_max_s": at_max,
        "time_at_min_s": at_min,
        "startup_s": auto.startup_s,
        "timeline": tl,
    }


def scale_up_misses(res: SimResult, slos: Sequence[Slo]) -> dict[str, Any]:
    """The requests that arrived while a replica was starting (between a START after
    time 0 and its ROUTABLE: the fleet was short of what the controller wanted) and, per
    SLO, how many of them were over its limit: what the scale-up delay costs."""
    from pipeline.sim.summary import request_metric

    ev = res.scale_events
    arrival = res.rqf[:, F_ARRIVAL]
    inside = np.zeros(len(arrival), dtype=np.bool_)
    began: dict[int, float] = {}
    for t, r, kind in ev.tolist():
        if kind == START and t > 0:
            began[r] = t
        elif kind == ROUTABLE and r in began:
            inside |= (arrival >= began.pop(r)) & (arrival < t)
    for t0 in began.values():  # still starting at the end
        inside |= arrival >= t0
    done = inside & ~np.isnan(res.rqf[:, F_FINISH])
    over: dict[str, int] = {}
    for slo in slos:
        values = request_metric(res, f"{slo.metric}_s")[done]
        over[slo.key] = int(np.sum(np.nan_to_num(values, nan=0.0) > slo.limit_s))
    return {"num_requests": int(inside.sum()), "completed": int(done.sum()), "over_limit": over}
