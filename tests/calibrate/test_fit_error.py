"""One error figure per profile: ``calibrate live``'s fit, ``calibrate measurements`` and
``profile check`` give the same numbers for one profile on one file, and name the rows.

The probe rows here are made up (a profile's packed-attention step times with noise), so
that the fit of ``calibrate live`` (``fit_probes``) runs without an engine;
tests/live/test_validate.py does the same through the real ``calibrate live`` command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.calibrate.features import mixed_features, packed_features
from pipeline.calibrate.fit import as_vector, predict
from pipeline.calibrate.fit_error import ALL_MEASURED, PACKED, features_for, profile_error
from pipeline.calibrate.live import fit_probes
from pipeline.calibrate.measurements import read_measurements
from pipeline.calibrate.profile import calibrated_profile, write_profile
from pipeline.calibrate.synthetic import EXAMPLE_LIKE
from pipeline.cli import cli
from pipeline.sim.profiles import PROFILE_DIR

LIKE = "llama-3-70b_h100-80gb_tp4"


def run(*args: str) -> Any:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r


def probe_files(tmp_path: Path) -> tuple[dict[str, Any], Path, pl.DataFrame]:
    """(a packed start profile, the pure probe rows as a measurements CSV, mixed rows)."""
    like = json.loads((PROFILE_DIR / f"{LIKE}.json").read_text())
    like["coefficients"] = dict(EXAMPLE_LIKE)
    like["provenance"] = {"attention": PACKED}
    shapes = [("prefill", b, p, 0) for p in (64, 256, 1024) for b in (1, 2, 4)]
    shapes += [("decode", b, c, c) for c in (128, 1024) for b in (1, 4, 16, 32)]
    frame = pl.DataFrame(
        shapes, schema=["phase", "batch_size", "prompt_tokens", "context_tokens"], orient="row"
    )
    rng = np.random.default_rng(7)
    csv = tmp_path / "probe.measurements.csv"
    frame.with_columns(time_ms=pl.lit(1.0)).write_csv(csv)
    truth = predict(as_vector(like["coefficients"]), packed_features(read_measurements(csv)))
    # 10% noise and a 1.5x engine: errors well away from 0, different per row
    frame.with_columns(time_ms=1500.0 * truth * rng.lognormal(0.0, 0.1, len(truth))).write_csv(csv)
    mixed = pl.DataFrame(
        {"prompt_tokens": [32, 128, 32, 128], "decode_batch": [1, 1, 4, 4]},
    ).with_columns(decode_kv_tokens=pl.col("decode_batch") * 256)
    tm = predict(as_vector(like["coefficients"]), mixed_features(mixed)) * 2500.0
    return like, csv, mixed.with_columns(time_ms=pl.Series(tm))


def figures(errors: dict[str, Any]) -> list[float]:
    """rows, median, p90 of prefill, then of decode."""
    return [errors[p][k] for p in ("prefill", "decode") for k in ("rows", "median", "p90")]


def test_live_fit_measurements_and_check_give_one_figure(tmp_path: Path) -> None:
    like, csv, mixed = probe_files(tmp_path)
    m = read_measurements(csv)
    # calibrate live's fit and the profile it writes
    result, mixed_error = fit_probes(m, mixed, like)
    profile = calibrated_profile(like, "start", "probe", result, m)
    fitted = tmp_path / "probe.json"
    write_profile(profile, fitted)
    assert profile["provenance"]["attention"] == PACKED
    live = result.errors()["fit"]
    assert live.which == ALL_MEASURED and live.rows == m.time_s.size == 17
    assert mixed_error is not None and mixed_error.phases["mixed"].rows == 4

    # profile check: the written profile on the written measurements file
    check = json.loads(run("profile", "check", str(fitted), str(csv), "--json").output)
    assert check["errors"]["which"] == ALL_MEASURED
    assert figures(check["errors"]) == pytest.approx(figures(live.to_dict()), rel=1e-12)
    assert figures(profile["provenance"]["fit_error"]) == figures(check["errors"])

    # calibrate measurements with that profile as --like: its like error, the same rows
    out = tmp_path / "again.json"
    again = run(
        "calibrate", "measurements", str(csv), "--like", str(fitted), "-o", str(out), "--json"
    )
    prov = json.loads(again.output)["profile"]["provenance"]
    assert prov["like_error"]["which"] == ALL_MEASURED
    assert figures(prov["like_error"]) == pytest.approx(figures(check["errors"]), rel=1e-12)
    assert prov["attention"] == PACKED  # fitted from a packed profile, counted so

    # the text of both commands: the same percentages, and which rows
    text_check = run("profile", "check", str(fitted), str(csv)).output
    text_cal = run("calibrate", "measurements", str(csv), "--like", str(fitted), "-o", str(out))
    n = f"over {m.time_s.size} rows of {csv}"
    assert f"{n} (profile: all measured):" in text_check
    assert f"{n} (like, fit: all measured):" in text_cal.output
    for phase in ("prefill", "decode"):
        e = check["errors"][phase]
        cells = rf"{phase}\s+{e['rows']}\s+{e['median']:.1%}\s+{e['p90']:.1%}"
        assert re.search(cells, text_check) and re.search(cells, text_cal.output)


def test_the_attention_count_is_what_made_the_figures_differ(tmp_path: Path) -> None:
    """The same coefficients on the same rows counted with the causal pairs per sequence
    (what profile check did with calibrate live's profile) give another figure."""
    like, csv, _ = probe_files(tmp_path)
    m = read_measurements(csv)
    packed, _ = profile_error(like, m)
    causal, _ = profile_error({**like, "provenance": {}}, m)
    assert features_for(like, m).A.sum() != features_for({}, m).A.sum()
    assert packed.phases["prefill"].median != pytest.approx(causal.phases["prefill"].median)


def test_cross_validated_rows_are_named(tmp_path: Path) -> None:
    like, csv, _ = probe_files(tmp_path)
    out = tmp_path / "cv.json"
    text = run(
        "calibrate", "measurements", str(csv), "--like", LIKE, "-o", str(out), "--cv", "3"
    ).output
    assert "(like, fit: all measured; 3-fold cv: held out, 3-fold):" in text
    prov = json.loads(out.read_text())["provenance"]
    assert prov["fit_error"]["which"] == ALL_MEASURED
    assert prov["fit_error"]["cross_validated"]["which"] == "held out, 3-fold"
    assert "attention" not in prov  # a datasheet --like profile counts causal pairs
