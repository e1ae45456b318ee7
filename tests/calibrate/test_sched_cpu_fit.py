"""The scheduler's CPU time fitted from a synchronous and an asynchronous run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.calibrate.measured import calibrate_measurements
from pipeline.calibrate.measurements import read_measurements
from pipeline.calibrate.sched_cpu import fit_sched_cpu
from pipeline.sim.profiles import DEFAULT_PROFILE, load_profile

CPU, PER_SEQ = 1.2e-3, 1.5e-5


def _write(path: Path, sync: bool, batches: tuple[int, ...] = (1, 8, 32, 64, 128)) -> Path:
    """Decode and prefill steps of the default profile; the synchronous ones pay the CPU."""
    cost = load_profile(DEFAULT_PROFILE).cost
    lines = ["phase,batch_size,prompt_tokens,context_tokens,time_ms"]
    for b in batches:
        for ctx in (200, 1000):
            t = cost.decode_step_s(b, ctx) + (CPU + PER_SEQ * b if sync else 0.0)
            lines.append(f"decode,{b},0,{ctx},{t * 1e3!r}")
        t = cost.prefill_step_s(b, 256) + (CPU + PER_SEQ * b if sync else 0.0)
        lines.append(f"prefill,{b},256,0,{t * 1e3!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_difference_of_the_two_runs_gives_both_terms(tmp_path: Path) -> None:
    sync = read_measurements(_write(tmp_path / "sync.csv", True))
    overlapped = read_measurements(_write(tmp_path / "async.csv", False))
    fit = fit_sched_cpu(sync, overlapped)
    assert fit.sched_cpu_s == pytest.approx(CPU, rel=1e-6)
    assert fit.sched_cpu_per_seq_s == pytest.approx(PER_SEQ, rel=1e-6)
    assert (fit.shapes, fit.batch_sizes) == (15, 5)


def test_one_batch_size_pins_only_the_fixed_part(tmp_path: Path) -> None:
    sync = read_measurements(_write(tmp_path / "sync.csv", True, (16,)))
    overlapped = read_measurements(_write(tmp_path / "async.csv", False, (16,)))
    fit = fit_sched_cpu(sync, overlapped)
    assert fit.sched_cpu_per_seq_s == 0.0
    assert fit.sched_cpu_s == pytest.approx(CPU + 16 * PER_SEQ, rel=1e-6)


def test_runs_of_different_steps_are_refused(tmp_path: Path) -> None:
    sync = read_measurements(_write(tmp_path / "sync.csv", True, (1,)))
    overlapped = read_measurements(_write(tmp_path / "async.csv", False, (2,)))
    with pytest.raises(ValueError, match="no step .* in common"):
        fit_sched_cpu(sync, overlapped)


def test_the_calibrated_profile_carries_them_fitted_given_or_kept(tmp_path: Path) -> None:
    sync, overlapped = _write(tmp_path / "s.csv", True), _write(tmp_path / "a.csv", False)
    cal = calibrate_measurements(overlapped, DEFAULT_PROFILE, tmp_path / "fit.json", sync_path=sync)
    written = json.loads((tmp_path / "fit.json").read_text())
    assert written["coefficients"]["sched_cpu_s"] == pytest.approx(CPU, rel=1e-6)
    assert written["provenance"]["sched_cpu"]["shapes"] == 15
    assert load_profile(tmp_path / "fit.json").cost.sched_cpu_per_seq_s == pytest.approx(PER_SEQ)
    assert cal.profile == written
    calibrate_measurements(
        overlapped, DEFAULT_PROFILE, tmp_path / "given.json", sched_cpu={"sched_cpu_s": 2e-3}
    )
    given = load_profile(tmp_path / "given.json").cost
    assert (given.sched_cpu_s, given.sched_cpu_per_seq_s) == (2e-3, 0.0)  # the like's: 0


def test_the_command_line_fits_them_with_sync_and_refuses_a_negative_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipeline.cli import cli

    sync, overlapped = _write(tmp_path / "s.csv", True), _write(tmp_path / "a.csv", False)
    out = tmp_path / "cli.json"
    args = ["calibrate", "measurements", str(overlapped), "--like", DEFAULT_PROFILE, "-o", str(out)]
    r = CliRunner().invoke(cli, [*args, "--sync", str(sync)])
    assert r.exit_code == 0, r.output
    assert load_profile(out).cost.sched_cpu_s == pytest.approx(CPU, rel=1e-6)
    r = CliRunner().invoke(cli, [*args, "--sched-cpu-s", "-1"])
    assert r.exit_code != 0 and "--sched-cpu-s" in r.output
