"""Fit the cost-model coefficients to measured step times.

The step time (cost model v3, docs/cost_model.md), with T = P + D and
s = separate_attention:

    compute = flop_s_per_token * (T + flop_tokens_half) + flop_s_per_seq * N
              + (1 - s) * flop_s_per_attn * (A + C)
    memory  = mem_s_weights + (1 - s) * mem_s_per_kv_token * C + mem_s_per_token * T
    step    = fixed_s + comm_s_fixed + seq_s * N
              + (prefill_fixed_s + prefill_seq_s * (N - D)) * [P > 0]
              + prefill_knee_s * max(0, P - prefill_knee_tokens)
              + max(compute, memory) + overlap * min(compute, memory)
              + comm_s_per_token * T
              + s * (flop_s_per_attn * A + max(flop_s_per_attn, mem_s_per_kv_token) * C)
                                                                          (0 when T = 0)

``predict`` evaluates it for a whole array of steps at once (tests check that it equals
the simulator's ``cost_model.step_time`` row by row); ``jacobian`` gives its exact
derivatives.

How the fit works:

* The unknowns are non-negative multipliers x_k on the ``--like`` profile's physically
  derived coefficients (coefficient_k = x_k * like_k), so the fit starts from the
  model and GPU and moves each term by a factor. ``overlap`` is fitted as it is, in
  [0, 1]. A term the profile has at 0 is fitted on a scale of its own (``PRIOR_SCALE``)
  if the model can use it (``seq_s``, ``flop_tokens_half``, ``overlap``,
  ``prefill_fixed_s``), else it stays 0 (the all-reduce terms of a TP 1 profile: there
  is no all-reduce).
* It minimises the relative error pred / measured - 1 of every row under a robust loss
  (soft L1: a row that is off by far more than the loss scale counts linearly, so a few
  outliers do not drag the fit), with scipy's bounded trust-region least squares. The
  scale is set per phase (rows with prompt tokens, and the others) from a plain
  least-squares fit first: ``SCALE_SPREADS`` times that phase's typical error (1.4826 x
  the median |error|, the normal-equivalent spread), and at least ``LOSS_SCALE`` (5%).
  With a few wild rows among good ones the typical error is the noise, so the wild rows
  still count linearly; where the cost model cannot follow a phase within 5% (a measured
  table not of its shape, each step measured once), all of that phase's rows keep
  counting, instead of the fit following some and treating the rest, often the one row
  of a kind, as outliers. The pull below counts squared.
* Terms the data cannot tell apart (fixed_s and comm_s_fixed are both per step; the
  weights' memory time hides behind compute in prefill-only data) are held at the
  ``--like`` value by a weak pull of every x_k toward its start (1 for a term the
  profile has, 0 for a v2 term it lacks). The pull is REGULARISATION * sqrt(rows) per
  term, so it matters only where the data are silent.
* Gross outliers are then left out and the fit repeated: when some row is more than
  ``OUTLIER_FACTOR`` (3x) from that fit, a screening fit of log(predicted / measured)
  (where a row 50x long and one 50x short weigh alike) finds the rows more than 3x
  from it, in either direction, and more than ``OUTLIER_SPREADS`` robust spreads of
  their phase's log ratios from the phase's median, at most ``OUTLIER_SHARE`` (10%)
  of a phase's rows, the worst first; the fit above is then made without them. A single 50x garbage
  collection pause or a 0.02x clock jump among a hundred rows drags even the robust
  loss (its scale comes from a least-squares fit the wild row already pulled; a step
  measured 50x too short has a relative error of 49); a row a factor of 3 from a fit
  that follows every other row within noise is no measurement of that step. Rows the
  cost model merely fits less well (a batched prefill 30% off) are never left out.
* The start is the ``--like`` profile with every time coefficient scaled by the median
  of measured / predicted; a second start with overlap 0.5 and at least the prior token
  floor guards against the kink of the max. From both, plain least squares (which
  converges fast and sure); from the better of the two, the robust fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.calibrate.features import StepFeatures
from pipeline.calibrate.fit_error import (
    ALL_MEASURED,
    FitError,
    PhaseError,
    held_out,
    phase_errors,
)
from pipeline.calibrate.measurements import Measurements

F64 = npt.NDArray[np.float64]

COEFFICIENTS = (
    "fixed_s",
    "comm_s_fixed",
    "seq_s",
    "flop_s_per_token",
    "flop_tokens_half",
    "flop_s_per_attn",
    "mem_s_weights",
    "mem_s_per_kv_token",
    "mem_s_per_token",
    "comm_s_per_token",
    "overlap",
    "prefill_fixed_s",
    "flop_s_per_seq",
    "separate_attention",
    "prefill_seq_s",
    "prefill_knee_tokens",
    "prefill_knee_s",
)
(
    I_FIXED,
    I_COMM_FIXED,
    I_SEQ,
    I_FLOP,
    I_HALF,
    I_ATTN,
    I_MEM_W,
    I_MEM_KV,
    I_MEM_TOK,
    I_COMM_TOK,
    I_OVERLAP,
    I_PREFILL_STEP,
    I_FLOP_SEQ,
    I_SEP,
    I_PREFILL_SEQ,
    I_KNEE_TOKENS,
    I_KNEE_S,
) = range(len(COEFFICIENTS))

# Scale of a v2 term that the --like profile has at 0 (a v1 profile): its fitted value is
# x * scale and the pull is toward 0.
PRIOR_SCALE = {
    "seq_s": 1e-4,
    "flop_tokens_half": 64.0,
    "overlap": 1.0,
    "prefill_fixed_s": 1e-3,
    "prefill_seq_s": 1e-3,
    "prefill_knee_s": 1e-5,
}
# Coefficients that are not times (they are not scaled by the starting time ratio).
NOT_TIMES = ("flop_tokens_half", "overlap", "separate_attention", "prefill_knee_tokens")
# Coefficients the fit never moves: the structure of the model.
FIXED = ("separate_attention", "prefill_knee_tokens")
REGULARISATION = 0.0001
LOSS = "soft_l1"
LOSS_SCALE = 0.05  # smallest relative error at which the robust loss turns linear
SCALE_SPREADS = 3.0  # the loss scale of a phase, in spreads of its least-squares errors


def as_vector(coefficients: Mapping[str, float]) -> F64:
    """The coefficients in ``COEFFICIENTS`` order (missing v2 and v3 terms are 0, as in a v1
    or v2 file)."""
    return np.array([float(coefficients.get(n, 0.0)) for n in COEFFICIENTS])


def as_dict(vector: F64) -> dict[str, float]:
    return {n: float(v) for n, v in zip(COEFFICIENTS, vector, strict=True)}


def _parts(c: F64, f: StepFeatures) -> tuple[F64, F64, F64]:
    t = f.P + f.D
    shared = 1.0 - c[I_SEP]
    compute = c[I_FLOP] * (t + c[I_HALF]) + c[I_FLOP_SEQ] * f.N + shared * c[I_ATTN] * (f.A + f.C)
    memory = c[I_MEM_W] + shared * c[I_MEM_KV] * f.C + c[I_MEM_TOK] * t
    return t, compute, memory


def predict(c: F64, f: StepFeatures) -> F64:
    """Seconds of every step (vectorised v3 ``step_time``)."""
    t, compute, memory = _parts(c, f)
    out = (
        c[I_FIXED]
        + c[I_COMM_FIXED]
        + c[I_SEQ] * f.N
        + np.maximum(compute, memory)
        + c[I_OVERLAP] * np.minimum(compute, memory)
        + c[I_COMM_TOK] * t
        + (c[I_PREFILL_STEP] + c[I_PREFILL_SEQ] * (f.N - f.D)) * (f.P > 0)
        + c[I_KNEE_S] * np.maximum(f.P - c[I_KNEE_TOKENS], 0.0) * (f.P > 0)
        + c[I_SEP] * (c[I_ATTN] * f.A + max(c[I_ATTN], c[I_MEM_KV]) * f.C)
    )
    return np.where(t > 0, out, 0.0)


def jacobian(c: F64, f: StepFeatures) -> F64:
    """d predict / d coefficient, one row per step, one column per ``COEFFICIENTS`` entry.

    At a tie of compute and memory the compute side is taken as the larger.
    """
    t, compute, memory = _parts(c, f)
    lead = compute >= memory
    w_compute = np.where(lead, 1.0, c[I_OVERLAP])
    w_memory = np.where(lead, c[I_OVERLAP], 1.0)
    sep = c[I_SEP]
    shared = 1.0 - sep
    kv_leads = c[I_MEM_KV] > c[I_ATTN]  # which per-token cost the separate decode attention takes
    j = np.empty((len(t), len(COEFFICIENTS)))
    j[:, I_FIXED] = 1.0
    j[:, I_COMM_FIXED] = 1.0
    j[:, I_SEQ] = f.N
    j[:, I_FLOP] = (t + c[I_HALF]) * w_compute
    j[:, I_HALF] = c[I_FLOP] * w_compute
    j[:, I_ATTN] = shared * (f.A + f.C) * w_compute + sep * (f.A + (0.0 if kv_leads else f.C))
    j[:, I_MEM_W] = w_memory
    j[:, I_MEM_KV] = shared * f.C * w_memory + sep * (f.C if kv_leads else 0.0)
    j[:, I_MEM_TOK] = t * w_memory
    j[:, I_COMM_TOK] = t
    j[:, I_OVERLAP] = np.minimum(compute, memory)
    j[:, I_PREFILL_STEP] = f.P > 0
    j[:, I_PREFILL_SEQ] = (f.N - f.D) * (f.P > 0)
    past = np.maximum(f.P - c[I_KNEE_TOKENS], 0.0) * (f.P > 0)
    j[:, I_KNEE_S] = past
    j[:, I_KNEE_TOKENS] = -c[I_KNEE_S] * (past > 0)
    j[:, I_FLOP_SEQ] = f.N * w_compute
    j[:, I_SEP] = (
        c[I_ATTN] * f.A
        + max(c[I_ATTN], c[I_MEM_KV]) * f.C
        - np.where(lead, c[I_ATTN] * (f.A + f.C), c[I_MEM_KV] * f.C)
        - c[I_OVERLAP] * np.where(lead, c[I_MEM_KV] * f.C, c[I_ATTN] * (f.A + f.C))
    )
    j[t <= 0] = 0.0
    return j


@dataclass
class FitResult:
    """Fitted coefficients and how well they reproduce the measurements."""

    coefficients: dict[str, float]
    start: dict[str, float]  # the --like profile's coefficients
    fitted: tuple[str, ...]  # coefficients the fit could move (others kept)
    fit_error: dict[str, PhaseError]
    like_error: dict[str, PhaseError]  # the --like profile on the same rows
    cv_error: dict[str, PhaseError] | None = None
    cv_folds: int | None = None
    rows: int = 0
    iterations: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def errors(self) -> dict[str, FitError]:
        """The figures with the rows behind them (fit_error.py): like, fit[, K-fold cv]."""
        out = {"like": FitError(self.like_error, ALL_MEASURED)}
        out["fit"] = FitError(self.fit_error, ALL_MEASURED)
        if self.cv_error is not None and self.cv_folds is not None:
            out[f"{self.cv_folds}-fold cv"] = FitError(self.cv_error, held_out(self.cv_folds))
        return out

    def error_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = FitError(self.fit_error, ALL_MEASURED).to_dict()
        if self.cv_error is not None and self.cv_folds is not None:
            out["cross_validated"] = {
                "folds": self.cv_folds,
                **FitError(self.cv_error, held_out(self.cv_folds)).to_dict(),
            }
        return out


def _setup(like: F64) -> tuple[F64, F64, npt.NDArray[np.bool_]]:
    """(scale, target x, free mask) of every coefficient."""
    scale = like.copy()
    free = like > 0
    for name in FIXED:
        free[COEFFICIENTS.index(name)] = False
    for name, prior in PRIOR_SCALE.items():
        k = COEFFICIENTS.index(name)
        free[k] = True
        if like[k] <= 0:
            scale[k] = prior
    scale[I_OVERLAP] = 1.0
    scale = np.where(scale > 0, scale, 1.0)
    target = np.where(free, like / scale, 0.0)
    return scale, target, free


def _identifiable(f: StepFeatures, like: F64) -> npt.NDArray[np.bool_]:
    """Terms the rows can tell from the others: the per-prefill-sequence cost needs prefill
    steps of more than one batch size (else it is the per-step launch cost again), the knee
    prompt steps past it."""
    ok = np.ones(len(COEFFICIENTS), dtype=bool)
    pre = f.P > 0
    seqs = (f.N - f.D)[pre]
    ok[I_PREFILL_SEQ] = len(seqs) > 0 and float(np.ptp(seqs)) > 0
    ok[I_KNEE_S] = bool(np.any(f.P > like[I_KNEE_TOKENS]))
    return ok


OUTLIER_FACTOR = 3.0  # a row this far from the fit (either way) may be a gross outlier
OUTLIER_SPREADS = 6.0  # ... if also this many robust spreads from its phase's median
OUTLIER_SHARE = 0.1  # at most this share of a phase's rows is left out


def gross_outliers(
    predicted_s: F64, measured_s: F64, is_prefill: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Rows too far from the fit to be a measurement of that step (module docstring)."""
    log_ratio = np.log(np.maximum(predicted_s, 1e-300) / measured_s)
    out = np.zeros(len(measured_s), dtype=bool)
    for mask in (is_prefill, ~is_prefill):
        rows = np.flatnonzero(mask)
        if len(rows) < 5:
            continue
        lr = log_ratio[rows]
        centre = float(np.median(lr))
        spread = 1.4826 * float(np.median(np.abs(lr - centre)))
        dev = np.abs(lr - centre)
        far = (np.abs(lr) > np.log(OUTLIER_FACTOR)) & (dev > OUTLIER_SPREADS * spread)
        worst = rows[far][np.argsort(-dev[far])][: int(OUTLIER_SHARE * len(rows))]
        out[worst] = True
    return out


def fit_coefficients(
    features: StepFeatures,
    measured_s: F64,
    like: Mapping[str, float],
    *,
    regularisation: float | None = None,
) -> tuple[F64, int]:
    """The fitted coefficient vector and the solver's iterations (see the module docstring),
    gross outliers left out."""
    coeffs, nfev = _fit_rows(features, measured_s, like, regularisation)
    far = np.abs(np.log(np.maximum(predict(coeffs, features), 1e-300) / measured_s))
    if not (far > np.log(OUTLIER_FACTOR)).any():
        return coeffs, nfev  # no row 3x off: nothing to screen (clean data cost nothing more)
    # screen on log(predicted / measured), where a row 50x long and one 50x short weigh
    # alike and a single one cannot move the rest far; then fit the kept rows as usual
    screen, more = _fit_rows(features, measured_s, like, regularisation, log=True)
    nfev += more
    bad = gross_outliers(predict(screen, features), measured_s, features.P > 0)
    if not bad.any():
        return coeffs, nfev
    keep = np.flatnonzero(~bad)
    coeffs, more = _fit_rows(_take(features, keep), measured_s[keep], like, regularisation)
    return coeffs, nfev + more


def _fit_rows(
    features: StepFeatures,
    measured_s: F64,
    like: Mapping[str, float],
    regularisation: float | None,
    *,
    log: bool = False,
) -> tuple[F64, int]:
    """One fit over every given row: plain least squares, then the robust loss; of the
    relative error, or with ``log`` of log(predicted / measured)."""
    from scipy.optimize import least_squares

    like_v = as_vector(like)
    scale, target, free = _setup(like_v)
    free &= _identifiable(features, like_v)
    idx = np.flatnonzero(free)
    n = len(measured_s)
    w = (REGULARISATION if regularisation is None else regularisation) * np.sqrt(max(n, 1))
    inv = 1.0 / measured_s

    def full(x: F64) -> F64:
        v = like_v.copy()
        v[idx] = x * scale[idx]
        return v

    log_measured = np.log(measured_s)

    def residuals(x: F64) -> F64:
        pred = predict(full(x), features)
        r = np.log(np.maximum(pred, 1e-300)) - log_measured if log else pred * inv - 1.0
        return np.concatenate([r, w * (x - target[idx])])

    def jac(x: F64) -> F64:
        per = 1.0 / np.maximum(predict(full(x), features), 1e-300) if log else inv
        j = jacobian(full(x), features)[:, idx] * scale[idx] * per[:, None]
        return np.vstack([j, w * np.eye(len(idx))])

    lower = np.zeros(len(idx))
    upper = np.where(idx == I_OVERLAP, 1.0, np.inf)
    ratio = float(np.median(measured_s / np.maximum(predict(like_v, features), 1e-12)))
    ratio = ratio if np.isfinite(ratio) and ratio > 0 else 1.0
    times = np.array([COEFFICIENTS[k] not in NOT_TIMES for k in idx])
    start = np.where(times, target[idx] * ratio, target[idx])
    second = start.copy()  # half the overlap, at least the prior token floor
    for name, value in (("overlap", 0.5), ("flop_tokens_half", 1.0)):
        at = np.flatnonzero(idx == COEFFICIENTS.index(name))
        second[at] = value if name == "overlap" else np.maximum(second[at], value)

    def solve(x0: F64, loss: Any) -> Any:
        x0 = np.clip(x0, lower + 1e-9, np.where(np.isfinite(upper), upper - 1e-9, np.inf))
        return least_squares(
            residuals,
            x0,
            jac=jac,
            bounds=(lower, upper),
            loss=loss,
            method="trf",
            x_scale="jac",
            ftol=1e-10,
            xtol=1e-10,
            gtol=1e-10,
            max_nfev=500,
        )

    best = min((solve(x0, "linear") for x0 in (start, second)), key=lambda r: r.cost)
    nfev = int(best.nfev)
    if LOSS != "linear":
        row_scale = phase_loss_scales(best.fun[:n], features.P > 0)
        best = solve(best.x, soft_l1(np.concatenate([row_scale, np.full(len(idx), np.inf)])))
        nfev += int(best.nfev)
    return full(best.x), nfev


def phase_loss_scales(errors: F64, is_prefill: npt.NDArray[np.bool_]) -> F64:
    """The robust loss scale of every row: per phase, ``SCALE_SPREADS`` x 1.4826 x the
    median |error| of that phase's rows, at least ``LOSS_SCALE``."""
    out = np.full(len(errors), LOSS_SCALE)
    for mask in (is_prefill, ~is_prefill):
        if mask.any():
            spread = 1.4826 * float(np.median(np.abs(errors[mask])))
            out[mask] = max(LOSS_SCALE, SCALE_SPREADS * spread)
    return out


def soft_l1(scale: F64) -> Any:
    """scipy's soft-L1 loss with a scale per residual (inf: that residual counts squared).

    For a residual f with scale c: rho = 2 c^2 (sqrt(1 + f^2 / c^2) - 1), quadratic for
    |f| << c and linear for |f| >> c; the loss callable receives z = f^2.
    """
    c2 = scale**2
    linear = ~np.isfinite(c2)
    c2 = np.where(linear, 1.0, c2)

    def loss(z: F64) -> F64:
        u = np.sqrt(1.0 + z / c2)
        rho = np.empty((3, len(z)))
        rho[0] = np.where(linear, z, 2.0 * c2 * (u - 1.0))
        rho[1] = np.where(linear, 1.0, 1.0 / u)
        rho[2] = np.where(linear, 0.0, -0.5 / (c2 * u**3))
        return rho

    return loss


def kfold(n: int, k: int, seed: int = 0) -> list[npt.NDArray[np.int64]]:
    """k disjoint folds covering 0..n-1, shuffled with ``seed``."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(part) for part in np.array_split(order, k)]


def calibrate(
    measurements: Measurements,
    features: StepFeatures,
    like: Mapping[str, float],
    *,
    cv: int | None = None,
) -> FitResult:
    """Fit on every row; with ``cv`` = K also the K-fold cross-validated error.

    Raises:
        ValueError: cv < 2 or more folds than rows.
    """
    measured = measurements.time_s
    pre = measurements.is_prefill
    coeffs, nfev = fit_coefficients(features, measured, like)
    like_v = as_vector(like)
    _, _, free = _setup(like_v)
    free &= _identifiable(features, like_v)
    result = FitResult(
        coefficients=as_dict(coeffs),
        start=as_dict(like_v),
        fitted=tuple(n for n, f in zip(COEFFICIENTS, free, strict=True) if f),
        fit_error=phase_errors(predict(coeffs, features), measured, pre),
        like_error=phase_errors(predict(like_v, features), measured, pre),
        rows=len(measured),
        iterations=nfev,
    )
    if cv is not None:
        if cv < 2 or cv > len(measured):
            raise ValueError(f"--cv must be between 2 and the number of rows ({len(measured)})")
        held = np.empty(len(measured))
        for fold in kfold(len(measured), cv):
            train = np.setdiff1d(np.arange(len(measured)), fold)
            c, _ = fit_coefficients(_take(features, train), measured[train], like)
            held[fold] = predict(c, _take(features, fold))
        result.cv_error = phase_errors(held, measured, pre)
        result.cv_folds = cv
    return result


def _take(f: StepFeatures, idx: npt.NDArray[np.int64]) -> StepFeatures:
    return StepFeatures(P=f.P[idx], A=f.A[idx], N=f.N[idx], D=f.D[idx], C=f.C[idx])
