"""``tracereplay calibrate measurements`` and ``tracereplay profile check``, as library calls."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.calibrate.fit import FitResult, calibrate
from pipeline.calibrate.fit_error import FitError, features_for, profile_error
from pipeline.calibrate.measurements import Measurements, read_measurements
from pipeline.calibrate.profile import (
    calibrated_profile,
    check_matches,
    read_profile_json,
    write_profile,
)
from pipeline.calibrate.sched_cpu import fit_sched_cpu, with_sched_cpu
from pipeline.sim.cost_model import V4_COEFFICIENTS


@dataclass
class Calibration:
    """What ``calibrate_measurements`` fitted and wrote."""

    result: FitResult
    profile: dict[str, Any]
    like_name: str
    output: Path
    measurements: Measurements


def calibrate_measurements(
    path: Path,
    like: str,
    output: Path,
    *,
    cv: int | None = None,
    sync_path: Path | None = None,
    sched_cpu: dict[str, float] | None = None,
) -> Calibration:
    """Fit the ``like`` profile's coefficients to the step times in ``path``; write ``output``.

    The scheduler's CPU time (``calibrate/sched_cpu.py``): with ``sync_path``, a
    synchronous run of the same steps, it is fitted from the two (``path`` is then the
    asynchronous run); ``sched_cpu`` gives it (``sched_cpu_s``, ``sched_cpu_per_seq_s``);
    otherwise the ``like`` profile's is kept.

    Raises:
        MeasurementError: a bad file, or rows of another model, GPU or TP degree.
        PipelineError: an unknown --like profile.
        ValueError: a bad number of folds.
    """
    like_json, like_name = read_profile_json(like)
    m = read_measurements(path)
    check_matches(m, like_json, like_name)
    result = calibrate(m, features_for(like_json, m), like_json["coefficients"], cv=cv)
    profile = calibrated_profile(like_json, like_name, Path(output).stem, result, m)
    given = {k: like_json["coefficients"].get(k, 0.0) for k in V4_COEFFICIENTS}
    if sync_path is not None:
        sync = read_measurements(sync_path)
        check_matches(sync, like_json, like_name)
        fit = fit_sched_cpu(sync, m)
        given = fit.coefficients()
        profile["provenance"]["sched_cpu"] = {
            "method": "synchronous minus asynchronous step times",
            "sync_file": str(sync.path),
            "sync_sha256": sync.sha256,
            "shapes": fit.shapes,
            "batch_sizes": fit.batch_sizes,
        }
    given |= sched_cpu or {}
    profile = with_sched_cpu(profile, given)
    write_profile(profile, Path(output))
    return Calibration(result, profile, like_name, Path(output), m)


@dataclass
class ProfileCheck:
    """Predicted against measured step times, per row and per phase."""

    profile_name: str
    measurements: Measurements
    predicted_s: npt.NDArray[np.float64]
    error: FitError  # over every row of the file (fit_error.py)

    @property
    def errors(self) -> dict[str, Any]:
        return self.error.phases

    def rows(self) -> list[dict[str, Any]]:
        m = self.measurements
        err = self.predicted_s / m.time_s - 1.0
        return [
            {
                "row": i + 1,
                "phase": phase,
                "batch_size": int(m.batch_size[i]),
                "prompt_tokens": int(m.prompt_tokens[i]),
                "context_tokens": int(m.context_tokens[i]),
                "measured_ms": float(m.time_s[i] * 1000.0),
                "predicted_ms": float(self.predicted_s[i] * 1000.0),
                "error": float(err[i]),
            }
            for i, phase in enumerate(m.phase)
        ]


def check_profile(profile: str, path: Path) -> ProfileCheck:
    """How far ``profile``'s step times are from the measured ones in ``path``: the same
    figure over the same rows as ``calibrate measurements`` and ``calibrate live`` print."""
    data, name = read_profile_json(profile)
    m = read_measurements(path)
    check_matches(m, data, name)
    error, pred = profile_error(data, m)
    return ProfileCheck(name, m, pred, error)
