"""``tracereplay calibrate measurements`` and ``tracereplay profile check`` end to end."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline import __version__
from pipeline.calibrate.synthetic import design_grid, measure, profile_truth_s
from pipeline.cli import cli
from pipeline.sim.cost_model import COST_MODEL_VERSION
from pipeline.sim.profiles import PROFILE_DIR, load_profile

LIKE = "llama-3-70b_h100-80gb_tp4"

# Round coefficients, so that every predicted time below is worked out by hand.
HAND = {
    "fixed_s": 0.001,
    "comm_s_fixed": 0.0,
    "seq_s": 0.0001,
    "flop_s_per_token": 1e-5,
    "flop_tokens_half": 100.0,
    "flop_s_per_attn": 1e-9,
    "mem_s_weights": 0.005,
    "mem_s_per_kv_token": 1e-8,
    "mem_s_per_token": 1e-6,
    "comm_s_per_token": 0.0,
    "overlap": 0.5,
}
# row: (phase, batch, prompt, context, measured ms, predicted ms by hand)
#   1: T 1000, A 500500, N 1: compute 0.011 + 0.0005005, memory 0.005 + 0.001
#      0.001 + 0.0001 + 0.0115005 + 0.5 * 0.006
#   2: T 1000, A 2 * (500 * 500 + 500 * 501 / 2) = 750500, N 2: compute 0.0117505
#      0.001 + 0.0002 + 0.0117505 + 0.5 * 0.006
#   3: T 10, C 10000, N 10: compute 0.0011 + 0.00001, memory 0.005 + 0.0001 + 0.00001
#      0.001 + 0.001 + 0.00511 + 0.5 * 0.00111
#   4: T 1, C 100, N 1: compute 0.00101 + 1e-7, memory 0.005 + 1e-6 + 1e-6
#      0.001 + 0.0001 + 0.005002 + 0.5 * 0.0010101
ROWS = [
    ("prefill", 1, 1000, 0, 13.0, 15.6005),
    ("prefill", 2, 500, 500, 16.0, 15.9505),
    ("decode", 10, 100, 1000, 7.0, 7.665),
    ("decode", 1, 50, 100, 6.0, 6.60705),
]


def run(*args: str) -> Any:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture
def hand_profile(tmp_path: Path) -> Path:
    data = json.loads((PROFILE_DIR / f"{LIKE}.json").read_text())
    data["coefficients"] = HAND
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(data))
    return path


def test_profile_check_numbers_by_hand(tmp_path: Path, hand_profile: Path) -> None:
    csv = tmp_path / "bench.csv"
    csv.write_text(
        "phase,batch_size,prompt_tokens,context_tokens,time_ms\n"
        + "\n".join(",".join(str(v) for v in row[:5]) for row in ROWS)
        + "\n"
    )
    out = json.loads(run("profile", "check", str(hand_profile), str(csv), "--json").output)
    assert [r["row"] for r in out["rows"]] == [1, 2, 3, 4]
    for got, (phase, b, p, c, measured, predicted) in zip(out["rows"], ROWS, strict=True):
        assert (got["phase"], got["batch_size"], got["prompt_tokens"]) == (phase, b, p)
        assert got["context_tokens"] == c and got["measured_ms"] == measured
        assert got["predicted_ms"] == pytest.approx(predicted, rel=1e-12)
        assert got["error"] == pytest.approx(predicted / measured - 1, rel=1e-12)
    # |errors| prefill: 0.2000385, 0.0030938; decode: 0.095, 0.1011750
    # linear percentiles over two values: median the mean, p90 = lo + 0.9 (hi - lo)
    pre = sorted(abs(r[5] / r[4] - 1) for r in ROWS[:2])
    errors = out["errors"]
    assert errors["prefill"]["rows"] == 2 and errors["decode"]["rows"] == 2
    assert errors["prefill"]["median"] == pytest.approx(sum(pre) / 2, rel=1e-12)
    assert errors["prefill"]["p90"] == pytest.approx(pre[0] + 0.9 * (pre[1] - pre[0]))
    assert errors["decode"]["median"] == pytest.approx(0.0980875, rel=1e-9)
    assert errors["decode"]["p90"] == pytest.approx(0.095 + 0.9 * 0.006175, rel=1e-9)
    text = run("profile", "check", str(hand_profile), str(csv)).output
    assert re.search(r"\n1\s+prefill\s+1\s+1000\s+0\s+13\.000\s+15\.60\d\s+\+20\.0%", text)
    assert re.search(r"prefill\s+2\s+10\.2%\s+18\.0%", text)
    assert re.search(r"decode\s+2\s+9\.8%\s+10\.1%", text)


def test_calibrate_writes_a_loadable_profile_with_provenance(tmp_path: Path) -> None:
    like = json.loads((PROFILE_DIR / f"{LIKE}.json").read_text())
    true = dict(like["coefficients"])
    true.update(fixed_s=true["fixed_s"] * 2.5, seq_s=3e-4, flop_tokens_half=120.0)
    csv = tmp_path / "bench.csv"
    frame = measure(design_grid(2), profile_truth_s(true), outliers=2, seed=3)
    frame.with_columns(model=frame["phase"].str.replace(r".*", "llama-3-70b")).write_csv(csv)
    out = tmp_path / "mine.json"
    text = run("calibrate", "measurements", str(csv), "--like", LIKE, "-o", str(out), "--cv", "3")
    assert f"calibrated {LIKE} on {frame.height:,} rows of {csv}" in text.output
    assert re.search(r"prefill\s+\d+\s+[\d.]+%\s+[\d.]+%\s+[\d.]+%", text.output)
    assert "3-fold cv median" in text.output and text.output.endswith(f"wrote {out}\n")

    profile = json.loads(out.read_text())
    assert profile["name"] == "mine" and profile["cost_model_version"] == COST_MODEL_VERSION
    for section in ("model", "gpu", "memory", "tensor_parallel"):
        assert profile[section] == like[section]
    assert "efficiency" not in profile
    prov = profile["provenance"]
    assert prov["method"] == "calibrated from measurements"
    assert prov["source_file"] == str(csv)
    assert prov["source_sha256"] == hashlib.sha256(csv.read_bytes()).hexdigest()
    assert prov["rows_used"] == frame.height and prov["like_profile"] == LIKE
    assert prov["tool_version"] == __version__ and re.fullmatch(r"\d{4}-\d\d-\d\d", prov["date"])
    assert prov["fit_error"]["cross_validated"]["folds"] == 3
    # the fit error it records is what profile check measures with the written profile
    check = json.loads(run("profile", "check", str(out), str(csv), "--json").output)
    for phase in ("prefill", "decode"):
        assert prov["fit_error"][phase]["median"] == pytest.approx(
            check["errors"][phase]["median"], rel=1e-9
        )
        assert prov["fit_error"][phase]["median"] < 0.05
        assert check["errors"][phase]["median"] < prov["like_error"][phase]["median"]
    # and the simulator loads it
    loaded = load_profile(out)
    assert loaded.cost.seq_s == pytest.approx(profile["coefficients"]["seq_s"])
    assert loaded.kv_bytes_per_token == like["memory"]["kv_bytes_per_token"]


def test_quiet_and_json(tmp_path: Path) -> None:
    csv = tmp_path / "bench.csv"
    like = json.loads((PROFILE_DIR / f"{LIKE}.json").read_text())
    measure(design_grid(1), profile_truth_s(like["coefficients"]), seed=1).write_csv(csv)
    out = tmp_path / "q.json"
    quiet = run("calibrate", "measurements", str(csv), "--like", LIKE, "-o", str(out), "-q")
    assert quiet.output == f"wrote {out}\n"
    js = json.loads(
        run("calibrate", "measurements", str(csv), "--like", LIKE, "-o", str(out), "--json").output
    )
    assert js["output"] == str(out) and js["profile"] == json.loads(out.read_text())
