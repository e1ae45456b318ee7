"""How far a profile's step times may be off: the profile term of every interval.

A step-cost profile predicts step times; its calibration leaves residuals. A
profile JSON may say how large they were::

    "uncertainty": {"step_time_log_sd": 0.06, "source": "calibrate measurements, 412 rows"}

``step_time_log_sd`` is the standard deviation of log(predicted / measured) step
time its calibration left (the calibration commands write it). Intervals treat
it as an error of the whole profile: the engine's true step time is the
predicted one times exp(z * sd), z standard normal, the same z for every step
(conservative: per-step noise would partly average out over a request's many
steps; a profile fitted to other shapes than the user's is off in one
direction). A replay with a profile draw scales every step's cost by that
factor (``scaled_cost``).

Where the profile states none, the sd is unknown and ``DEFAULT_STEP_TIME_LOG_SD``
stands in for it (the analytic profiles, an explicit ``[cost]`` table); every
output then says that the profile term is a default. The scenario key
``cost_uncertainty`` overrides both.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import StepCost
from pipeline.validation import loads_json

# The step-time error of an analytic profile, sd on a log scale: against the real vLLM
# runs of docs/fidelity.md the median |log error| of E2E p50 and p99 is 0.054 on H100 (a
# normal sd of 0.08; root mean square 0.13) and 0.29 on GPUs without fitted factors. The
# one place to change it.
DEFAULT_STEP_TIME_LOG_SD = 0.10

KEY = "uncertainty"  # the profile JSON's key
SD_KEY = "step_time_log_sd"


@dataclass(frozen=True)
class CostUncertainty:
    """The sd of log step time a scenario's intervals assume, and where it came from."""

    log_sd: float  # >= 0; 0 leaves the profile out of the intervals
    source: str  # what said so, for the output
    is_default: bool = False  # nothing said so: DEFAULT_STEP_TIME_LOG_SD stands in

    def describe(self) -> str:
        """``step-time sd 0.10 (default: ...)`` for summaries and notes."""
        kind = "default: " if self.is_default else ""
        return f"step-time sd {self.log_sd:.3g} ({kind}{self.source})"


DEFAULT = CostUncertainty(
    DEFAULT_STEP_TIME_LOG_SD, "the profile states no calibration error", is_default=True
)


def _sd(value: Any, where: str) -> float:
    """A valid sd of log step time, or a one-line error naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where} must be a number >= 0 (sd of log step time), got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ScenarioError(f"{where} must be a finite number >= 0 (sd of log step time), got {v}")
    return v


def from_profile_data(data: Any, path: str) -> CostUncertainty:
    """The uncertainty a profile's JSON (already parsed) states, else the default.

    Raises:
        ScenarioError: a malformed ``uncertainty`` value, naming the file and key.
    """
    if not isinstance(data, dict) or KEY not in data:
        return DEFAULT
    block = data[KEY]
    if not isinstance(block, dict):
        raise ScenarioError(
            f"profile {path}: {KEY} must be an object "
            f'{{"{SD_KEY}": <number >= 0>, "source": "<text>"}}, got {block!r}'
        )
    if SD_KEY not in block:
        raise ScenarioError(f"profile {path}: {KEY}.{SD_KEY} is missing")
    sd = _sd(block[SD_KEY], f"profile {path}: {KEY}.{SD_KEY}")
    source = block.get("source", "calibration")
    if not isinstance(source, str):
        raise ScenarioError(f"profile {path}: {KEY}.source must be text, got {source!r}")
    return CostUncertainty(sd, f"profile: {source}" if source else "profile")


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> CostUncertainty:
    try:
        data = loads_json(Path(path).read_text(), path, error=ScenarioError)
    except (OSError, ValueError, ScenarioError):
        return DEFAULT  # the profile loader has already said what is wrong with the file
    return from_profile_data(data, path)


def profile_path(name: str) -> Path | None:
    """The JSON file of a profile given as a shipped name or a path (None: not found)."""
    from pipeline.sim import profiles

    path = profiles.PROFILE_DIR / f"{name}.json"
    if name in profiles.list_profiles():
        return path
    return Path(name) if Path(name).is_file() else None


def resolve(
    given: float | None, profile: str | None, *, custom: bool, where: str
) -> CostUncertainty:
    """The uncertainty of a scenario: its ``cost_uncertainty`` key, else its profile's.

    Args:
        given: the scenario's ``cost_uncertainty`` (None: not given).
        profile: the profile as the scenario names it (a shipped name or a path; None:
            the default profile).
        custom: the scenario has an explicit ``[cost]`` table, no profile.
        where: the scenario's source, for errors.

    Raises:
        ScenarioError: a bad ``cost_uncertainty``, or a malformed ``uncertainty`` in the
            profile JSON (naming the file and key).
    """
    if given is not None:
        return CostUncertainty(
            _sd(given, f"{where}: cost_uncertainty"), "scenario key cost_uncertainty"
        )
    if custom:
        return dataclasses.replace(DEFAULT, source="an explicit [cost] table states none")
    from pipeline.sim import profiles

    path = profile_path(profile or profiles.DEFAULT_PROFILE)
    if path is None:
        return DEFAULT
    return _read(str(path), path.stat().st_mtime_ns)


def _in_seconds(name: str) -> bool:
    """Whether a StepCost coefficient is a time (its name carries the unit ``s``:
    ``fixed_s``, ``flop_s_per_token``), not a token count or a share."""
    return "s" in name.split("_")


def scaled_cost(cost: StepCost, factor: float) -> StepCost:
    """``cost`` with every step taking ``factor`` times as long.

    The step time is a sum of maxima of terms each linear in one time coefficient,
    so scaling every time coefficient scales it exactly; the token count at half
    GEMM efficiency and the overlap share are not times and stay.
    """
    changes = {
        f.name: getattr(cost, f.name) * factor
        for f in dataclasses.fields(cost)
        if _in_seconds(f.name)
    }
    return dataclasses.replace(cost, **changes)


def cost_factors(sd: float, z: float) -> tuple[float, float]:
    """The step-cost factors at the low and high end of the profile term: exp(-+ z sd)."""
    return math.exp(-z * sd), math.exp(z * sd)
