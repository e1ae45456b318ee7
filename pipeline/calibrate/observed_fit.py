"""The fit behind ``calibrate observed``: the profile's cost groups and front end that make
replayed latencies match observed ones.

Unknowns (``Params``): a factor on each cost group of ``teacher.GROUPS`` (compute,
memory, per-step, per-sequence; the shape of the step cost, not only its level), the
prefill launch cost (seconds per step that computes prompt tokens) and the three front-end
terms (``frontend.Frontend``). A fit holds the replay's batches fixed (``teacher``): each
request's simulated client TTFT and TPOT are then linear in the unknowns,

    ttft = ttft_rows @ w + rest + request_s + prompt_token_s * prompt_tokens
    tpot = (decode_rows @ w + rest) / (output - 1) + output_token_s

and ``fit_rows`` minimises a robust (soft L1, 10% scale) sum of squared log errors of
both over the requests, with a weak pull of every unknown toward the profile it started
from (so what the data cannot tell stays put). ``calibrate observed`` alternates fits and
replays: a fitted profile forms other batches.

Two kinds of target: per request (``Targets`` of observed TTFT / TPOT per request, from
logs) and per statistic (``QuantileTargets``: observed percentiles of a load stage, from a
benchmark that reports only aggregates), where the residuals are the simulated quantiles'
log errors (with the linear rows, a quantile moves with the request that sits at it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.calibrate.teacher import GROUPS, LAUNCH, NAMES, TeacherRows
from pipeline.sim.cost_model import StepCost
from pipeline.sim.frontend import Frontend

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

SCALED = tuple(n for n in NAMES if n != "launch")  # groups fitted by a factor
# unknown -> (kind, prior width): a factor's width is in log units (0.7: about 2x), an
# absolute term's in its own unit (seconds)
UNKNOWNS: dict[str, tuple[str, float]] = {
    **{f"scale_{g}": ("log", 0.7) for g in SCALED},
    "prefill_fixed_s": ("abs", 2e-3),
    "request_s": ("abs", 5e-3),
    "prompt_token_s": ("abs", 2e-6),
    "output_token_s": ("abs", 2e-4),
}
# the most one fit may move an unknown from the params its rows were taken at: the rows
# hold the batches fixed, which is true only near them (a factor's limit in log units)
TRUST = {
    "log": math.log(2.0),
    "prefill_fixed_s": 2e-3,
    "request_s": 5e-3,
    "prompt_token_s": 2e-6,
    "output_token_s": 2e-4,
}
UNKNOWN_NAMES = tuple(UNKNOWNS)
LOSS_SCALE = 0.10  # per-request log error at which the robust loss turns linear
PULL = 0.02  # weight of the pull toward the start, times sqrt(residuals)
MAX_LOG_SCALE = math.log(50.0)  # a factor beyond 1/50..50 is a fit gone wrong
MAX_FIT_REQUESTS = 20_000  # requests a fit samples (per-request targets): plenty for 8 unknowns


@dataclass(frozen=True)
class Params:
    """Group factors (relative to the profile the rows were taken at), the prefill launch
    cost and the front end."""

    scales: dict[str, float]
    prefill_fixed_s: float
    frontend: Frontend

    @classmethod
    def start(cls, cost: StepCost, frontend: Frontend) -> Params:
        return cls({g: 1.0 for g in SCALED}, cost.prefill_fixed_s, frontend)

    def vector(self) -> F64:
        x = [math.log(self.scales[g]) for g in SCALED]
        fe = self.frontend
        return np.array(
            [*x, self.prefill_fixed_s, fe.request_s, fe.prompt_token_s, fe.output_token_s]
        )

    @classmethod
    def of(cls, x: F64) -> Params:
        k = len(SCALED)
        scales = {g: float(math.exp(v)) for g, v in zip(SCALED, x[:k], strict=True)}
        fe = Frontend(*(max(float(v), 0.0) for v in x[k + 1 :]))
        return cls(scales, max(float(x[k]), 0.0), fe)

    def apply(self, cost: StepCost) -> StepCost:
        """``cost`` with each group's coefficients times its factor and the launch cost set."""
        values = cost.to_dict()
        for g in SCALED:
            for name in GROUPS[g]:
                values[name] *= self.scales[g]
        values["prefill_fixed_s"] = self.prefill_fixed_s
        return StepCost.from_dict(values)

    def compose(self, later: Params) -> Params:
        """These factors followed by ``later``'s (taken at the profile these produced)."""
        scales = {g: self.scales[g] * later.scales[g] for g in SCALED}
        return Params(scales, later.prefill_fixed_s, later.frontend)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scales": dict(self.scales),
            "prefill_fixed_s": self.prefill_fixed_s,
            "frontend": self.frontend.to_dict(),
        }


@dataclass
class Targets:
    """Observed client TTFT and TPOT per request (NaN where the log has none)."""

    ttft_s: F64
    tpot_s: F64
    # per request, how much its TTFT residual counts (1: all); a request that queued
    # behind others counts less, its TTFT being queueing the fixed batches cannot follow
    ttft_weight: F64 | None = None


@dataclass
class QuantileTargets:
    """Observed statistics of groups of requests (e.g. a benchmark's load stages)."""

    masks: list[B]  # per group, which requests it covers
    # per group: (metric, quantile in [0, 1] or -1 for the mean, observed seconds)
    stats: list[list[tuple[str, float, float]]]


@dataclass
class FitOutcome:
    params: Params
    cost: float  # the robust loss at the solution
    residuals: int
    standard_errors: dict[str, float] = field(default_factory=dict)  # per unknown (see fit)
    at_bound: list[str] = field(default_factory=list)  # unknowns the fit pushed to a limit


def predict(rows: TeacherRows, p: Params, base: Params) -> tuple[F64, F64]:
    """Client TTFT and TPOT per request under ``p`` (``base``: the params the rows were
    taken at; the rows' factors are relative to them)."""
    w = np.array([p.scales[g] / base.scales[g] for g in SCALED] + [p.prefill_fixed_s])
    order = [NAMES.index(g) for g in SCALED] + [LAUNCH]
    ttft = rows.ttft[:, order] @ w + rows.ttft_rest
    decode = rows.decode[:, order] @ w + rows.decode_rest
    fe = p.frontend
    ttft = ttft + fe.request_s + fe.prompt_token_s * rows.prompt_tokens
    steps = np.maximum(rows.output_tokens - 1.0, 1.0)
    tpot = decode / steps + fe.output_token_s
    tpot = np.where(rows.output_tokens > 1, tpot, np.nan)
    return ttft, tpot


def _jac_parts(rows: TeacherRows, p: Params, base: Params) -> tuple[F64, F64]:
    """d ttft / d x and d tpot / d x (x = Params.vector()), per request."""
    k = len(SCALED)
    n = len(rows.prompt_tokens)
    jt = np.zeros((n, len(UNKNOWN_NAMES)))
    jd = np.zeros((n, len(UNKNOWN_NAMES)))
    steps = np.maximum(rows.output_tokens - 1.0, 1.0)
    for j, g in enumerate(SCALED):
        col = NAMES.index(g)
        rel = p.scales[g] / base.scales[g]
        jt[:, j] = rows.ttft[:, col] * rel  # d/d log s
        jd[:, j] = rows.decode[:, col] * rel / steps
    jt[:, k] = rows.ttft[:, LAUNCH]
    jd[:, k] = rows.decode[:, LAUNCH] / steps
    jt[:, k + 1] = 1.0
    jt[:, k + 2] = rows.prompt_tokens
    jd[:, k + 3] = 1.0
    return jt, jd


def _bounds(prior: F64, here: F64) -> tuple[F64, F64]:
    """Factors within MAX_LOG_SCALE of the prior, every unknown within TRUST of ``here``."""
    k = len(SCALED)
    lo = np.full(len(prior), 0.0)
    hi = np.full(len(prior), np.inf)
    lo[:k] = prior[:k] - MAX_LOG_SCALE
    hi[:k] = prior[:k] + MAX_LOG_SCALE
    trust = np.array([TRUST["log" if UNKNOWNS[n][0] == "log" else n] for n in UNKNOWN_NAMES])
    lo = np.maximum(lo, here - trust)
    hi = np.minimum(hi, here + trust)
    return lo, np.maximum(hi, lo + 1e-9)


def _pull(x: F64, start: F64, n: int) -> tuple[F64, F64]:
    widths = np.array([w for _, w in UNKNOWNS.values()])
    weight = PULL * math.sqrt(max(n, 1))
    return weight * (x - start) / widths, np.diag(weight / widths)


def fit_rows(
    rows: TeacherRows,
    targets: Targets | QuantileTargets,
    base: Params,
    *,
    start: Params | None = None,
    prior: Params | None = None,
    use: B | None = None,
    seed: int = 0,
) -> FitOutcome:
    """Fit ``Params`` to the targets on these rows (see the module docstring).

    ``base`` are the params the rows were taken at; the fit starts at ``start`` (default
    ``base``) and is pulled toward ``prior`` (default ``start``). ``use`` restricts
    per-request targets to some requests (cross-validation).
    """
    from scipy.optimize import least_squares

    start = start or base
    prior = prior or start
    x0 = start.vector()
    xp = prior.vector()
    if isinstance(targets, Targets):
        resid, jac, n_res = _per_request(rows, targets, base, use, seed)
    else:
        resid, jac, n_res = _per_quantile(rows, targets, base)
    if n_res == 0:
        raise ValueError("no request has both an observed and a simulated latency")

    def fun(x: F64) -> F64:
        r = resid(Params.of(x))
        pr, _ = _pull(x, xp, n_res)
        return np.concatenate([r, pr])

    def jfun(x: F64) -> F64:
        j = jac(Params.of(x))
        _, pj = _pull(x, xp, n_res)
        return np.vstack([j, pj])

    lo, hi = _bounds(xp, base.vector())
    x0 = np.clip(x0, lo + 1e-12, np.where(np.isfinite(hi), hi - 1e-12, np.inf))
    sol = least_squares(
        fun,
        x0,
        jac=jfun,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=LOSS_SCALE,
        method="trf",
        x_scale="jac",
        max_nfev=200,
    )
    x = sol.x
    glo, ghi = xp - MAX_LOG_SCALE, xp + MAX_LOG_SCALE  # the factors' global limits
    at_bound = [
        name
        for name, v, a, b in zip(UNKNOWN_NAMES, x, glo, ghi, strict=True)
        if UNKNOWNS[name][0] == "log" and (v <= a + 1e-6 or v >= b - 1e-6)
    ]
    return FitOutcome(
        params=Params.of(x),
        cost=float(sol.cost),
        residuals=n_res,
        standard_errors=_standard_errors(sol, n_res),
        at_bound=at_bound,
    )


def _per_request(
    rows: TeacherRows, t: Targets, base: Params, use: B | None, seed: int
) -> tuple[Any, Any, int]:
    keep = np.ones(len(rows.prompt_tokens), dtype=bool) if use is None else use.copy()
    ok_t = keep & np.isfinite(t.ttft_s) & (t.ttft_s > 0)
    ok_d = keep & np.isfinite(t.tpot_s) & (t.tpot_s > 0) & (rows.output_tokens > 1)
    both = np.flatnonzero(ok_t | ok_d)
    if len(both) > MAX_FIT_REQUESTS:
        both = np.sort(np.random.default_rng(seed).choice(both, MAX_FIT_REQUESTS, replace=False))
    sub = rows.subset(np.isin(np.arange(len(keep)), both))
    mt, md = ok_t[both], ok_d[both]
    ot, od = t.ttft_s[both], t.tpot_s[both]
    wt = np.ones(len(both)) if t.ttft_weight is None else t.ttft_weight[both]
    wt = wt[mt]

    def resid(p: Params) -> F64:
        pt, pd = predict(sub, p, base)
        rt = wt * np.log(np.maximum(pt[mt], 1e-9) / ot[mt])
        rd = np.log(np.maximum(pd[md], 1e-9) / od[md])
        return np.concatenate([rt, rd])

    def jac(p: Params) -> F64:
        pt, pd = predict(sub, p, base)
        jt, jd = _jac_parts(sub, p, base)
        return np.vstack(
            [
                jt[mt] * (wt / np.maximum(pt[mt], 1e-9))[:, None],
                jd[md] / np.maximum(pd[md], 1e-9)[:, None],
            ]
        )

    return resid, jac, int(mt.sum() + md.sum())


def _quantile_index(values: F64, q: float) -> tuple[float, F64]:
    """The q-quantile (linear interpolation) of values and its weights over them."""
    order = np.argsort(values, kind="stable")
    n = len(values)
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    w = np.zeros(n)
    w[order[lo]] += 1.0 - frac
    w[order[hi]] += frac
    return float(w @ values), w


def _per_quantile(rows: TeacherRows, t: QuantileTargets, base: Params) -> tuple[Any, Any, int]:
    items = [
        (mask, metric, q, obs)
        for mask, stats in zip(t.masks, t.stats, strict=True)
        for metric, q, obs in stats
        if math.isfinite(obs) and obs > 0
    ]

    def values(p: Params) -> tuple[F64, F64]:
        return predict(rows, p, base)

    def resid(p: Params) -> F64:
        pt, pd = values(p)
        out = []
        for mask, metric, q, obs in items:
            v = _metric(pt, pd, rows, metric)[mask]
            v = v[np.isfinite(v)]
            s = float(v.mean()) if q < 0 else _quantile_index(v, q)[0]
            out.append(math.log(max(s, 1e-9) / obs))
        return np.array(out)

    def jac(p: Params) -> F64:
        pt, pd = values(p)
        jt, jd = _jac_parts(rows, p, base)
        out = []
        for mask, metric, q, _obs in items:
            v = _metric(pt, pd, rows, metric)
            jm = _metric_jac(jt, jd, rows, metric)
            sel = mask & np.isfinite(v)
            vv = v[sel]
            if q < 0:
                w = np.full(len(vv), 1.0 / len(vv))
                s = float(vv.mean())
            else:
                s, w = _quantile_index(vv, q)
            out.append((w @ jm[sel]) / max(s, 1e-9))
        return np.array(out)

    return resid, jac, len(items)


def _metric(pt: F64, pd: F64, rows: TeacherRows, metric: str) -> F64:
    if metric == "ttft_s":
        return pt
    if metric == "tpot_s":
        return pd
    assert metric == "e2e_s", metric
    steps = np.maximum(rows.output_tokens - 1.0, 0.0)
    return pt + np.nan_to_num(pd) * steps


def _metric_jac(jt: F64, jd: F64, rows: TeacherRows, metric: str) -> F64:
    if metric == "ttft_s":
        return jt
    if metric == "tpot_s":
        return jd
    steps = np.maximum(rows.output_tokens - 1.0, 0.0)
    return jt + jd * steps[:, None]


NOISE_FLOOR = 0.05  # per-request log error taken at least this large (real logs are noisy)


def _standard_errors(sol: Any, n: int) -> dict[str, float]:
    """Approximate standard error of each unknown from the solver's Jacobian, the pull rows
    included (so an unknown the data say nothing of gets its prior width), with the
    residuals' spread at least ``NOISE_FLOOR``, times its variance inflation by the others
    (how much of what it explains another unknown explains too, from the data rows alone):
    unknowns the data only tell apart in sums come out wide even on noise-free data."""
    j = sol.jac
    dof = max(n - len(UNKNOWN_NAMES), 1)
    resid = sol.fun[:n]
    sigma2 = max(float(np.sum(resid**2) / dof) if n else 1.0, NOISE_FLOOR**2)
    try:
        cov = np.linalg.pinv(j.T @ j) * sigma2
        data = j[:n]
        info = data.T @ data
        inflation = np.diag(np.linalg.pinv(info)) * np.diag(info)
    except np.linalg.LinAlgError:
        return {}
    inflation = np.where(np.isfinite(inflation), np.maximum(inflation, 1.0), 1.0)
    return {
        name: float(math.sqrt(max(cov[i, i], 0.0) * inflation[i]))
        for i, name in enumerate(UNKNOWN_NAMES)
    }


def relative_standard_error(outcome: FitOutcome, name: str) -> float:
    """An unknown's standard error relative to what matters for it: a factor's in log units,
    an absolute term's relative to its prior width."""
    se = outcome.standard_errors.get(name, math.nan)
    kind, width = UNKNOWNS[name]
    return se if kind == "log" else se / width


def with_params(cost: StepCost, fe: Frontend, p: Params) -> tuple[StepCost, Frontend]:
    return p.apply(cost), replace(fe, **p.frontend.to_dict())
