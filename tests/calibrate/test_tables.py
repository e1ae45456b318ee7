"""The fit on published step-time tables (tests/fixtures/step_tables/, README there):
fitted on an interpolating split of each group, it predicts the held-out rows within 10%
median and 20% p90 per GPU, tensor-parallel degree and phase."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.calibrate.features import step_features
from pipeline.calibrate.holdout import (
    HoldOut,
    baseline_predict,
    groups,
    holdout,
    interpolating_split,
)
from pipeline.calibrate.measurements import Measurements, read_measurements
from pipeline.calibrate.synthetic import as_measurements
from pipeline.sim.profiles import build_profile

SPLITWISE = Path(__file__).resolve().parents[1] / "fixtures/step_tables/splitwise_llama2_70b.csv"
GROUPS = [(gpu, tp) for gpu in ("a100-80gb", "h100-80gb") for tp in (2, 4, 8)]


@pytest.fixture(scope="module")
def table() -> Measurements:
    return read_measurements(SPLITWISE)


@pytest.fixture(scope="module")
def results(table: Measurements) -> dict[tuple[str, int], HoldOut]:
    out = {}
    for g in groups(table):
        assert g.model is not None and g.gpu is not None and g.tensor_parallel is not None
        like = build_profile(g.model, g.gpu, g.tensor_parallel)["coefficients"]
        out[(g.gpu, g.tensor_parallel)] = holdout(table, g, like)
    return out


def test_the_table_has_its_six_groups_and_the_split_interpolates(table: Measurements) -> None:
    found = {(g.gpu, g.tensor_parallel): g for g in groups(table)}
    assert sorted(found) == sorted(GROUPS)
    for (gpu, tp), g in found.items():
        assert g.model == "llama-2-70b"
        assert len(g.rows) == (24 if tp == 2 else 26)  # batch 64 at TP 2 left out
        train, test = interpolating_split(table, g.rows)
        assert len(train) == 11 and len(np.intersect1d(train, test)) == 0
        assert sorted(np.concatenate([train, test])) == sorted(g.rows)
        for rows, fitted in ((train, True), (test, False)):
            for i in rows:
                b, p = table.batch_size[i], table.prompt_tokens[i]
                largest = table.batch_size[g.rows][table.is_prefill[g.rows] == table.is_prefill[i]]
                want = (b == 1 and p in (128, 512, 2048, 8192)) or b == largest.max()
                if not table.is_prefill[i]:
                    want = want or b == 8
                assert want == fitted, (gpu, tp, i)
        # every held-out row lies inside the fitted range of its phase
        for phase in (True, False):
            tr = train[table.is_prefill[train] == phase]
            te = test[table.is_prefill[test] == phase]
            for col in (table.batch_size, table.prompt_tokens, table.context_tokens):
                assert col[tr].min() <= col[te].min() and col[te].max() <= col[tr].max()


CELLS = [
    pytest.param(gpu, tp, phase, id=f"{gpu}-tp{tp}-{phase}")
    for gpu, tp in GROUPS
    for phase in ("prefill", "decode")
]


@pytest.mark.parametrize(("gpu", "tp", "phase"), CELLS)
def test_held_out_rows_are_predicted_within_10_median_20_p90(
    results: dict[tuple[str, int], HoldOut], gpu: str, tp: int, phase: str
) -> None:
    r = results[(gpu, tp)]
    e = r.fit[phase]
    assert e.rows >= 6
    assert e.median is not None and e.p90 is not None
    assert e.median <= 0.10 and e.p90 <= 0.20, {p: x.to_dict() for p, x in r.fit.items()}


@pytest.mark.parametrize(("gpu", "tp"), GROUPS)
def test_the_fit_beats_the_like_profile_everywhere(
    results: dict[tuple[str, int], HoldOut], gpu: str, tp: int
) -> None:
    r = results[(gpu, tp)]
    for phase in ("prefill", "decode"):
        fit, like = r.fit[phase], r.like[phase]
        assert fit.median is not None and like.median is not None
        assert fit.median < like.median


def test_baseline_recovers_curves_of_its_own_form() -> None:
    import polars as pl

    rows = [("prefill", b, p, 0) for b in (1, 2, 4) for p in (128, 1024, 4096)]
    rows += [("decode", b, 512, c) for b in (1, 8, 32) for c in (256, 4096)]
    frame = pl.DataFrame(
        rows, schema=["phase", "batch_size", "prompt_tokens", "context_tokens"], orient="row"
    )
    m = as_measurements(frame)
    f = step_features(m)
    truth = np.where(
        m.is_prefill,
        0.02 + 1e-4 * f.P + 3e-9 * f.A + 4e-3 * f.N,
        0.03 + 2e-4 * f.D + 5e-8 * f.C + 1e-6 * f.D**2,
    )
    m = as_measurements(frame.with_columns(pl.Series("time_ms", truth * 1e3)))
    assert baseline_predict(m, m) == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize(("gpu", "tp"), [("a100-80gb", 4), ("a100-80gb", 8), ("h100-80gb", 8)])
def test_the_groups_that_need_the_prefill_terms_get_them(
    table: Measurements, gpu: str, tp: int
) -> None:
    """These groups' batched prompts cost more per sequence, and their prompts more per token
    past 2,048 in a step, than the analytic terms say: the fit finds prefill_seq_s and
    prefill_knee_s there (they are 0 in the analytic profiles)."""
    from pipeline.calibrate.fit import COEFFICIENTS, fit_coefficients

    g = next(x for x in groups(table) if (x.gpu, x.tensor_parallel) == (gpu, tp))
    assert g.model is not None
    like = build_profile(g.model, gpu, tp)["coefficients"]
    assert like["prefill_seq_s"] == 0.0 and like["prefill_knee_s"] == 0.0
    train, _ = interpolating_split(table, g.rows)
    sub = table.subset(train)
    c, _ = fit_coefficients(step_features(sub), sub.time_s, like)
    got = dict(zip(COEFFICIENTS, c, strict=True))
    assert got["prefill_knee_s"] > 1e-6  # s per token past the knee
    assert got["prefill_knee_tokens"] == like["prefill_knee_tokens"] == 2048.0
