"""Profiles on the calibration side: read the ``--like`` profile, check that measurements
belong to it, and write the calibrated profile with its provenance.

Profile JSON files are read here as plain JSON (shipped name or path), so that
calibrating does not load the simulator.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import __version__
from pipeline.calibrate.fit import FitResult
from pipeline.calibrate.measurements import MeasurementError, Measurements
from pipeline.errors import PipelineError
from pipeline.sim.cost_model import COST_MODEL_VERSION
from pipeline.validation import loads_json

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "sim" / "profiles"
METHOD = "calibrated from measurements"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json") if not p.name.startswith("_"))


def read_profile_json(name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """(the profile's JSON object, its name) for a shipped name or a file path.

    Raises:
        PipelineError: unknown name (the shipped ones are listed) or not a profile.
    """
    text = str(name_or_path)
    path = SHIPPED_DIR / f"{text}.json" if text in shipped_names() else Path(text)
    if not path.is_file():
        raise PipelineError(
            f"unknown profile {text!r}: not a shipped profile nor a file; shipped: "
            + ", ".join(shipped_names())
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"profile {path}: cannot read as text ({exc})") from None
    data = loads_json(text, f"profile {path}", error=PipelineError)
    if not isinstance(data, dict) or not isinstance(data.get("coefficients"), dict):
        raise PipelineError(f"profile {path}: no 'coefficients' object; is it a profile JSON?")
    for key, value in data["coefficients"].items():
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise PipelineError(f"profile {path}: coefficient {key} must be a number >= 0")
    return data, str(data.get("name", path.stem))


def _norm(value: Any) -> str:
    return str(value).strip().lower()


def check_matches(m: Measurements, profile: dict[str, Any], profile_name: str) -> None:
    """Every row's optional model / gpu / tensor_parallel must be the profile's.

    Raises:
        MeasurementError: naming the file, the first row that differs and the column.
    """
    want = {
        "model": (profile.get("model") or {}).get("name"),
        "gpu": (profile.get("gpu") or {}).get("name"),
    }
    for column in ("model", "gpu"):
        values = getattr(m, column)
        if values is None or want[column] is None:
            continue
        for i, v in enumerate(values):
            if v is not None and _norm(v) != _norm(want[column]):
                raise MeasurementError(
                    f"{m.path}: row {i + 1}, column {column}: {v!r} is not the {column} of "
                    f"profile {profile_name} ({want[column]!r}); calibrate with a --like "
                    f"profile of that {column}, or drop the rows of other {column}s"
                )
    tp_want = profile.get("tensor_parallel")
    if m.tensor_parallel is not None and tp_want is not None:
        bad = np.flatnonzero(~np.isnan(m.tensor_parallel) & (m.tensor_parallel != tp_want))
        if len(bad):
            i = int(bad[0])
            raise MeasurementError(
                f"{m.path}: row {i + 1}, column tensor_parallel: {m.tensor_parallel[i]:g} is "
                f"not the tensor-parallel degree of profile {profile_name} ({tp_want}); "
                "calibrate with a --like profile of that degree, or drop those rows"
            )


def derived_profile(
    like: dict[str, Any], name: str, provenance: dict[str, Any], coefficients: dict[str, float]
) -> dict[str, Any]:
    """A profile made from ``like``: its model, GPU, memory and other sections, with new
    coefficients and provenance. The analytic inputs (efficiency) are left out: they no
    longer produce the numbers."""
    out: dict[str, Any] = {"name": name, "cost_model_version": COST_MODEL_VERSION}
    out["provenance"] = provenance
    for key, value in like.items():
        if key not in ("name", "provenance", "cost_model_version", "efficiency", "coefficients"):
            out[key] = value
    out["coefficients"] = dict(coefficients)
    return out


def calibrated_profile(
    like: dict[str, Any],
    like_name: str,
    name: str,
    result: FitResult,
    m: Measurements,
) -> dict[str, Any]:
    """The profile ``calibrate measurements`` writes."""
    provenance = {
        "method": METHOD,
        "source_file": str(m.path),
        "source_sha256": m.sha256,
        "rows_used": result.rows,
        "rows_left_out": list(m.left_out),  # physically impossible rows (measurements.py)
        "rows_per_phase": {p: e.rows for p, e in result.fit_error.items()},
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "tool_version": __version__,
        "like_profile": like_name,
        "fit_error": result.error_dict(),
        "like_error": result.errors()["like"].to_dict(),
    }
    attention = (like.get("provenance") or {}).get("attention")
    if attention is not None:  # how its features count attention (fit_error.py)
        provenance["attention"] = attention
    return derived_profile(like, name, provenance, result.coefficients)


def write_profile(profile: dict[str, Any], path: Path) -> Path:
    """Write a profile JSON whole or not at all (a refused write is one line)."""
    from pipeline.storage import write_atomic, writing

    with writing(path, "give -o another path"):
        return write_atomic(path, json.dumps(profile, indent=2) + "\n")
