"""The error of a step-cost profile on measured steps: one figure, one definition.

``calibrate measurements``, ``calibrate live`` and ``profile check`` all report it, and
all compute it here:

    per phase (prefill rows, decode rows; calibrate live's mixed steps as a third set),
    the median and the 90th percentile (numpy's linear interpolation) of
    |predicted / measured - 1|, where predicted is the profile's step time for the row's
    shape (``fit.predict``) and measured the row's ``time_ms``.

Which rows, and how predicted (``FitError.which``):

    all measured       every row the measurements file holds, each predicted by the profile
                       (rows left out as physically impossible are not: the commands warn)
    held out, K-fold   the same rows, each predicted by a fit on the other K - 1 folds
                       (``calibrate measurements --cv K``)
    mixed steps        ``calibrate live``'s mixed probes (``<stem>.mixed.csv``)

The shape of a row becomes the cost model's features the way the profile counts
attention: a profile whose ``provenance.attention`` is ``PACKED`` (``calibrate live``'s,
for the simulator's ``transformers`` policy) counts (query, key) pairs over the packed
batch (``features.packed_features``); any other, the causal pairs of each sequence
(``features.step_features``). A profile fitted from a ``PACKED`` one stays ``PACKED``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.calibrate.features import StepFeatures, packed_features, step_features
from pipeline.calibrate.measurements import Measurements

F64 = npt.NDArray[np.float64]

PACKED = "packed (policy transformers)"
ALL_MEASURED = "all measured"
MIXED = "mixed steps"
PHASES = ("prefill", "decode")


def held_out(folds: int) -> str:
    """``which`` of a K-fold cross-validated error."""
    return f"held out, {folds}-fold"


@dataclass(frozen=True)
class PhaseError:
    """|predicted / measured - 1| over one phase's rows: how many, the median and the p90."""

    rows: int
    median: float | None
    p90: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "median": self.median, "p90": self.p90}


def phase_errors(
    pred_s: F64, measured_s: F64, is_prefill: npt.NDArray[np.bool_]
) -> dict[str, PhaseError]:
    """The module's figure per phase (prefill, decode; only the phases present)."""
    err = np.abs(pred_s / measured_s - 1.0)
    out = {}
    for phase, mask in (("prefill", is_prefill), ("decode", ~is_prefill)):
        e = err[mask]
        if len(e):
            out[phase] = PhaseError(len(e), float(np.median(e)), float(np.percentile(e, 90)))
    return out


@dataclass(frozen=True)
class FitError:
    """The figure per phase over named rows (``which``, see the module docstring)."""

    phases: dict[str, PhaseError]
    which: str

    @property
    def rows(self) -> int:
        return sum(e.rows for e in self.phases.values())

    def to_dict(self) -> dict[str, Any]:
        return {"which": self.which, **{p: e.to_dict() for p, e in self.phases.items()}}


def is_packed(profile: Mapping[str, Any]) -> bool:
    """Whether the profile counts attention over the packed batch (module docstring)."""
    return (profile.get("provenance") or {}).get("attention") == PACKED


def features_for(profile: Mapping[str, Any], m: Measurements) -> StepFeatures:
    """The features of ``m``'s rows as ``profile`` counts them (module docstring)."""
    return packed_features(m) if is_packed(profile) else step_features(m)


def profile_error(
    profile: Mapping[str, Any], m: Measurements, which: str = ALL_MEASURED
) -> tuple[FitError, F64]:
    """(the figure of ``profile`` on every row of ``m``, the predicted seconds per row)."""
    from pipeline.calibrate.fit import as_vector, predict

    pred = predict(as_vector(profile["coefficients"]), features_for(profile, m))
    return FitError(phase_errors(pred, m.time_s, m.is_prefill), which), pred


def describe(errors: Mapping[str, FitError], source: str) -> str:
    """One line naming the rows behind each labelled figure, e.g.

    ``|predicted / measured - 1| over 130 rows of bench.csv: fit, like: all measured;
    3-fold cv: held out, 3-fold``
    """
    by_which: dict[str, list[str]] = {}
    for label, e in errors.items():
        by_which.setdefault(e.which, []).append(label)
    rows = max((e.rows for e in errors.values()), default=0)
    parts = "; ".join(f"{', '.join(labels)}: {which}" for which, labels in by_which.items())
    return f"|predicted / measured - 1| over {rows:,} rows of {source} ({parts})"
