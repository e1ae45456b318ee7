"""Night-over-night drift: which of tonight's figures moved more than allowed.

A night's figures are a flat mapping of names to numbers (or None when not
measurable), grouped by the part before the first dot:

- ``traffic.*``: requests per day, mean prompt and output tokens;
- ``ttft_p99.<scenario>``, ``tpot_p99.<scenario>``: simulated, seconds;
- ``capacity.<scenario>.<search>``: the capacity answer (cap, req/s, replicas);
- ``sim_vs_observed.<metric>.<scenario>``: simulated p99 over the p99 seen in
  the logs (1.0: the model matches production), where the logs carry latency;
- ``slo.<scenario>.<slo key>``: each SLO's statistic, seconds, scoped ones over
  their requests (``slo.prod.ttft_p99@tenant=chat``). Its relative change flags
  nothing unless ``[drift] slo`` sets a threshold: what matters is the headroom;
  in a fleet each pool's too, over its own requests
  (``slo.<scenario>.pool=<pool>.<slo key>``).

Headroom: each SLO's limit minus its value, in seconds and as a share of the limit,
with its change since last night (``Headroom``). With ``[drift] slo_headroom_pct``
set, an SLO whose headroom falls below that percentage of its limit (a missed SLO
has a negative headroom) is a drift too. A scoped SLO's headroom shows a class
closing in on its limit even when the whole traffic's p99 barely moves; a fleet's
pool's headroom shows one pool (the long-prompt replicas, say) closing in on it while
the fleet's p99, held up by the other pools, stays put.

A figure drifts when it is known on both nights and changed by more than its
group's threshold, relative to last night's value; one known on only one of
the two nights is reported as appeared or gone (not a drift).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from pipeline.validation import finite_float

GROUPS = ("traffic", "ttft_p99", "tpot_p99", "capacity", "sim_vs_observed", "slo")
MAX_THRESHOLD = 1e6  # a relative change; larger never flags anything anyway
DEFAULT_THRESHOLDS = {
    "traffic": 0.25,
    "ttft_p99": 0.20,
    "tpot_p99": 0.20,
    "capacity": 0.20,
    "sim_vs_observed": 0.25,
    "slo": MAX_THRESHOLD,  # off: the headroom margin judges SLO values
}
HEADROOM_KEY = "slo_headroom_pct"  # [drift] key: the least headroom, % of each SLO's limit


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
        if key == HEADROOM_KEY:
            continue  # headroom_margin reads it
        if key not in GROUPS:
            raise ConfigError(
                f"{where}: unknown key {key!r}; allowed: {', '.join((*GROUPS, HEADROOM_KEY))}"
            )
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


def headroom_margin(table: dict[str, Any], where: str = "[drift]") -> float | None:
    """``slo_headroom_pct`` of a [drift] table: the least headroom an SLO may keep, in
    percent of its limit (None: not set, no SLO's headroom flags anything).

    Raises:
        ConfigError: not a number in [0, 100).
    """
    if HEADROOM_KEY not in table:
        return None
    return finite_float(
        table[HEADROOM_KEY],
        f"{HEADROOM_KEY} (percent of each SLO's limit, e.g. {HEADROOM_KEY} = 10)",
        where,
        lo=0.0,
        hi=100.0,
        hi_open=True,
    )


def slo_figure(scenario: str, key: str, pool: str | None = None) -> str:
    """The figure name of an SLO's value in one scenario: ``slo.<scenario>.<key>``; in one
    pool of a fleet: ``slo.<scenario>.pool=<pool>.<key>``."""
    return f"slo.{scenario}.{key}" if pool is None else f"slo.{scenario}.pool={pool}.{key}"


@dataclass(frozen=True)
class Headroom:
    """One SLO in one scenario tonight: its value against its limit, and since last night."""

    scenario: str
    slo: str  # the SLO's key: ttft_p99@tenant=chat
    limit_s: float
    value_s: float | None  # None: no request to judge tonight
    previous_s: float | None  # last night's (None: none)
    margin_pct: float | None  # the least headroom allowed (None: not checked)
    pool: str | None = None  # the fleet's pool it is of (None: the whole scenario)

    @property
    def headroom_s(self) -> float | None:
        return None if self.value_s is None else self.limit_s - self.value_s

    @property
    def headroom_pct(self) -> float | None:
        h = self.headroom_s
        return None if h is None else 100.0 * h / self.limit_s

    @property
    def change_s(self) -> float | None:
        if self.value_s is None or self.previous_s is None:
            return None
        return self.value_s - self.previous_s

    @property
    def below_margin(self) -> bool:
        pct = self.headroom_pct
        return self.margin_pct is not None and pct is not None and pct < self.margin_pct

    def describe(self) -> str:
        head = f"{self.slo} in {self.scenario}" + (
            f" (pool {self.pool})" if self.pool is not None else ""
        )
        if self.value_s is None:
            return f"{head}: no request to judge (limit {_ms(self.limit_s)})"
        assert self.headroom_s is not None and self.headroom_pct is not None
        text = (
            f"{head}: {_ms(self.value_s)} of {_ms(self.limit_s)}, headroom "
            f"{_ms(self.headroom_s)} ({self.headroom_pct:.1f}% of the limit)"
        )
        if self.change_s is not None and self.previous_s is not None:
            text += f"; {_ms(self.change_s, sign=True)} since last night ({_ms(self.previous_s)})"
        if self.below_margin:
            text += f"; below the {self.margin_pct:g}% margin"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "pool": self.pool,
            "slo": self.slo,
            "limit_s": self.limit_s,
            "value_s": self.value_s,
            "headroom_s": self.headroom_s,
            "headroom_pct": self.headroom_pct,
            "previous_s": self.previous_s,
            "change_s": self.change_s,
            "margin_pct": self.margin_pct,
            "below_margin": self.below_margin,
        }


def _ms(s: float, *, sign: bool = False) -> str:
    return f"{s * 1e3:{'+' if sign else ''},.1f} ms"


def headrooms(
    previous: Mapping[str, float | None],
    current: Mapping[str, float | None],
    slos: Iterable[tuple[str, str, float]],
    margin_pct: float | None,
    pools: Mapping[str, Sequence[str]] | None = None,
) -> list[Headroom]:
    """The headroom of each (scenario, SLO key, limit in seconds) of tonight, from the
    ``slo.*`` figures of both nights (``slo_figure``); for a fleet (a scenario of
    ``pools``: its pool names, in order), each pool's too, after the fleet's."""
    out = []
    for scenario, key, limit_s in slos:
        for pool in (None, *(pools or {}).get(scenario, ())):
            name = slo_figure(scenario, key, pool)
            out.append(
                Headroom(
                    scenario,
                    key,
                    limit_s,
                    current.get(name),
                    previous.get(name),
                    margin_pct,
                    pool,
                )
            )
    return out
