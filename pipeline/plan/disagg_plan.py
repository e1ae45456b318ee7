"""How many prefill and decode workers: the x:y search of a disaggregated scenario.

A disaggregated scenario (``sim.disagg``) runs x prefill and y decode workers.
``plan_disaggregation`` finds the fewest workers, x + y, for which some split
meets every SLO (``lowest_int`` over the total: with more workers some split
should still meet), tries every split of that total, and keeps the one with
the highest goodput. Beside it, the aggregated alternative on the same GPUs:
the fewest aggregated replicas that meet the same SLOs, and an aggregated
fleet of exactly x + y replicas.

Goodput is the SLO machinery's (``plan.slo``, after DistServe and vLLM's
benchmark client): requests per second that meet every objective; per GPU it is
divided by the GPUs the workers hold (workers x tensor parallel), the figure
DistServe and Splitwise compare disaggregated and aggregated fleets by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ScenarioError
from pipeline.plan.search import lowest_int
from pipeline.pricing import gpu_kind
from pipeline.sim.classes import Slo, whole_traffic_slos
from pipeline.sim.replay import summarize_prepared
from pipeline.sim.replay_input import Prepared
from pipeline.sim.scenario import Scenario

MAX_WORKERS = 32  # the default top of the search (prefill + decode workers)


@dataclass(frozen=True)
class Probe:
    """One replay of the search: a split (or an aggregated fleet) and its figures."""

    prefill: int  # 0 for an aggregated fleet
    decode: int  # the aggregated fleet's replicas, for one
    met: bool
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    goodput: float | None  # requests/s meeting every SLO
    gpus: int
    kv_transfer_p99_s: float | None = None

    @property
    def workers(self) -> int:
        return self.prefill + self.decode

    @property
    def aggregated(self) -> bool:
        return self.prefill == 0

    @property
    def goodput_per_gpu(self) -> float | None:
        return None if self.goodput is None or not self.gpus else self.goodput / self.gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "workers": self.workers,
            "goodput_per_gpu": self.goodput_per_gpu,
        }


@dataclass(frozen=True)
class DisaggPlan:
    """The search's answer and every probe."""

    best: Probe | None  # fewest workers meeting every SLO, then the highest goodput
    aggregated_min: Probe | None  # fewest aggregated replicas meeting every SLO
    aggregated_same: Probe | None  # an aggregated fleet of best.workers replicas
    probes: list[Probe]
    gpus_per_worker: int

    def to_dict(self) -> dict[str, Any]:
        def one(p: Probe | None) -> dict[str, Any] | None:
            return None if p is None else p.to_dict()

        return {
            "best": one(self.best),
            "aggregated_min": one(self.aggregated_min),
            "aggregated_same": one(self.aggregated_same),
            "gpus_per_worker": self.gpus_per_worker,
            "probes": [p.to_dict() for p in self.probes],
        }


def with_workers(sc: Scenario, prefill: int, decode: int) -> Scenario:
    """``sc`` with ``prefill`` prefill and ``decode`` decode workers."""
    assert sc.disagg is not None
    d = dataclasses.replace(sc.disagg, prefill_replicas=prefill, decode_replicas=decode)
    return dataclasses.replace(sc, disagg=d, replicas=prefill + decode)


def aggregated(sc: Scenario, replicas: int) -> Scenario:
    """``sc`` as an aggregated fleet of ``replicas`` engines (same GPU and settings)."""
    return dataclasses.replace(sc, disagg=None, replicas=replicas)


def plan_disaggregation(
    sc: Scenario,
    prep: Prepared,
    slos: Sequence[Slo],
    *,
    max_workers: int = MAX_WORKERS,
) -> DisaggPlan:
    """The x:y search of the module docstring.

    Raises:
        ScenarioError: ``sc`` is not disaggregated, no SLO is given, or the range is empty.
    """
    if sc.disagg is None:
        raise ScenarioError(
            f"scenario {sc.name!r} is not disaggregated: set prefill_replicas and "
            "decode_replicas to search their split"
        )
    if not slos:
        raise ScenarioError("the prefill:decode search needs at least one SLO (--slo)")
    if max_workers < 2:
        raise ScenarioError(f"max workers must be >= 2 (one of each), got {max_workers}")
    tp = gpu_kind(sc.profile)[1]
    seen: dict[tuple[int, int], Probe] = {}

    def probe(prefill: int, decode: int) -> Probe:
        key = (prefill, decode)
        if key not in seen:
            one = with_workers(sc, prefill, decode) if prefill else aggregated(sc, decode)
            run, res = summarize_prepared(one, prep, slos)
            s = {
                **run.summary,
                **whole_traffic_slos(res, prep.classes, slos, run.summary["duration_s"]),
            }
            seen[key] = Probe(
                prefill=prefill,
                decode=decode,
                met=bool(s.get("slo_met")),
                ttft_p99_s=s.get("ttft_p99_s"),
                tpot_p99_s=s.get("tpot_p99_s"),
                goodput=s.get("goodput"),
                gpus=(prefill + decode) * tp,
                kv_transfer_p99_s=(s.get("disagg") or {}).get("kv_transfer_p99_s"),
            )
        return seen[key]

    def any_split(total: float) -> bool:
        n = int(total)
        return any(probe(x, n - x).met for x in range(1, n))

    found = lowest_int(any_split, 2, max_workers)
    best = None
    if found.answer is not None:
        n = int(found.answer)
        met = [probe(x, n - x) for x in range(1, n) if probe(x, n - x).met]
        best = max(met, key=lambda p: (p.goodput or 0.0, -p.prefill))
    agg = lowest_int(lambda r: probe(0, int(r)).met, 1, max_workers)
    agg_min = probe(0, int(agg.answer)) if agg.answer is not None else None
    agg_same = probe(0, best.workers) if best is not None else None
    probes = sorted(seen.values(), key=lambda p: (p.aggregated, p.workers, p.prefill))
    return DisaggPlan(best, agg_min, agg_same, probes, tp)
