"""Capacity planning: the most load a setup takes within its SLOs, and what a rate needs.

For one trace and one base scenario, up to three searches (``search.py`` has
the algorithms; every probe is a full replay):

- ``concurrency``: the highest concurrency cap (``max_num_seqs``,
  ``max_batch_size``, ``max_running_requests``: ``knobs.py``) that meets
  every SLO at the base scenario's arrivals (the trace's own rate unless the
  base sets ``time_scale`` or ``rate``, or the search sets ``rate``), with the
  throughput and goodput there.
- ``rate``: the highest request rate that meets every SLO, the trace
  time-scaled to each probed rate (scenario key ``rate``).
- ``replicas``: the fewest replicas that meet every SLO at a target rate
  (default: the base scenario's).
- ``swap_space`` (only when named): the least host swap space, whole GiB per GPU
  (``swap_space_gb``, vLLM V0's ``--swap-space``), that meets every SLO at a target
  rate, for a base scenario with ``preemption_mode = "swap"``.
- ``kv_offloading`` (vllm; asked for by name, never a default): the smallest CPU KV
  tier, whole GiB of ``kv_offloading_size_gb`` (docs/replay.md, "KV offloading
  tiers"), that meets every SLO at the base scenario's arrivals (or ``rate``).

The order the seed lab teaches: fix the SLO first, then find the load that
meets it; the throughput at the most load that meets the SLO is what to plan
with, not the highest throughput, which ignores the tail.

Every probe is written like a sweep's scenario (``sim_requests``,
``sim_steps`` unless ``summary_only``, and ``scenarios``), and each probe and
SLO becomes one ``capacity_search`` row, so the report can plot the path.
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.contracts import CAPACITY_SEARCH
from pipeline.errors import ConfigError, ScenarioError
from pipeline.lock import with_warehouse_lock
from pipeline.plan.intervals import END_TOLERANCE, FEWEST, AnswerInterval, Knob, Reversal
from pipeline.plan.knobs import concurrency_knob, swap_knob
from pipeline.plan.prober import ProbeContext, Prober
from pipeline.plan.prober import fmt_value as _fmt
from pipeline.plan.prober import probe_values as _probe_values
from pipeline.plan.replicates import trace_window
from pipeline.plan.search import SearchResult, highest_float, highest_int, lowest_int
from pipeline.plan.slo import Slo, format_seconds, parse_slos
from pipeline.plan.tasks import TaskOutcome, offered_rate, write_scenarios
from pipeline.plan.unloaded import explain_none
from pipeline.processes import default_jobs
from pipeline.progress import progress
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter
from pipeline.sim.intervals import LEVEL
from pipeline.sim.replay import load_loop, selection_record
from pipeline.sim.replay_input import prepare, read_window, select_request_files
from pipeline.sim.replay_sharded import plan_sharding
from pipeline.sim.scenario import Scenario, build_scenario, read_scenario_file
from pipeline.validation import finite_float
from pipeline.warehouse import Warehouse, new_run_id

SEARCHES = ("concurrency", "rate", "replicas")  # what a capacity run searches unless told
OPTIONAL_SEARCHES = ("swap_space", "kv_offloading")  # only when named: --search, [search.<kind>]
ALL_SEARCHES = (*SEARCHES, *OPTIONAL_SEARCHES)
SPEC_MAX = 1e9  # a search bound, tolerance or rate beyond any deployment
SPEC_KEYS = {
    "concurrency": {"min", "max", "rate", "rate_scale"},
    "rate": {"min", "max", "tolerance"},
    "replicas": {"min", "max", "rate", "rate_scale"},
    "swap_space": {"min", "max", "rate", "rate_scale"},
    "kv_offloading": {"min", "max", "rate", "rate_scale"},
}
DEFAULT_MAX_CONCURRENCY = 1024
DEFAULT_MAX_REPLICAS = 64
DEFAULT_MAX_SWAP_GB = 64
DEFAULT_MAX_OFFLOADING_GB = 1024  # the kv_offloading search's top: a host's memory, GiB
RATE_RANGE = 64.0  # the rate search looks from base / 64 to base * 64 unless told


@dataclass(frozen=True)
class SearchSpec:
    """One search: its kind, its range and (concurrency, replicas) the rate it runs at."""

    kind: str  # concurrency | rate | replicas
    lo: float | None = None  # default: 1; rate: the base rate / 64
    hi: float | None = None  # default: 1024 caps, 64 replicas; rate: the base rate * 64
    tolerance: float = 0.02  # rate: stop when the bracket is this narrow (relative)
    rate: float | None = None  # concurrency, replicas: req/s to run at (None: the base's)
    rate_scale: float | None = None  # ... or the base scenario's rate times this


@dataclass
class SearchOutcome:
    """One search: every probe in order and where the verdict flipped."""

    spec: SearchSpec
    knob: str
    lo: float
    hi: float
    result: SearchResult
    probes: list[TaskOutcome]  # in probe order, aligned with result.probes
    # nothing meets: the failing SLOs' unloaded values and what sets them (unloaded.py)
    explanation: str | None = None
    interval: AnswerInterval | None = None  # None: intervals off, or no answer
    # probes only the interval's searches needed: (value, outcome), in the order they ran
    interval_probes: list[tuple[float, TaskOutcome]] = field(default_factory=list)
    slos: list[Slo] = field(default_factory=list)

    @property
    def answer(self) -> float | None:
        return self.result.answer

    @property
    def answer_probe(self) -> TaskOutcome | None:
        for (value, _), out in zip(self.result.probes, self.probes, strict=True):
            if value == self.answer:
                return out
        return None

    @property
    def note(self) -> str | None:
        """Range end reached, nothing meets, or the probes that break monotony."""
        notes = []
        unit = " req/s" if self.spec.kind == "rate" else ""
        if self.answer is None:
            notes.append(
                f"no {self.knob} in [{_fmt(self.lo)}, {_fmt(self.hi)}]{unit} meets every SLO"
            )
            if self.explanation:
                notes.append(self.explanation)
        elif self.result.at_range_end:
            notes.append(
                f"the top of the range ({_fmt(self.hi)}{unit}) meets every SLO: raise the "
                "maximum to look further"
            )
        met_values = [v for v, met in self.result.probes if met]
        if self.spec.kind == "concurrency" and met_values and min(met_values) > self.lo:
            notes.append(f"the lowest probed {self.knob} that meets is {_fmt(min(met_values))}")
        reversal = self.interval.reversal if self.interval is not None else None
        if reversal is not None:
            notes.append(self._reversal_note(reversal))
        elif self.result.violation is not None:
            a, b = self.result.violation
            met = dict(self.result.probes)
            notes.append(
                f"not monotone: {self.knob} {_fmt(a)} {'meets' if met[a] else 'fails'} but "
                f"{_fmt(b)} {'meets' if met[b] else 'fails'}"
            )
        if self.interval is not None and self.interval.uncertainty.is_default:
            notes.append(
                "the profile term is a default (step-time sd "
                f"{self.interval.uncertainty.log_sd:g}): {self.interval.uncertainty.source}"
            )
        return "; ".join(notes) or None

    def brief(self) -> dict[str, Any]:
        """The answer in a few JSON-able fields (the runs row, the nightly manifest)."""
        iv = self.interval
        return {
            "knob": self.knob,
            "answer": self.answer,
            "interval": [iv.lo, iv.hi] if iv else None,  # the answer's 90% interval
            "safe": iv.safe if iv else None,  # meets every SLO at its upper bounds too
            "note": self.note,
        }

    def outcome_at(self, value: float) -> TaskOutcome | None:
        """The probe at ``value``, whether the bisection or the interval asked for it."""
        for v, out in [
            *zip((v for v, _ in self.result.probes), self.probes, strict=True),
            *self.interval_probes,
        ]:
            if v == value:
                return out
        return None

    def _reversal_note(self, r: Reversal) -> str:
        """Two probes against the assumed shape, and whether the interval explains them."""
        level = f"{LEVEL:.0%}"

        def at(value: float) -> str:
            out = self.outcome_at(value)
            measured = out.slo.measured_s if out is not None and out.slo is not None else {}
            shown = [f"{k} {format_seconds(v)}" for k, v in measured.items() if v is not None]
            return f"{self.knob} {_fmt(value)}" + (f" ({', '.join(shown)})" if shown else "")

        where = "beyond" if r.beyond else "within"
        tail = (
            "the probes disagree by more than the interval explains: the answer is one "
            "boundary the bisection found, others may lie above it"
            if r.beyond
            else "noise of the size the interval describes"
        )
        return f"not monotone {where} the {level} interval: {at(r.meets)} meets but " + (
            f"{at(r.fails)} fails; {tail}"
        )


@dataclass
class CapacityResult:
    """What the capacity run found and wrote."""

    run_id: str
    base: Scenario
    slos: list[Slo]
    base_rate: float | None  # requests/s the base scenario offers
    num_requests_read: int
    inputs: list[str]
    searches: list[SearchOutcome] = field(default_factory=list)
    wall_s: float = 0.0
    selection: dict[str, Any] = field(default_factory=dict)  # ``replay.selection_record``
    # what an ``extra`` step of run_capacity added (its runs row's details carry it too)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_replays(self) -> int:
        """Probes replayed and stored as scenarios: the bisections' and the intervals'."""
        return sum(len(s.probes) + len(s.interval_probes) for s in self.searches)

    @property
    def num_interval_replays(self) -> int:
        """Replays made for the intervals and not stored: the answer's own bootstrap, its
        replicates, the profile term's."""
        return sum(
            1 + s.interval.num_replicates + s.interval.num_profile_replays
            for s in self.searches
            if s.interval is not None
        )


def load_capacity_file(path: Path) -> tuple[dict[str, Any], list[Slo], list[SearchSpec]]:
    """A capacity TOML file: ``[base]`` scenario keys, ``[slo]``, ``[search.<kind>]``.

    Raises:
        ConfigError: unreadable, unknown sections or keys, bad SLOs or ranges.
    """
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read capacity file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(raw) - {"base", "slo", "search"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)}; a capacity file has: base, slo, search"
        )
    for key in raw:
        if not isinstance(raw[key], dict):
            raise ConfigError(f"{path}: {key} must be a table ([{key}])")
    slos = parse_slos(raw.get("slo", {}), where=f"{path} [slo]")
    specs = parse_specs(raw.get("search", {}), where=f"{path} [search]")
    return dict(raw.get("base", {})), slos, specs


def parse_specs(table: dict[str, Any], where: str = "--search") -> list[SearchSpec]:
    """Searches from ``{kind: {min, max, ...}}``; an empty table means the default three."""
    if not table:
        return [SearchSpec(kind) for kind in SEARCHES]
    specs = []
    for kind, opts in table.items():
        if kind not in ALL_SEARCHES:
            raise ConfigError(
                f"{where}: unknown search {kind!r}; allowed: {', '.join(ALL_SEARCHES)}"
            )
        if not isinstance(opts, dict):
            raise ConfigError(f"{where}: {kind} must be a table ([search.{kind}])")
        bad = sorted(set(opts) - SPEC_KEYS[kind])
        if bad:
            raise ConfigError(
                f"{where}.{kind}: unknown key(s) {', '.join(bad)}; allowed: "
                f"{', '.join(sorted(SPEC_KEYS[kind]))}"
            )
        num = {k: _number(f"{where}.{kind}", k, v) for k, v in opts.items()}
        if "rate" in num and "rate_scale" in num:
            raise ConfigError(f"{where}.{kind}: give rate or rate_scale, not both")
        specs.append(
            SearchSpec(
                kind,
                lo=num.get("min"),
                hi=num.get("max"),
                tolerance=num.get("tolerance", 0.02),
                rate=num.get("rate"),
                rate_scale=num.get("rate_scale"),
            )
        )
    return specs


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{where}: {key} must be a number > 0, got {value!r}")
    return finite_float(value, key, where, lo=0.0, lo_open=True, hi=SPEC_MAX)


@dataclass(frozen=True)
class CapacityInputs:
    """What a capacity run searches: the base scenario's keys, the SLOs, the searches."""

    base: dict[str, Any]
    slos: list[Slo]
    specs: list[SearchSpec]


def capacity_inputs(
    *,
    capacity_file: Path | None = None,
    scenario: Path | dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
    slos: Iterable[str] | Mapping[str, Any] = (),
    slo_origin: str = "--slo",
    searches: Iterable[str] = (),
    target_rate: float | None = None,
    max_concurrency: int | None = None,
    max_replicas: int | None = None,
) -> CapacityInputs:
    """The inputs of ``run_capacity`` from the layers ``tracereplay capacity`` takes.

    The base scenario: ``defaults`` (the config file's ``[replay]``), under the
    capacity file's ``[base]``, under ``scenario`` (a scenario file, or its keys),
    under ``overrides`` (flags; None values are not given). The SLOs: the capacity
    file's, then ``slos`` (``"ttft_p99=200ms"`` items, or a key -> limit mapping;
    one key given twice keeps the later). The searches: those named in ``searches``
    (each with the file's range where it has one), else the file's (all three
    without a file), with ``max_concurrency``, ``max_replicas`` and ``target_rate``
    (replicas) over their ranges.

    Raises:
        ConfigError: a bad capacity file, SLO or search name (``slo_origin`` names
            where the SLOs came from).
        ScenarioError: an unreadable scenario file.
    """
    base: dict[str, Any] = dict(defaults or {})
    file_slos: list[Slo] = []
    file_specs = [SearchSpec(k) for k in SEARCHES]
    if capacity_file is not None:
        file_base, file_slos, file_specs = load_capacity_file(capacity_file)
        base.update(file_base)
    if isinstance(scenario, dict):
        base.update(scenario)
    elif scenario is not None:
        base.update(read_scenario_file(scenario))
    base.update({k: v for k, v in (overrides or {}).items() if v is not None})
    by_key = {s.key: s for s in file_slos}
    by_key.update({s.key: s for s in parse_slos(slos, where=slo_origin)})
    by_kind = {s.kind: s for s in file_specs}
    kinds = list(searches)
    for kind in kinds:
        if kind not in ALL_SEARCHES:
            raise ConfigError(f"unknown search {kind!r}; allowed: {', '.join(ALL_SEARCHES)}")
    chosen = [by_kind.get(k, SearchSpec(k)) for k in kinds] if kinds else file_specs
    specs = []
    for spec in chosen:
        if spec.kind == "concurrency" and max_concurrency is not None:
            spec = dataclasses.replace(spec, hi=float(max_concurrency))
        if spec.kind == "replicas":
            if max_replicas is not None:
                spec = dataclasses.replace(spec, hi=float(max_replicas))
            if target_rate is not None:
                spec = dataclasses.replace(spec, rate=target_rate)
        specs.append(spec)
    return CapacityInputs(base, list(by_key.values()), specs)


@with_warehouse_lock
def run_capacity(
    warehouse: Path,
    base_values: dict[str, Any],
    slos: list[Slo],
    specs: list[SearchSpec],
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    summary_only: bool = False,
    quiet: bool = False,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
    intervals: bool = True,
    extra: Callable[[ProbeContext, CapacityResult], dict[str, Any]] | None = None,
    jobs: int | None = None,
    ray_address: str | None = None,
    shards: int | None = None,
    shard_warmup_s: float | None = None,
) -> CapacityResult:
    """Run the capacity searches for one base scenario and write every probe.

    Args:
        warehouse: the warehouse (requests are read from it unless ``requests_file``).
        base_values: the base scenario's keys (a scenario file's, plus overrides).
        slos: at least one objective; a probe meets when it meets them all.
        specs: the searches to run, in order.
        requests_file, date_from, date_to: which requests, as for ``replay``.
        summary_only: write each probe's summary (scenarios) but not its sim tables.
        quiet: no progress bar.
        run_id: the run id to write under (default: a new one).
        selection: which of those requests (models, tenants, predicate, time window).
        intervals: give each answer its 90% interval (``intervals.py``: replicates and
            the profile term at the answer, then the searches for the interval's ends).
        extra: a step after the searches, with the probes' context (replays it appends
            to ``ctx.outcomes`` are written with the probes); what it returns is the
            result's ``extra`` and goes into the runs row's details
            (``autoscale_plan.py``: the autoscaled replay beside the fixed search).
        jobs: local worker processes for the intervals' independent replays (an answer's
            replicates and cost-scaled replays; default: every core; 1 runs here).
        ray_address: run those on the Ray cluster at this address instead.
        shards: replay each probe in this many parts (``replay --shards``: replica groups
            under round_robin, else time windows after ``shard_warmup_s``), the parts
            ``jobs`` at once or on the Ray cluster; the intervals' replays too, each in
            parts (``replicates.measure_in_parts``), one after the other.

    Raises:
        ConfigError: no SLO, an empty range, no requests selected, a fleet (``fleet.py``).
        ScenarioError: the base scenario (or one at a range end) is invalid, or a
            probe fails; checked before the first probe where possible.
    """
    t0 = time.perf_counter()
    started = datetime.now(UTC)
    if not slos:
        raise ConfigError("give at least one SLO, e.g. --slo ttft_p99=200ms")
    base = build_scenario(base_values, where="base scenario")
    if base.is_fleet:  # a top-level replicas would turn every pool's at once
        raise ConfigError(
            "the base scenario is a fleet ([[pool]] tables): its pools are searched one by one "
            "by plan.fleet.run_fleet_capacity (what tracereplay capacity runs for a fleet)"
        )
    if base.autoscale is not None:  # a replicas probe would only set its initial count
        raise ConfigError(
            "the base scenario is autoscaled ([autoscale] table): it is compared with the "
            "fewest fixed replicas by plan.autoscale_plan.run_autoscale_capacity (what "
            "tracereplay capacity runs for it)"
        )
    if shards is not None:  # the base scenario can be cut (before anything is read)
        plan_sharding(base, shards, shard_warmup_s)
    wh = Warehouse(warehouse)
    run_id = run_id or new_run_id(started)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    frame, busy = read_window(files, selection)
    chosen = selection_record(selection, busy)
    prep = prepare(frame, base)
    base_rate = offered_rate(prep.inp.arrival_s[prep.num_lead :])  # the window's, not its warm-up's
    del prep
    plans = [_plan(spec, base, base_values, base_rate) for spec in specs]
    wh.init()
    load_loop(base.engine())
    result = CapacityResult(
        run_id=run_id,
        base=base,
        slos=slos,
        base_rate=base_rate,
        num_requests_read=frame.height,
        inputs=[str(f) for f in files],
        selection=chosen,
    )
    outcomes: list[TaskOutcome] = []
    status = "failed"
    try:
        with progress("capacity search", total=None, quiet=quiet) as bar:
            window = trace_window(frame["arrival_s"].to_numpy()) if intervals else None
            ctx = ProbeContext(
                frame, base_values, base.name, slos, run_id, wh, summary_only, outcomes, bar,
                window, jobs=jobs or default_jobs(), ray_address=ray_address,
                shards=shards, shard_warmup_s=shard_warmup_s,
            )  # fmt: skip
            for spec, knob, lo, hi in plans:
                prober = Prober(ctx, spec, knob)
                found = _search(spec, prober.verdict, lo, hi, base_rate)
                probes = [prober.done[v] for v, _ in found.probes]
                why = _why_none(base, frame, slos, probes) if found.answer is None else None
                search = SearchOutcome(spec, knob, lo, hi, found, probes, why, slos=slos)
                if intervals and found.answer is not None:
                    tol = (
                        max(spec.tolerance, END_TOLERANCE) if spec.kind == "rate" else END_TOLERANCE
                    )
                    knob_range = Knob(lo, hi, tol, integer=spec.kind != "rate")
                    search.interval = prober.answer_interval(found.answer, knob_range)
                    search.interval_probes = prober.interval_probes
                result.searches.append(search)
            if extra is not None:
                result.extra = extra(ctx, result)
        write_scenarios(wh, run_id, [o.run for o in outcomes if o.run is not None])
        wh.write(CAPACITY_SEARCH, capacity_table(result), {"run_id": run_id}, "capacity_search")
        status = "ok"
    finally:
        result.wall_s = time.perf_counter() - t0
        write_run_row(
            wh,
            run_id=run_id,
            command="capacity",
            started=started,
            status=status,
            inputs=result.inputs,
            rows_read=frame.height,
            rows_kept=sum(o.run.summary["num_requests"] for o in outcomes if o.run is not None),
            details={
                "selection": chosen,
                "base": base.to_dict(),
                "slos": [str(s) for s in slos],
                "searches": {s.spec.kind: s.brief() for s in result.searches},
                "num_replays": len(outcomes),
                **result.extra,
            },
        )
    return result


def _why_none(
    base: Scenario, frame: pl.DataFrame, slos: list[Slo], probes: list[TaskOutcome]
) -> str | None:
    """For a search where nothing meets: the unloaded value of each SLO no probe met (or,
    when each was met somewhere, of every SLO that failed) and what sets it."""
    failed = [s for s in slos if not any(p.slo is not None and p.slo.met[s.key] for p in probes)]
    if not failed:
        failed = [
            s for s in slos if any(p.slo is not None and not p.slo.met[s.key] for p in probes)
        ]
    if not failed:
        return None
    return explain_none(base, frame, failed)


def _plan(
    spec: SearchSpec, base: Scenario, base_values: dict[str, Any], base_rate: float | None
) -> tuple[SearchSpec, str, float, float]:
    """(spec, knob, lo, hi) with defaults filled in; the range ends are built to check them."""
    if spec.rate_scale is not None:
        if base_rate is None:
            raise ConfigError(f"{spec.kind} search: rate_scale needs a trace with a time span")
        spec = dataclasses.replace(spec, rate=base_rate * spec.rate_scale, rate_scale=None)
    if spec.kind == "concurrency":
        knob = concurrency_knob(base.policy)
        lo, hi = spec.lo or 1.0, spec.hi or float(DEFAULT_MAX_CONCURRENCY)
    elif spec.kind == "replicas":
        knob = "replicas"
        lo, hi = spec.lo or 1.0, spec.hi or float(DEFAULT_MAX_REPLICAS)
    elif spec.kind == "swap_space":
        try:
            knob = swap_knob(base.policy)
        except ScenarioError as exc:
            raise ConfigError(f"swap_space search: {exc}") from None
        if base.swap is None:
            raise ConfigError(
                "swap_space search: the base scenario preempts by recompute; set "
                'preemption_mode = "swap" (and async_scheduling = false) to search its swap space'
            )
        lo, hi = spec.lo or 1.0, spec.hi or float(DEFAULT_MAX_SWAP_GB)
    elif spec.kind == "kv_offloading":
        if base.policy != "vllm":
            raise ConfigError(
                f"kv_offloading search: the CPU KV tier is vLLM's (policy = vllm), not "
                f"{base.policy}'s; drop the search"
            )
        knob = "kv_offloading_size_gb"
        lo, hi = spec.lo or 1.0, spec.hi or float(DEFAULT_MAX_OFFLOADING_GB)
    else:
        knob = "rate"
        if base_rate is None and (spec.lo is None or spec.hi is None):
            raise ConfigError("the rate search needs min and max: the trace has no time span")
        lo = spec.lo or (base_rate or 1.0) / RATE_RANGE
        hi = spec.hi or (base_rate or 1.0) * RATE_RANGE
    if spec.kind != "rate" and (lo != int(lo) or hi != int(hi)):
        raise ConfigError(f"{spec.kind} search: min and max must be whole numbers")
    if not lo <= hi:
        raise ConfigError(f"{spec.kind} search: min ({_fmt(lo)}) is above max ({_fmt(hi)})")
    for end in (lo, hi):
        build_scenario(
            _probe_values(base_values, base.name, spec, knob, end),
            where=f"{spec.kind} search at {knob} = {_fmt(end)}",
        )
    return spec, knob, lo, hi


def _search(
    spec: SearchSpec,
    measure: Callable[[float], bool],
    lo: float,
    hi: float,
    base_rate: float | None,
) -> SearchResult:
    if spec.kind == "concurrency":
        return highest_int(measure, int(lo), int(hi))
    if spec.kind in FEWEST:
        return lowest_int(measure, int(lo), int(hi))
    start = base_rate if base_rate is not None else lo
    return highest_float(measure, start, lo, hi, rel_tol=spec.tolerance)


def capacity_table(result: CapacityResult) -> pa.Table:
    """The capacity_search rows: one per search, probe and SLO (the bisection's probes in
    order, then those only the interval's searches needed)."""
    cols: dict[str, list[Any]] = {n: [] for n in CAPACITY_SEARCH.file_columns}
    for search in result.searches:
        note = search.note
        iv = search.interval
        met = dict(search.result.probes)
        probes = [
            *(
                (v, out, "search")
                for (v, _), out in zip(search.result.probes, search.probes, strict=True)
            ),
            *((v, out, "interval") for v, out in search.interval_probes),
        ]
        for i, (value, out, role) in enumerate(probes):
            assert out.run is not None and out.slo is not None
            s = out.run.summary
            for slo in result.slos:
                measured = out.slo.measured_s[slo.key]
                spread = iv.spread_at(value)[slo.key] if iv else None
                bounds = spread.bounds(measured) if spread and measured else None
                row = {
                    "search": search.spec.kind,
                    "knob": search.knob,
                    "probe": i,
                    "value": float(value),
                    "scenario": out.name,
                    "slo": slo.key,
                    "limit_s": slo.limit_s,
                    "measured_s": measured,
                    "slo_met": out.slo.met[slo.key],
                    "met": met.get(value, out.slo.all_met),
                    "num_requests": s["num_requests"],
                    "offered_rate": out.offered_rate,
                    "request_throughput": s["request_throughput"],
                    "output_token_throughput": s["output_token_throughput"],
                    "goodput": out.slo.goodput,
                    "num_preemptions": s["num_preemptions"],
                    "answer": search.answer,
                    "is_answer": role == "search" and value == search.answer,
                    "monotone": search.result.monotone,
                    "note": note,
                    "probe_role": role,
                    "measured_lo_s": bounds[0] if bounds else None,
                    "measured_hi_s": bounds[1] if bounds else None,
                    "interval_level": LEVEL if iv else None,
                    "answer_lo": iv.lo if iv else None,
                    "answer_hi": iv.hi if iv else None,
                    "answer_safe": iv.safe if iv else None,
                    "reversal_beyond_interval": (
                        any(r.beyond for r in iv.reversals) if iv else None
                    ),
                    "num_replicates": iv.num_replicates if iv else None,
                    "cost_log_sd": iv.uncertainty.log_sd if iv else None,
                    "cost_sd_default": iv.uncertainty.is_default if iv else None,
                }
                for k, v in row.items():
                    cols[k].append(v)
    return pa.table(
        {n: pa.array(cols[n], type=dict(CAPACITY_SEARCH.columns)[n]) for n in cols},
    )
