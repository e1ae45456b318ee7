"""Night-over-night drift: which of tonight's figures moved more than allowed.

A night's figures are a flat mapping of names to numbers (or None when not
measurable), grouped by the part before the first dot:

- ``traffic.*``: requests per day, mean prompt and output tokens;
- ``ttft_p99.<scenario>``, ``tpot_p99.<scenario>``: simulated, seconds;
- ``capacity.<scenario>.<search>``: the capacity answer (cap, req/s, replicas);
- ``sim_vs_observed.<metric>.<scenario>``: simulated p99 over the p99 seen in
  the logs (1.0: the model matches production), where the logs carry latency.

A figure drifts when it is known on both nights and changed by more than its
group's threshold, relative to last night's value; one known on only one of
the two nights is reported as appeared or gone (not a drift).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from pipeline.validation import finite_float

GROUPS = ("traffic", "ttft_p99", "tpot_p99", "capacity", "sim_vs_observed")
MAX_THRESHOLD = 1e6  # a relative change; larger never flags anything anyway
DEFAULT_THRESHOLDS = {
    "traffic": 0.25,
    "ttft_p99": 0.20,
    "tpot_p99": 0.20,
    "capacity": 0.20,
    "sim_vs_observed": 0.25,
}


@dataclass(frozen=True)
class Change:
    name: str
    previous: float | None
    current: float | None
    threshold: float
    relative: float | None  # (current - previous) / |previous|

    @property
    def drift(self) -> bool:
        return self.relative is not None and abs(self.relative) > self.threshold

    def describe(self) -> str:
        if self.previous is None or self.current is None:
            state = "appeared" if self.previous is None else "gone"
            return f"{self.name}: {state} ({_num(self.previous)} -> {_num(self.current)})"
        rel = f"{self.relative:+.1%}" if self.relative is not None else "n/a"
        return (
            f"{self.name}: {_num(self.previous)} -> {_num(self.current)} ({rel}; "
            f"threshold {self.threshold:.0%})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "previous": self.previous,
            "current": self.current,
            "relative": self.relative,
            "threshold": self.threshold,
            "drift": self.drift,
        }


def _num(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


def thresholds(table: dict[str, Any], where: str = "[drift]") -> dict[str, float]:
    """Thresholds from a TOML table (relative changes, e.g. 0.25), over the defaults.

    Raises:
        ConfigError: an unknown group or a threshold that is not a number >= 0.
    """
    out = dict(DEFAULT_THRESHOLDS)
    for key, value in table.items():
        if key not in GROUPS:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(GROUPS)}")
        out[key] = finite_float(
            value, f"{key} (a relative change, 0.25 = 25%)", where, lo=0.0, hi=MAX_THRESHOLD
        )
    return out


def compare(
    previous: dict[str, float | None], current: dict[str, float | None], limits: dict[str, float]
) -> list[Change]:
    """Every figure of either night, compared (sorted by name)."""
    changes = []
    for name in sorted(set(previous) | set(current)):
        prev, cur = previous.get(name), current.get(name)
        if prev is None and cur is None:
            continue
        rel = None
        if prev is not None and cur is not None:
            if prev != 0:
                rel = (cur - prev) / abs(prev)
            elif cur != 0:
                rel = float("inf")
            else:
                rel = 0.0
        group = name.split(".", 1)[0]
        changes.append(Change(name, prev, cur, limits.get(group, 0.0), rel))
    return changes
