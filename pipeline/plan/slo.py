"""Service-level objectives: parse them, check a replay against them, count goodput.

An SLO bounds one statistic of one per-request latency, written as
``<metric>_<statistic>=<limit><unit>``::

    ttft_p99=200ms     p99 of time to first token at most 200 ms
    tpot_p50=30ms      median time per output token (first token excluded)
    e2e_p90=20s        90th percentile of end-to-end latency
    queue_mean=0.5s    mean time from arrival to first scheduled

Metrics are the per-request columns of ``sim_requests`` (``ttft_s``, ``tpot_s``,
``e2e_s``, ``queue_s``); statistics are ``p<q>`` (0 < q <= 100, linear
interpolation as numpy and DuckDB's quantile_cont) or ``mean``; units are
``us``, ``ms``, ``s``. A limit is inclusive: a measured value equal to it meets it.

Goodput follows vLLM's benchmark client (``request_goodput``, after DistServe):
completed requests that meet *every* SLO's limit on their own, per second of
the replay (first arrival to last completion, the span throughput uses). As
there, a request with a single output token has a TPOT of 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError

METRICS = {
    "ttft": "time to first token (first token - arrival)",
    "tpot": "time per output token ((e2e - ttft) / (output tokens - 1))",
    "e2e": "end-to-end latency (last token - arrival)",
    "queue": "queue time (first scheduled - arrival)",
}
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
MAX_LIMIT_S = 1e6  # about 11 days: beyond any latency a replay measures

_KEY_RE = re.compile(r"^(?P<metric>[a-z0-9]+)_(?P<stat>p\d+(?:\.\d+)?|mean)$")
_SCOPE_RE = re.compile(
    r"^(?:(?P<dim>tenant|model)(?P<eq>=)(?P<name>.+)|(?P<pdim>prompt)(?P<op><=|>)(?P<n>\d+))$"
)
_LIMIT_RE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)(?:e(?P<exp>[+-]?\d+))?\s*(?P<unit>[a-z]*)$")


@dataclass(frozen=True)
class Slo:
    """One objective: ``statistic(metric) <= limit_s`` over the completed requests."""

    metric: str  # ttft | tpot | e2e | queue (the sim_requests column without _s)
    stat: str  # p<q> or mean
    limit_s: float  # inclusive upper bound, seconds
    # only these requests: "tenant=chat", "model=llama-3-8b", "prompt<=2000", "prompt>2000"
    scope: str | None = None

    @property
    def key(self) -> str:
        """``ttft_p99`` (or ``ttft_p99@tenant=chat``): how the SLO is named in tables and JSON."""
        return f"{self.metric}_{self.stat}" + (f"@{self.scope}" if self.scope else "")

    def applies(self, groups: Mapping[str, Any], n: int) -> npt.NDArray[np.bool_]:
        """Which of ``n`` requests the SLO judges (every one without a scope).

        ``groups`` holds per-request ``tenant``, ``model`` and ``prompt_tokens`` arrays.
        """
        if self.scope is None:
            return np.ones(n, dtype=bool)
        dim, op, value = scope_parts(self.scope)
        if dim == "prompt":
            prompt = np.asarray(groups["prompt_tokens"], dtype=np.float64)
            return prompt <= float(value) if op == "<=" else prompt > float(value)
        return np.asarray(groups[dim], dtype=object) == value

    @property
    def quantile(self) -> float | None:
        """The percentile (99.0 for p99), or None for the mean."""
        return float(self.stat[1:]) if self.stat.startswith("p") else None

    def __str__(self) -> str:
        return f"{self.key}<={format_seconds(self.limit_s)}"


def scope_parts(scope: str) -> tuple[str, str, str]:
    """("tenant", "=", "chat") or ("prompt", "<=", "2000"); ValueError when malformed."""
    m = _SCOPE_RE.match(scope)
    if m is None:
        raise ValueError(scope)
    if m["dim"]:
        return m["dim"], "=", m["name"]
    return "prompt", m["op"], m["n"]


@dataclass(frozen=True)
class SloReport:
    """How one replay measured against a list of SLOs."""

    measured_s: dict[str, float | None]  # SLO key -> the statistic (None: no request has it)
    met: dict[str, bool]  # SLO key -> measured <= limit
    num_good: int  # completed requests meeting every SLO on their own
    goodput: float | None  # num_good per second of the replay's span

    @property
    def all_met(self) -> bool:
        return all(self.met.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured_s": self.measured_s,
            "met": self.met,
            "all_met": self.all_met,
            "num_good": self.num_good,
            "goodput": self.goodput,
        }


def format_seconds(s: float) -> str:
    """200ms, 1.5s, 250us: the shortest unit that keeps the number >= 1."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale or unit == "us":
            return f"{s / scale:g}{unit}"
    raise AssertionError("unreachable")


def parse_limit(text: str, where: str) -> float:
    """``200ms`` -> 0.2 (seconds). A unit is required.

    Raises:
        ConfigError: no number, no unit, or a unit other than us, ms, s.
    """
    m = _LIMIT_RE.match(text.strip().lower())
    if not m:
        raise ConfigError(f"{where}: {text!r} is not a time limit; write e.g. 200ms or 0.2s")
    unit = m["unit"]
    if unit not in UNITS:
        hint = "give a unit" if not unit else f"unknown unit {unit!r}"
        raise ConfigError(
            f"{where}: {text!r}: {hint}; allowed units: {', '.join(UNITS)} (e.g. 200ms)"
        )
    if len(m["exp"] or "") > 6:
        raise ConfigError(f"{where}: {text!r}: the limit must be a time in (0, {MAX_LIMIT_S:g}s]")
    value = float(f"{m['num']}e{m['exp'] or 0}") * UNITS[unit]  # 1e400 is inf, not an error
    if not value > 0:
        raise ConfigError(f"{where}: {text!r}: the limit must be a positive time")
    if not math.isfinite(value) or value > MAX_LIMIT_S:
        raise ConfigError(f"{where}: {text!r}: the limit must be a time in (0, {MAX_LIMIT_S:g}s]")
    return value


def parse_slo(key: str, limit: str, where: str = "--slo") -> Slo:
    """One SLO from its key (``ttft_p99``) and limit (``200ms``).

    Raises:
        ConfigError: unknown metric or statistic, bad percentile, bad limit or unit.
    """
    key, _, scope = key.strip().partition("@")
    if scope:
        try:
            scope_parts(scope.strip())
        except ValueError:
            raise ConfigError(
                f"{where}: {key}@{scope}: a scope is tenant=NAME, model=NAME, prompt<=N or "
                "prompt>N, e.g. ttft_p99@tenant=chat=200ms"
            ) from None
    m = _KEY_RE.match(key.strip().lower())
    if not m:
        raise ConfigError(
            f"{where}: {key!r} is not an SLO name; write <metric>_<statistic> with metric "
            f"one of {', '.join(METRICS)} and statistic p<q> or mean, e.g. ttft_p99=200ms"
        )
    metric, stat = m["metric"], m["stat"]
    if metric not in METRICS:
        raise ConfigError(
            f"{where}: unknown SLO metric {metric!r} in {key!r}; allowed: {', '.join(METRICS)}"
        )
    if stat.startswith("p") and not 0 < float(stat[1:]) <= 100:
        raise ConfigError(f"{where}: percentile {stat!r} in {key!r} must be in (0, 100]")
    limit_s = parse_limit(limit, f"{where} {key}")
    return Slo(metric=metric, stat=stat, limit_s=limit_s, scope=scope.strip() or None)


def parse_slos(items: Iterable[str] | Mapping[str, Any], where: str = "--slo") -> list[Slo]:
    """SLOs from ``KEY=LIMIT`` strings (the command line) or a TOML table.

    Raises:
        ConfigError: a malformed item, or the same SLO given twice.
    """
    pairs: list[tuple[str, str]] = []
    if isinstance(items, Mapping):
        for key, value in items.items():
            if not isinstance(value, str):
                raise ConfigError(
                    f"{where}: {key} = {value!r}: give the limit as a string with its unit, "
                    f'e.g. {key} = "200ms"'
                )
            pairs.append((key, value))
    else:
        for item in items:
            key, sep, value = item.rpartition("=")  # the limit follows the last '='
            if not key:
                key, sep, value = item, "", ""
            if not sep:
                raise ConfigError(f"{where}: {item!r}: expected KEY=LIMIT, e.g. ttft_p99=200ms")
            pairs.append((key, value))
    slos: list[Slo] = []
    for key, value in pairs:
        slo = parse_slo(key, value, where)
        if any(s.key == slo.key for s in slos):
            raise ConfigError(f"{where}: {slo.key} is given twice")
        slos.append(slo)
    return slos


def stored_ttft_p99(texts: Iterable[str]) -> float | None:
    """The limit, in seconds, of the unscoped ``ttft_p99`` among SLOs as runs store them
    (``str(Slo)``: ``ttft_p99<=200ms``); None when there is none or it does not parse."""
    for text in texts:
        key, sep, limit = str(text).rpartition("<=")  # the limit follows the last '<='
        if sep and key.strip() == "ttft_p99":
            try:
                return parse_limit(limit.strip(), "stored SLO")
            except ConfigError:
                return None
    return None


def parse_stored(text: str, where: str = "stored SLO") -> Slo:
    """One SLO as runs store it and ``str(Slo)`` writes it (``ttft_p99@tenant=chat<=500ms``).

    Raises:
        ConfigError: no ``<=``, or a key or limit ``parse_slo`` refuses.
    """
    key, sep, limit = str(text).rpartition("<=")  # the limit follows the last '<='
    if not sep or not key.strip():
        raise ConfigError(f"{where}: {text!r}: expected KEY<=LIMIT, e.g. ttft_p99<=200ms")
    return parse_slo(key, limit.strip(), where)


def _stat(values: npt.NDArray[np.float64], slo: Slo) -> float | None:
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    q = slo.quantile
    return float(np.percentile(values, q)) if q is not None else float(values.mean())


def evaluate(
    slos: list[Slo],
    metrics: Mapping[str, npt.NDArray[np.float64]],
    duration_s: float,
    groups: Mapping[str, Any] | None = None,
) -> SloReport:
    """Check one replay against ``slos``.

    Args:
        slos: the objectives.
        metrics: per-request ``ttft_s``, ``tpot_s`` (NaN for one-token outputs),
            ``e2e_s`` and ``queue_s`` of the completed requests.
        duration_s: the replay's span (first arrival to last completion).
        groups: per-request ``tenant``, ``model``, ``prompt_tokens`` (aligned with
            ``metrics``), for SLOs with a scope; a scoped SLO judges only its requests.

    Returns:
        Each SLO's measured statistic and verdict, and the goodput. A statistic
        no request has (TPOT when every output is one token) meets its SLO.
    """
    measured: dict[str, float | None] = {}
    met: dict[str, bool] = {}
    n = len(next(iter(metrics.values()))) if metrics else 0
    good = np.ones(n, dtype=bool)
    for slo in slos:
        values = np.asarray(metrics[f"{slo.metric}_s"], dtype=np.float64)
        if slo.scope is not None and groups is None:
            raise ConfigError(f"SLO {slo.key}: this command cannot tell requests apart by scope")
        mask = slo.applies(groups or {}, n)
        value = _stat(values[mask], slo)
        measured[slo.key] = value
        met[slo.key] = value is None or value <= slo.limit_s
        # vLLM: a one-token request has tpot 0, so it is good on TPOT
        good &= ~mask | (np.nan_to_num(values, nan=0.0) <= slo.limit_s)
    num_good = int(good.sum())
    goodput = num_good / duration_s if duration_s > 0 else None
    return SloReport(measured_s=measured, met=met, num_good=num_good, goodput=goodput)
