"""The fit: its formula is the simulator's, it recovers a known profile, and it predicts
steps it was not fitted on for an engine whose step times do not follow our formula."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pytest

from pipeline.calibrate.features import StepFeatures, step_features
from pipeline.calibrate.fit import (
    COEFFICIENTS,
    as_dict,
    as_vector,
    calibrate,
    jacobian,
    phase_errors,
    phase_loss_scales,
    predict,
    soft_l1,
)
from pipeline.calibrate.synthetic import (
    EXAMPLE_LIKE,
    as_measurements,
    design_grid,
    marginal_costs,
    measure,
    prefill_floor_truth,
    profile_truth_s,
    scaled_table_truth,
    true_coefficients,
)
from pipeline.sim.cost_model import StepCost, step_time


def like_coefficients() -> dict[str, float]:
    return dict(EXAMPLE_LIKE)


def random_features(rng: np.random.Generator, n: int) -> StepFeatures:
    prefill = rng.random(n) < 0.5
    p = np.where(prefill, rng.integers(1, 4096, n), 0).astype(float)
    n_seq = rng.integers(1, 64, n).astype(float)
    d = np.where(prefill & (rng.random(n) < 0.5), 0, n_seq).astype(float)
    return StepFeatures(
        P=p,
        A=p * (p + 1) / 2 + p * rng.integers(0, 2048, n),
        N=n_seq + (p > 0),
        D=d,
        C=d * rng.integers(1, 8192, n),
    )


def random_coefficients(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    c = as_vector(true_coefficients()) * rng.uniform(0.2, 5.0, len(COEFFICIENTS))
    c[COEFFICIENTS.index("overlap")] = rng.uniform(0, 1)
    c[COEFFICIENTS.index("separate_attention")] = rng.uniform(0, 1)
    # 0 in the example: some of each, so that their derivatives are checked too
    c[COEFFICIENTS.index("flop_s_per_seq")] = rng.uniform(1e-6, 1e-4)
    c[COEFFICIENTS.index("prefill_seq_s")] = rng.uniform(1e-4, 1e-2)
    c[COEFFICIENTS.index("prefill_knee_s")] = rng.uniform(1e-6, 1e-4)
    c[COEFFICIENTS.index("prefill_knee_tokens")] = rng.uniform(256, 2048)
    return c


def test_predict_is_the_simulators_step_time_row_by_row() -> None:
    rng = np.random.default_rng(3)
    for _ in range(5):
        c = random_coefficients(rng)
        f = random_features(rng, 400)
        cost = StepCost.from_dict(as_dict(c)).as_array()
        want = [step_time(cost, f.P[i], f.A[i], f.N[i], f.D[i], f.C[i]) for i in range(len(f))]
        assert predict(c, f) == pytest.approx(np.array(want), rel=1e-12, abs=0)
    # an empty step costs nothing, as in the simulator
    zero = StepFeatures(*[np.zeros(1)] * 5)
    assert predict(c, zero)[0] == 0.0


def test_jacobian_matches_finite_differences() -> None:
    rng = np.random.default_rng(4)
    c = random_coefficients(rng)
    f = random_features(rng, 200)
    j = jacobian(c, f)
    for k in range(len(COEFFICIENTS)):
        h = max(abs(c[k]) * 1e-6, 1e-15)
        up, down = c.copy(), c.copy()
        up[k] += h
        down[k] -= h
        numeric = (predict(up, f) - predict(down, f)) / (2 * h)
        assert j[:, k] == pytest.approx(numeric, rel=1e-5, abs=1e-9), COEFFICIENTS[k]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_a_known_profile_from_noisy_measurements_with_outliers(seed: int) -> None:
    """Over 30 noise seeds (bench/calibrate_speed.py prints the figures) the worst
    prediction p90 was 1.8%; with the prefill launch cost free as well, single terms are
    pinned less tightly (a marginal cost up to ~14% off, seq_s ~16%); attention, ~10% of
    the longest prefills, is the least pinned."""
    true = true_coefficients()
    frame = measure(design_grid(5), profile_truth_s(true), noise=0.05, outliers=5, seed=seed)
    m = as_measurements(frame)
    result = calibrate(m, step_features(m), like_coefficients())
    fitted, truth = as_vector(result.coefficients), as_vector(true)
    # predictions over the designed steps: within 2% of the true profile's
    grid = step_features(as_measurements(measure(design_grid(1), profile_truth_s(true))))
    err = np.abs(predict(fitted, grid) / predict(truth, grid) - 1)
    assert np.median(err) <= 0.015 and np.percentile(err, 90) <= 0.02, err
    # the LIKE profile it started from was far off
    start = np.abs(predict(as_vector(like_coefficients()), grid) / predict(truth, grid) - 1)
    assert np.median(start) > 0.2
    # the costs that set step times
    got, want = marginal_costs(fitted), marginal_costs(truth)
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=0.15), name
    # coefficients of their own: the per-sequence cost (seen apart from the per-token
    # cost only in prefills, where it is under 1% of a step) and attention
    assert result.coefficients["seq_s"] == pytest.approx(true["seq_s"], rel=0.2)
    assert result.coefficients["flop_s_per_attn"] == pytest.approx(true["flop_s_per_attn"], rel=0.4)
    # the fit error reported is the noise, not a misfit
    for phase in ("prefill", "decode"):
        assert 0.02 <= result.fit_error[phase].median <= 0.05


def test_terms_the_data_cannot_see_keep_the_like_value() -> None:
    """Prefill-only data read no KV cache: mem_s_per_kv_token keeps the --like value.
    Decode-only data see attention only through the decodes' compute side, which memory
    hides: flop_s_per_attn stays near the --like value."""
    true = true_coefficients()
    like = like_coefficients()
    grid = design_grid(3)
    for phase in ("prefill", "decode"):
        part = grid.filter(pl.col("phase") == phase)
        m = as_measurements(measure(part, profile_truth_s(true), noise=0.02, seed=5))
        result = calibrate(m, step_features(m), like)
        assert result.fit_error[phase].median < 0.03
        if phase == "prefill":
            kv = result.coefficients["mem_s_per_kv_token"]
            assert kv == pytest.approx(like["mem_s_per_kv_token"], rel=1e-6)
        else:
            attn = result.coefficients["flop_s_per_attn"]
            assert attn == pytest.approx(like["flop_s_per_attn"], rel=0.05)


def holdout_split(frame: pl.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Train: batch-1 prefills at every prompt size, decodes at batch 1, 8 and 32."""
    b = frame["batch_size"].to_numpy()
    pre = (frame["phase"] == "prefill").to_numpy()
    train = (pre & (b == 1)) | (~pre & np.isin(b, [1, 8, 32]))
    return np.flatnonzero(train), np.flatnonzero(~train)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "group", [(1.0, 1.0), (1.8, 1.4), (1.0, 0.0)], ids=["h100-tp4", "a100-tp2", "prefill-floor"]
)
def test_holdout_on_an_engine_that_is_not_our_formula(
    group: tuple[float, float], seed: int
) -> None:
    """The second group is the same engine 1.8x slower to prefill and 1.4x slower to
    decode (as an A100 at lower TP is), fitted from the same starting profile. The third
    group adds 40 ms to every prefill step (a 128-token prefill ~2.6x a batch-1 decode):
    only ``prefill_fixed_s`` lets a fit on batch-1 prefills predict batched ones there.
    Over 30 noise seeds per group (bench/calibrate_speed.py), 87 of 90 fits met both
    bounds; the misses, one noise seed in every group: decode p90 of 23% (batch 128 lies
    past the table's knee, which batches up to 32 cannot show)."""
    truth = prefill_floor_truth(0.04) if group[1] == 0.0 else scaled_table_truth(*group)
    frame = measure(design_grid(1), truth, noise=0.05, seed=seed)
    train, test = holdout_split(frame)
    m = as_measurements(frame)
    fit = calibrate(m.subset(train), step_features(m.subset(train)), like_coefficients())
    held = m.subset(test)
    errors = phase_errors(
        predict(as_vector(fit.coefficients), step_features(held)), held.time_s, held.is_prefill
    )
    summary: dict[str, Any] = {p: e.to_dict() for p, e in errors.items()}
    assert set(errors) == {"prefill", "decode"}
    for e in errors.values():
        assert e.rows >= 15
        assert e.median is not None and e.p90 is not None
        assert e.median <= 0.10 and e.p90 <= 0.20, summary


def test_cross_validation_reports_held_out_error_per_phase() -> None:
    frame = measure(design_grid(2), profile_truth_s(true_coefficients()), seed=7)
    m = as_measurements(frame)
    result = calibrate(m, step_features(m), like_coefficients(), cv=4)
    assert result.cv_folds == 4 and result.cv_error is not None
    for phase in ("prefill", "decode"):
        cv, fit = result.cv_error[phase], result.fit_error[phase]
        assert cv.rows == fit.rows
        assert cv.median is not None and fit.median is not None
        # held-out rows are predicted a little worse than the rows fitted, not much
        assert fit.median * 0.9 <= cv.median <= fit.median * 1.5 + 0.005
    with pytest.raises(ValueError, match="--cv must be between 2 and the number of rows"):
        calibrate(m, step_features(m), like_coefficients(), cv=10_000)


def test_the_robust_loss_scale_follows_each_phase_and_floors_at_5_percent() -> None:
    errors = np.array([0.01, -0.01, 0.02, 0.30, -0.30, 0.20, -0.10])
    prefill = np.array([True, True, True, False, False, False, False])
    scale = phase_loss_scales(errors, prefill)
    assert scale[:3].tolist() == [0.05] * 3  # a phase followed within noise: the floor
    assert scale[3:] == pytest.approx([3 * 1.4826 * 0.25] * 4)  # 3 spreads of that phase


def test_soft_l1_with_one_scale_is_scipys_soft_l1() -> None:
    from scipy.optimize import least_squares

    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, 40)
    y = 1.0 + 2.0 * x + rng.normal(0, 0.02, 40)
    y[[3, 17, 30]] += 1.5  # outliers

    def residuals(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return p[0] + p[1] * x - y

    theirs = least_squares(residuals, [0.0, 0.0], loss="soft_l1", f_scale=0.05)
    ours = least_squares(residuals, [0.0, 0.0], loss=soft_l1(np.full(40, 0.05)))
    assert ours.x == pytest.approx(theirs.x, rel=1e-7)
    assert ours.x == pytest.approx([1.0, 2.0], abs=0.02)  # the outliers did not drag it
    # the derivatives it hands the solver, against finite differences in z = f^2
    z, h = rng.uniform(0, 4, 50) ** 2, 1e-7
    loss = soft_l1(rng.uniform(0.01, 0.5, 50))
    assert loss(z)[1] == pytest.approx((loss(z + h)[0] - loss(z - h)[0]) / (2 * h), rel=1e-5)
    assert loss(z)[2] == pytest.approx((loss(z + h)[1] - loss(z - h)[1]) / (2 * h), rel=1e-4)
    # an infinite scale is the plain square
    assert soft_l1(np.full(50, np.inf))(z).tolist() == [z.tolist(), [1.0] * 50, [0.0] * 50]
