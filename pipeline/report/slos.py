"""The SLOs a report judges by, where they came from, and how the page says so.

A report takes the SLOs given to it (``report --slo``, scopes included), else those the
run stored (``sweep --slo``, ``capacity --slo``, nightly's ``[slo]``). With neither it
has no SLO: the header says so, and the charts and goodput use p99 TTFT <= 200 ms as an
example, named as one wherever it appears. No SLO is ever made up beyond that example.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pipeline.errors import ConfigError
from pipeline.plan.slo import Slo, format_seconds, parse_stored

EXAMPLE = Slo(metric="ttft", stat="p99", limit_s=0.2)
Source = Literal["given", "run", "none"]
_SOURCES = {
    "given": "given to the report (--slo)",
    "run": "the run's own (sweep --slo, capacity --slo or [slo])",
}


def slo_label(slo: Slo) -> str:
    """``ttft_p99 of tenant=chat <= 500ms``: how the page names an SLO (as slo_capacity.sql
    writes its slo_label)."""
    scope = f" of {slo.scope}" if slo.scope else ""
    return f"{slo.metric}_{slo.stat}{scope} <= {format_seconds(slo.limit_s)}"


@dataclass(frozen=True)
class SloLine:
    """One SLO as a rule on a chart: the statistic it bounds, its limit and its label."""

    metric: str
    stat: str
    limit_s: float
    label: str


@dataclass(frozen=True)
class ReportSlos:
    """The report's SLOs (none: ``slos`` is empty) and where they came from."""

    slos: tuple[Slo, ...] = ()
    source: Source = "none"

    @property
    def is_example(self) -> bool:
        return not self.slos

    @property
    def judged(self) -> tuple[Slo, ...]:
        """What goodput and the sweep charts judge: the SLOs, else the example."""
        return self.slos or (EXAMPLE,)

    def texts(self) -> list[str]:
        """The judged SLOs as runs store them (``ttft_p99@tenant=chat<=500ms``): the
        ``slos`` parameter of the queries."""
        return [str(s) for s in self.judged]

    def describe(self) -> str:
        """The header's line: every SLO with its scope and where they came from, or that
        there is none and what stands in for it."""
        if self.is_example:
            return (
                "none given: no --slo was passed to the report and the run stores none. "
                f"The charts draw {slo_label(EXAMPLE)} as an example (labelled so) and goodput "
                "counts the requests within it; pass report --slo (e.g. ttft_p99=500ms, "
                "ttft_p99@tenant=chat=300ms) to judge by yours."
            )
        return "; ".join(slo_label(s) for s in self.slos) + f" ({_SOURCES[self.source]})"

    def goodput_basis(self) -> str:
        """What goodput counts, in words."""
        if self.is_example:
            return f"requests within the example {slo_label(EXAMPLE)} (no SLO given)"
        return "requests that meet every SLO that applies to them: " + ", ".join(
            slo_label(s) for s in self.slos
        )

    def lines(self, metric: str, stats: Iterable[str] | None = None) -> tuple[SloLine, ...]:
        """The rules a chart of ``metric`` (and of the statistics ``stats``; None: any)
        draws: one per SLO on that metric and statistic, scoped ones too, named with their
        scope; the example when there is no SLO, named as the example."""
        wanted = None if stats is None else set(stats)
        out = []
        for s in self.judged:
            if s.metric != metric or (wanted is not None and s.stat not in wanted):
                continue
            label = slo_label(s) + (" (example: no SLO given)" if self.is_example else "")
            out.append(SloLine(s.metric, s.stat, s.limit_s, label))
        return tuple(out)


def resolve(
    given: Iterable[str] | None, run_slos: str | None, slo_ttft_s: float | None = None
) -> ReportSlos:
    """The report's SLOs: ``given`` (stored form, ``ttft_p99<=200ms``; ``slo_ttft_s``, the
    deprecated objective, stands for an unscoped p99 TTFT), else the run's (its runs row's
    JSON list), else none.

    Raises:
        ConfigError: a given SLO that does not parse, or both ``given`` and ``slo_ttft_s``.
    """
    texts = list(given or ())
    if slo_ttft_s is not None:
        if texts:
            raise ConfigError("give --slo ttft_p99=... or the deprecated --slo-ttft-ms, not both")
        return ReportSlos((Slo("ttft", "p99", float(slo_ttft_s)),), "given")
    if texts:
        return ReportSlos(_unique(parse_stored(t, "--slo") for t in texts), "given")
    stored = _stored(run_slos)
    return ReportSlos(stored, "run") if stored else ReportSlos()


def _stored(run_slos: str | None) -> tuple[Slo, ...]:
    """The SLOs of a runs row; a row written by hand that does not parse counts as none."""
    if not run_slos:
        return ()
    try:
        texts = json.loads(run_slos)
        if not isinstance(texts, list):
            return ()
        return _unique(parse_stored(str(t)) for t in texts)
    except (ValueError, ConfigError):
        return ()


def _unique(slos: Iterable[Slo]) -> tuple[Slo, ...]:
    out: list[Slo] = []
    for s in slos:
        if any(o.key == s.key for o in out):
            raise ConfigError(f"--slo: {s.key} is given twice")
        out.append(s)
    return tuple(out)


__all__ = ["EXAMPLE", "ReportSlos", "SloLine", "resolve", "slo_label"]
