"""Per traffic class: each tenant's and each model's latencies, SLO verdicts and goodput.

A replay's requests fall into classes of each kind: one per tenant, one per model.
``class_summary`` gives per class what ``summary.summarize`` gives for the whole
traffic, with the same definitions: requests replayed, completed, and p50/p90/p99
of TTFT, TPOT (one-token outputs left out), E2E and queue time over the completed
ones; and, given SLOs, each SLO's statistic over the class, its verdict and the
class's goodput.

Which SLOs judge a class: the unscoped ones (every request) and those scoped to that
class (``ttft_p99@tenant=chat`` judges tenant chat); SLOs scoped to another class, to
another kind, or to prompt lengths are left out. A class's goodput is its completed
requests that meet each of those SLOs on their own, per second of the whole replay's
span (first arrival to last completion): with unscoped SLOs only, the classes'
goodputs add up to the whole traffic's.

Requests without a tenant (model) form the class ``(none)``, shown like any other.
A kind keeps its ``MAX_CLASSES`` largest classes (by requests) and every class an SLO
names; the rest are summed into ``(other)``, which says how many it holds.

NOTE: a kind is a name and a label per request (``ClassLabels``). Tenants and models
are read from the requests (``labels_of``); a pool, once scenarios have pools, is one
more kind whose labels come from the routing: build its ``ClassLabels`` there and add
it to the mapping, and scope SLOs to it in ``plan.slo``; nothing here changes.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from pipeline.sim.state import F_FINISH, R_PROMPT, SimResult
from pipeline.sim.summary import METRICS, request_metric

if TYPE_CHECKING:
    import polars as pl

NONE = "(none)"  # the class of requests without a tenant (model)
OTHER = "(other)"  # the classes beyond MAX_CLASSES, summed
MAX_CLASSES = 20  # classes kept per kind (besides those an SLO names)
REQUEST_KINDS = ("tenant", "model")  # kinds read from the requests, in the order shown
QUANTILES = (50, 90, 99)
_CLASS_SCOPE = re.compile(r"^(?P<kind>[a-z_]+)=(?P<name>.+)$")  # tenant=chat, model=NAME


class Slo(Protocol):
    """What this module reads of an SLO (``pipeline.plan.slo.Slo``; the simulator does not
    import the planning stage above it)."""

    @property
    def metric(self) -> str: ...  # ttft | tpot | e2e | queue
    @property
    def limit_s(self) -> float: ...
    @property
    def scope(self) -> str | None: ...  # tenant=chat, model=NAME, prompt<=N, ...
    @property
    def key(self) -> str: ...
    @property
    def quantile(self) -> float | None: ...  # 99.0 for p99, None for the mean

    def applies(self, groups: Mapping[str, Any], n: int) -> npt.NDArray[np.bool_]: ...


@dataclass(frozen=True)
class ClassLabels:
    """One kind's classes: their names, and each replayed request's class (an index)."""

    names: tuple[str, ...]
    codes: npt.NDArray[np.int32]  # per request, in replay order: an index into names

    def __post_init__(self) -> None:
        if len(self.codes) and not 0 <= int(self.codes.min()) <= int(self.codes.max()) < len(
            self.names
        ):
            raise ValueError("class codes must index the class names")

    @classmethod
    def of(cls, values: Sequence[str | None]) -> ClassLabels:
        """From one label per request (None: ``(none)``)."""
        texts = [NONE if v is None else str(v) for v in values]
        names = sorted(set(texts))
        index = {n: i for i, n in enumerate(names)}
        return cls(tuple(names), np.array([index[t] for t in texts], dtype=np.int32))

    def take(self, rows: npt.NDArray[np.int64]) -> ClassLabels:
        return ClassLabels(self.names, self.codes[rows])


def labels_of(
    frame: pl.DataFrame, rows: npt.NDArray[np.int64] | None = None
) -> dict[str, ClassLabels]:
    """The tenant and model classes of the requests ``frame`` (of its ``rows``, in that
    order; all of them by default). A column the frame lacks gives no kind."""
    whole = _frame_labels(frame)
    return whole if rows is None else {kind: lab.take(rows) for kind, lab in whole.items()}


# the last frame's labels: a sweep prepares every scenario from one frame (a DataFrame is
# never changed in place, so its identity names its contents while it lives)
_last: list[tuple[weakref.ref[Any], dict[str, ClassLabels]]] = []


def _frame_labels(frame: pl.DataFrame) -> dict[str, ClassLabels]:
    import polars as pl

    if _last and _last[0][0]() is frame:
        return _last[0][1]
    out = {}
    for kind in REQUEST_KINDS:
        if kind not in frame.columns:
            continue
        col = frame[kind].cast(pl.String).fill_null(NONE)
        names = col.unique().sort().to_list()
        codes = col.cast(pl.Enum(names)).to_physical().to_numpy().astype(np.int32)
        out[kind] = ClassLabels(tuple(names), codes)
    _last[:] = [(weakref.ref(frame, lambda _: _last.clear()), out)]  # let go with the frame
    return out


def judges(slo: Slo, kind: str, name: str) -> bool:
    """Whether ``slo`` judges the class ``name`` of ``kind``: unscoped, or scoped to it."""
    if slo.scope is None:
        return True
    m = _CLASS_SCOPE.match(slo.scope)
    return m is not None and m["kind"] == kind and m["name"] == name


def class_summary(
    res: SimResult,
    labels: Mapping[str, ClassLabels],
    slos: Sequence[Slo] = (),
    duration_s: float | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per kind, per class: the figures of one replay (see the module's docstring).

    Args:
        res: the replay's result.
        labels: per kind, each replayed request's class (``labels_of``).
        slos: the objectives; those that judge a class give its verdicts and goodput.
        duration_s: the replay's span, for goodput (``summarize``'s ``duration_s``).
    """
    done = ~np.isnan(res.rqf[:, F_FINISH])
    return summarize_classes(lambda name: request_metric(res, name), done, labels, slos, duration_s)


def summarize_classes(
    metric: Callable[[str], npt.NDArray[np.float64]],
    done: npt.NDArray[np.bool_],
    labels: Mapping[str, ClassLabels],
    slos: Sequence[Slo] = (),
    duration_s: float | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """``class_summary`` over per-request arrays: ``metric(name)`` gives one of
    ``summary.METRICS`` for every replayed request (NaN where it has none), ``done``
    which requests completed. One metric is held at a time."""
    kinds = {kind: _Kind(kind, lab, done, slos) for kind, lab in labels.items()}
    for name in METRICS:
        values = metric(name)[done]
        memo: dict[str, Any] = {}  # a class of every request: its figures, once for all kinds
        for k in kinds.values():
            k.add(name, values, memo)
        del values
    return {kind: k.result(duration_s) for kind, k in kinds.items()}


class _Kind:
    """The classes of one kind, their requests sorted by class once for every metric."""

    def __init__(
        self, kind: str, labels: ClassLabels, done: npt.NDArray[np.bool_], slos: Sequence[Slo]
    ) -> None:
        self.kind = kind
        self.names, codes, self.folded = _fold(kind, labels, slos)
        k = len(self.names)
        self.requests = np.bincount(codes, minlength=k)
        codes = codes[done]
        self.codes = codes
        self.completed = np.bincount(codes, minlength=k)
        # (one class, as a trace without tenants has it: its requests are in order already)
        self.order = np.argsort(codes, kind="stable") if k > 1 else None
        self.bounds = np.concatenate([[0], np.cumsum(self.completed)])
        self.slos = list(slos)
        self.stats: list[dict[str, float | None]] = [{} for _ in range(k)]
        self.measured: list[dict[str, float | None]] = [{} for _ in range(k)]
        self.good = np.ones(len(codes), dtype=bool)
        # per SLO, the class it is scoped to (-1: every class; None: none of this kind)
        self.scoped: list[int | None] = []
        for s in self.slos:
            if s.scope is None:
                self.scoped.append(-1)
                continue
            hits = [i for i, n in enumerate(self.names) if judges(s, kind, n)]
            self.scoped.append(hits[0] if hits else None)

    def add(self, name: str, values: npt.NDArray[np.float64], memo: dict[str, Any]) -> None:
        """One metric of the completed requests (in their order); ``memo``: the figures of
        a class that holds every one of them, shared by the kinds (the same figures)."""
        by_class = values if self.order is None else values[self.order]
        metric = name.removesuffix("_s")
        gaps = bool(np.isnan(by_class).any())  # TPOT of one-token outputs
        for i in range(len(self.names)):
            every = self.completed[i] == len(values)
            seg = by_class[self.bounds[i] : self.bounds[i + 1]]
            if gaps:
                seg = seg[~np.isnan(seg)]
            if every and "pct" in memo:
                pct = memo["pct"]
            else:
                pct = np.percentile(seg, QUANTILES) if len(seg) else [None] * len(QUANTILES)
                if every:
                    memo["pct"] = pct
            for q, v in zip(QUANTILES, pct, strict=True):
                self.stats[i][f"{metric}_p{q}_s"] = None if v is None else float(v)
            for s, at in zip(self.slos, self.scoped, strict=True):
                if s.metric == metric and at in (-1, i):
                    if every and s.key in memo:
                        stat = memo[s.key]
                    else:
                        stat = slo_stat(seg, s)
                        if every:
                            memo[s.key] = stat
                    self.measured[i][s.key] = stat
        for s, at in zip(self.slos, self.scoped, strict=True):
            if s.metric != metric or at is None:
                continue
            # vLLM: a one-token request has tpot 0, so it is good on TPOT
            ok = np.nan_to_num(values, nan=0.0) <= s.limit_s
            self.good &= ok if at == -1 else (ok | (self.codes != at))

    def result(self, duration_s: float | None) -> dict[str, dict[str, Any]]:
        num_good = np.bincount(self.codes, weights=self.good, minlength=len(self.names))
        out: dict[str, dict[str, Any]] = {}
        ranked = sorted(range(len(self.names)), key=lambda i: (-self.requests[i], self.names[i]))
        for i in ranked:
            name = self.names[i]
            entry: dict[str, Any] = {
                "num_requests": int(self.requests[i]),
                "completed": int(self.completed[i]),
                **self.stats[i],
            }
            if name == OTHER and self.folded:
                entry["num_classes"] = self.folded
            if self.slos:
                judged = [s for s, at in zip(self.slos, self.scoped, strict=True) if at in (-1, i)]
                verdicts = {
                    s.key: {
                        "limit_s": s.limit_s,
                        "measured_s": self.measured[i].get(s.key),
                        "met": _met(self.measured[i].get(s.key), s),
                    }
                    for s in judged
                }
                good = int(num_good[i])
                entry["slo"] = verdicts
                entry["slo_met"] = all(v["met"] for v in verdicts.values())
                entry["num_good"] = good
                entry["goodput"] = good / duration_s if duration_s else None
            out[name] = entry
        return out


def _fold(
    kind: str, labels: ClassLabels, slos: Sequence[Slo]
) -> tuple[list[str], npt.NDArray[np.int32], int]:
    """The classes shown (those with requests; beyond ``MAX_CLASSES`` the largest, every
    class an SLO names, and ``(other)``), each request's index among them, and how many
    classes ``(other)`` holds (0: none folded)."""
    counts = np.bincount(labels.codes, minlength=len(labels.names))
    present = [i for i in range(len(labels.names)) if counts[i] > 0]
    if len(present) <= MAX_CLASSES:
        kept = present
    else:
        ranked = sorted(present, key=lambda i: (-counts[i], labels.names[i]))
        named = {
            i for i in present if any(judges(s, kind, labels.names[i]) and s.scope for s in slos)
        }
        kept = sorted(set(ranked[:MAX_CLASSES]) | named)
    names = [labels.names[i] for i in kept]
    folded = len(present) - len(kept)
    mapping = np.full(len(labels.names), len(names), dtype=np.int32)
    mapping[kept] = np.arange(len(kept), dtype=np.int32)
    if folded:
        names.append(OTHER)
    return names, mapping[labels.codes], folded


def slo_stat(values: npt.NDArray[np.float64], slo: Slo) -> float | None:
    """The SLO's statistic over ``values`` (NaN left out), as ``plan.slo.evaluate`` takes it."""
    if not len(values):
        return None
    q = slo.quantile
    return float(np.percentile(values, q)) if q is not None else float(values.mean())


def _met(value: float | None, slo: Slo) -> bool:
    return value is None or value <= slo.limit_s


def shown_kinds(classes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The kinds worth a table: those with more than one class (one class is the whole
    traffic again)."""
    return [kind for kind, by_class in classes.items() if len(by_class) > 1]


def slo_entries(slos: Sequence[Slo], measured: Mapping[str, float | None]) -> dict[str, Any]:
    """``{key: {limit_s, measured_s, met}}``: how summaries store each SLO's verdict."""
    return {
        s.key: {
            "limit_s": s.limit_s,
            "measured_s": measured.get(s.key),
            "met": _met(measured.get(s.key), s),
        }
        for s in slos
    }


def judged_requests(
    res: SimResult,
    done: npt.NDArray[np.bool_],
    labels: Mapping[str, ClassLabels],
    slos: Sequence[Slo],
) -> tuple[npt.NDArray[np.bool_], dict[str, npt.NDArray[np.float64]]]:
    """Of the ``done`` (completed) requests of ``res`` (their classes ``labels``): which
    meet every SLO, and each SLO's values over the requests it judges (NaN left out)."""
    n = int(done.sum())
    groups: dict[str, Any] = {
        kind: np.asarray(lab.names, dtype=object)[lab.codes[done]] for kind, lab in labels.items()
    }
    groups["prompt_tokens"] = res.rq[done, R_PROMPT]
    judged: dict[str, npt.NDArray[np.float64]] = {}
    good = np.ones(n, dtype=bool)
    for s in slos:
        values = request_metric(res, f"{s.metric}_s")[done]
        mask = s.applies(groups, n)
        sel = values[mask]
        judged[s.key] = sel[~np.isnan(sel)]
        # vLLM: a one-token request has tpot 0, so it is good on TPOT
        good &= ~mask | (np.nan_to_num(values, nan=0.0) <= s.limit_s)
    return good, judged


def whole_traffic_slos(
    res: SimResult,
    labels: Mapping[str, ClassLabels],
    slos: Sequence[Slo],
    duration_s: float | None,
) -> dict[str, Any]:
    """The whole traffic against ``slos`` (scoped ones judge their requests): the summary
    fields ``slo`` (``slo_entries``), ``slo_met``, ``num_good`` and ``goodput``, as
    ``pipeline.plan.slo.evaluate`` defines them (a test holds the two equal)."""
    done = ~np.isnan(res.rqf[:, F_FINISH])
    good, judged = judged_requests(res, done, labels, slos)
    measured = {s.key: slo_stat(judged[s.key], s) for s in slos}
    return slo_fields(slos, measured, int(good.sum()), duration_s)


def slo_fields(
    slos: Sequence[Slo],
    measured: Mapping[str, float | None],
    num_good: int,
    duration_s: float | None,
) -> dict[str, Any]:
    """A summary's fields for the whole traffic against ``slos``: ``slo``
    (``slo_entries``), ``slo_met``, ``num_good`` and ``goodput`` (per second of
    ``duration_s``; None without one)."""
    entries = slo_entries(slos, measured)
    return {
        "slo": entries,
        "slo_met": all(e["met"] for e in entries.values()),
        "num_good": num_good,
        "goodput": num_good / duration_s if duration_s else None,
    }
