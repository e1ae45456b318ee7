"""The Python API: ingest, replay, search capacity and query, from a notebook or a script.

Each function makes the library call its command makes (``tracereplay ingest``,
``replay``, ``capacity``, ``sql``), with the same defaults, the same config
file (``config``, else ``$TRACEREPLAY_CONFIG``, else ``./tracereplay.toml``:
its warehouse, ``[ingest]``, ``[replay]`` and ``[gpu_prices]``) and the same
warehouse lock, and returns typed results and polars frames instead of
printing. Nothing prints: progress bars are off unless ``progress=True``. A
failure raises the error the command would print in one line, a
``pipeline.errors.PipelineError`` (``ConfigError``, ``ScenarioError``,
``SourceError``, ...; bad SQL is ``pipeline.report.sql.QueryError``).

::

    from pipeline import api

    counts = api.ingest(["traces/azure_conv.csv"], warehouse="wh")
    run = api.replay({"policy": "vllm", "max_num_seqs": 64}, warehouse="wh")
    run.scenarios["vllm"].summary.ttft_p99_s
    run.scenarios["vllm"].requests           # the sim_requests rows, a polars frame
    plan = api.capacity({"ttft_p99": "200ms"}, searches=["concurrency"], warehouse="wh")
    api.query("SELECT count(*) AS n FROM requests", warehouse="wh")

docs/api.md has a worked example (the test suite runs it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.config import Config, load_config, warehouse_path
from pipeline.errors import ConfigError
from pipeline.ingest import FileResult

__all__ = [
    "CapacityAnswer",
    "IngestCounts",
    "ReplayRun",
    "ReplaySummary",
    "ScenarioResult",
    "SearchAnswer",
    "capacity",
    "ingest",
    "query",
    "replay",
]

PathLike = str | Path
# A scenario: a scenario TOML file, or its keys (docs/replay.md lists them)
ScenarioLike = PathLike | Mapping[str, Any]
# --from / --to: a day ("2024-05-01", a date) or a moment ("2024-05-01T18:00", a datetime)
Moment = str | date | datetime


@dataclass(frozen=True)
class IngestCounts:
    """What an ingest read and kept: for every file, rows read = kept + quarantined +
    duplicates."""

    run_id: str
    warehouse: Path
    rows_read: int
    rows_kept: int
    rows_quarantined: int
    rows_duplicate: int
    files: list[FileResult]  # per file: path, format, the counts, dates, error

    @property
    def ok(self) -> bool:
        """Whether every file was ingested (a file that failed landed nothing)."""
        return not self.errors

    @property
    def errors(self) -> list[str]:
        """One line per file that could not be ingested."""
        return [f.error for f in self.files if f.error]


@dataclass(frozen=True)
class ReplaySummary:
    """The headline figures of one replayed scenario (seconds, requests/s, tokens/s).

    ``figures`` holds every figure the replay computed (``tracereplay replay --json``'s
    ``summary``: intervals, prefix-cache counts, ...); the fields are the common ones.
    A latency is None when no request completed.
    """

    num_requests: int
    completed: int
    num_dropped: int  # left out as too long (drop_too_long)
    duration_s: float
    request_throughput: float | None
    output_token_throughput: float | None
    total_token_throughput: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    queue_p99_s: float | None
    latency_basis: str  # "client" (the profile's front end included) or "engine"
    max_queue_depth: int
    mean_queue_depth: float
    num_preemptions: int
    kv_peak_usage: float  # share of the KV blocks in use at the peak
    prefix_token_hit_rate: float | None
    figures: dict[str, Any] = field(repr=False, compare=False)

    def interval(self, figure: str) -> tuple[float, float] | None:
        """The 90% interval of a percentile (``"ttft_p99_s"``, ``"tpot_p50_s"``, ...): None
        when the replay ran without intervals or gives that figure none."""
        stats = (self.figures.get("intervals") or {}).get("stats", {})
        bounds = stats.get(figure)
        return (bounds["lo"], bounds["hi"]) if bounds else None

    @property
    def pools(self) -> dict[str, ReplaySummary]:
        """A fleet's pools, by name in the fleet's order: each pool's own summary over its
        requests (its ``figures`` add ``match``, ``policy``, ``profile``, ``replicas``);
        empty for a scenario without ``[[pool]]`` tables."""
        return {name: ReplaySummary.of(e) for name, e in (self.figures.get("pools") or {}).items()}

    @classmethod
    def of(cls, summary: dict[str, Any]) -> ReplaySummary:
        """The fields of a replay's summary dict, which stays whole in ``figures``."""
        names = [f.name for f in fields(cls) if f.name != "figures"]
        values: dict[str, Any] = {n: summary.get(n) for n in names}
        return cls(**values, figures=summary)


@dataclass
class ScenarioResult:
    """One scenario of a replay: its resolved configuration, summary and rows.

    ``requests`` and ``steps`` are read from the warehouse views when first used.
    """

    name: str
    config: dict[str, Any]  # every resolved key (the scenarios table's config_json)
    summary: ReplaySummary
    cost: dict[str, Any] | None  # $/hour and $ per 1M tokens; None without a GPU price
    run_id: str
    warehouse: Path

    @cached_property
    def requests(self) -> pl.DataFrame:
        """The scenario's ``sim_requests`` rows, in arrival order."""
        return _run_rows(self.warehouse, "sim_requests", self.run_id, self.name)

    @cached_property
    def steps(self) -> pl.DataFrame:
        """The scenario's ``sim_steps`` rows, by replica and step."""
        return _run_rows(self.warehouse, "sim_steps", self.run_id, self.name)


@dataclass(frozen=True)
class ReplayRun:
    """A replay run: its id and each scenario's result, by name in the order given."""

    run_id: str
    warehouse: Path
    num_requests_read: int
    scenarios: dict[str, ScenarioResult]


@dataclass(frozen=True)
class SearchAnswer:
    """One capacity search's answer."""

    kind: str  # concurrency | rate | replicas
    knob: str  # what it varied: max_num_seqs (or the policy's cap), rate, replicas
    answer: float | None  # None: nothing in the range meets every SLO
    interval: tuple[float | None, float | None] | None  # the answer's 90% interval
    safe: bool | None  # meets every SLO at the interval's upper bounds too
    note: str | None  # range end reached, nothing meets, not monotone, ...
    num_probes: int


@dataclass
class CapacityAnswer:
    """A capacity run: the base scenario, the SLOs and each search's answer.

    ``result`` is the library's whole result (every probe's replay and SLO report);
    ``probes`` the run's ``capacity_search`` rows (one per probe and SLO), read when
    first used.
    """

    run_id: str
    warehouse: Path
    base: dict[str, Any]  # the base scenario, resolved
    base_rate: float | None  # requests/s the base scenario offers
    slos: list[str]  # "ttft_p99<=200ms", ...
    searches: dict[str, SearchAnswer]  # by kind, in the order run
    num_replays: int
    wall_s: float
    result: Any = field(repr=False)  # pipeline.plan.capacity.CapacityResult

    @cached_property
    def probes(self) -> pl.DataFrame:
        """The run's ``capacity_search`` rows, by search and probe."""
        return _run_rows(self.warehouse, "capacity_search", self.run_id)


def ingest(
    sources: PathLike | Sequence[PathLike],
    *,
    warehouse: PathLike | None = None,
    config: PathLike | None = None,
    log_format: str | None = None,
    prefix_block_tokens: int | None = None,
    hash_salt: str | None = None,
    tokenizer: PathLike | None = None,
    trace_start: str | None = None,
    tenant: str | None = None,
    model: str | None = None,
    progress: bool = False,
    lock_timeout_s: float = 600.0,
) -> IngestCounts:
    """Ingest request logs into the warehouse (``tracereplay ingest``).

    Args:
        sources: log files, globs or directories (gzip and zstd are read).
        warehouse: the warehouse directory [default: the config's, else ./warehouse].
        config: a config file [default: $TRACEREPLAY_CONFIG, else ./tracereplay.toml].
        log_format: force the format instead of detecting it (azure, gateway, ...).
        prefix_block_tokens: tokens per prefix-hash block [config ingest.block_size].
        hash_salt: mixed into the first block hash.
        tokenizer: tokenizer.json (or its model folder) to hash prompt text.
        trace_start: UTC start for logs with relative times, ISO-8601.
        tenant, model: of every record that names none (``--tenant``, ``--model``).
        progress: show a progress bar.
        lock_timeout_s: wait this long for another writer of the warehouse.

    Returns:
        The counts, per file and in all. A file that fails lands nothing and is named
        in ``errors``; the others land (``ok`` is False then).

    Raises:
        SourceError: a source matched no file.
        ConfigError: a bad option or config file.
        LockTimeoutError: the warehouse stayed locked.
    """
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.lock import warehouse_lock
    from pipeline.warehouse import Warehouse

    cfg = _config(config)
    root = _warehouse(warehouse, cfg)
    opts = IngestOptions.from_config(
        cfg,
        fmt=log_format,
        block_size=prefix_block_tokens,
        hash_salt=hash_salt,
        tokenizer=Path(tokenizer) if tokenizer is not None else None,
        trace_start=trace_start,
        quiet=not progress,
        tenant=tenant,
        model=model,
    )
    with warehouse_lock(root, timeout_s=lock_timeout_s):
        result = ingest_logs([str(s) for s in _many(sources)], Warehouse(root), opts)
    return IngestCounts(
        run_id=result.run_id,
        warehouse=root,
        rows_read=result.total("rows_read"),
        rows_kept=result.total("rows_kept"),
        rows_quarantined=result.total("rows_quarantined"),
        rows_duplicate=result.total("rows_duplicate"),
        files=result.files,
    )


def replay(
    scenarios: ScenarioLike | Sequence[ScenarioLike] | None = None,
    *,
    warehouse: PathLike | None = None,
    config: PathLike | None = None,
    requests_file: PathLike | None = None,
    date_from: Moment | None = None,
    date_to: Moment | None = None,
    models: str | Sequence[str] = (),
    tenants: str | Sequence[str] = (),
    where: str | None = None,
    intervals: bool = True,
    gpu_hour_price: float | None = None,
    progress: bool = False,
    **keys: Any,
) -> ReplayRun:
    """Replay requests through scenarios and write the run (``tracereplay replay``).

    Args:
        scenarios: a scenario TOML file or a dict of scenario keys, or a list of them
            (one scenario each); None: ``keys`` alone make one scenario.
        keys: scenario keys over every scenario, as the command's flags are
            (``policy="vllm"``, ``max_num_seqs=64``, ``num_requests=200``, ...);
            the config's ``[replay]`` fills what neither gives.
        warehouse: the warehouse directory [default: the config's, else ./warehouse].
        config: a config file [default: $TRACEREPLAY_CONFIG, else ./tracereplay.toml].
        requests_file: one requests Parquet file instead of the warehouse's days.
        date_from, date_to: the days (or, with a time, the moments) to read, as
            ``--from``/``--to`` take them: "2024-05-01", "2024-05-01T18:00", or a
            date or (UTC) datetime.
        models, tenants: only these models' or tenants' requests.
        where: only requests matching this SQL predicate on the requests columns.
        intervals: give the latency percentiles their 90% intervals (two more replays
            per scenario).
        gpu_hour_price: dollars per GPU-hour for any GPU, over ``[gpu_prices]``.
        progress: show progress bars.

    Returns:
        The run id and, per scenario, its configuration, summary, cost, and its
        ``sim_requests`` and ``sim_steps`` rows as polars frames.

    Raises:
        ScenarioError: an invalid scenario (nothing is replayed).
        ConfigError: no requests selected, a bad selection.
    """
    from pipeline.pricing import gpu_prices, scenario_cost
    from pipeline.sim.replay import replay as replay_requests
    from pipeline.sim.scenario import resolve_scenarios

    cfg = _config(config)
    root = _warehouse(warehouse, cfg)
    layers: list[Path | dict[str, Any]] = [
        dict(s) if isinstance(s, Mapping) else Path(s) for s in _many(scenarios)
    ]
    resolved = resolve_scenarios(layers, keys, defaults=dict(cfg.sections.get("replay", {})))
    selection = _selection(requests_file, date_from, date_to, models, tenants, where)
    result = replay_requests(root, resolved, **selection, quiet=not progress, intervals=intervals)
    prices = gpu_prices(cfg, gpu_hour_price)
    return ReplayRun(
        run_id=result.run_id,
        warehouse=root,
        num_requests_read=result.num_requests_read,
        scenarios={
            r.scenario.name: ScenarioResult(
                name=r.scenario.name,
                config=r.scenario.to_dict(),
                summary=ReplaySummary.of(r.summary),
                cost=scenario_cost(prices, r.scenario, r.summary),
                run_id=result.run_id,
                warehouse=root,
            )
            for r in result.runs
        },
    )


def capacity(
    slos: str | Iterable[str] | Mapping[str, str] = (),
    *,
    scenario: ScenarioLike | None = None,
    capacity_file: PathLike | None = None,
    searches: str | Iterable[str] = (),
    target_rate: float | None = None,
    max_concurrency: int | None = None,
    max_replicas: int | None = None,
    summary_only: bool = False,
    intervals: bool = True,
    warehouse: PathLike | None = None,
    config: PathLike | None = None,
    requests_file: PathLike | None = None,
    date_from: Moment | None = None,
    date_to: Moment | None = None,
    models: str | Sequence[str] = (),
    tenants: str | Sequence[str] = (),
    where: str | None = None,
    progress: bool = False,
    **keys: Any,
) -> CapacityAnswer:
    """The highest cap and rate, and the fewest replicas, within SLOs (``tracereplay
    capacity``).

    Args:
        slos: the objectives every probe must meet: ``"ttft_p99=200ms"`` items or a
            mapping ``{"ttft_p99": "200ms", "ttft_p99@tenant=chat": "150ms"}``
            (metrics ttft, tpot, e2e, queue; statistics p<q>, mean; units us, ms, s).
        scenario: the base scenario, a scenario TOML file or its keys.
        capacity_file: a capacity TOML file ([base], [slo], [search.<kind>]).
        searches: run only these (concurrency, rate, replicas) [default: the file's,
            else all three].
        target_rate: requests/s the replicas search must serve [default: the base's].
        max_concurrency, max_replicas: the tops of those searches.
        summary_only: write each probe's summary, not its sim_requests and sim_steps.
        intervals: give each answer its 90% interval (more replays).
        keys: base scenario keys over the file's and ``scenario``'s, as the
            command's flags are (``policy="vllm"``, ``num_requests=200``, ...).
        warehouse, config, requests_file, date_from, date_to, models, tenants, where,
            progress: as for ``replay``.

    Returns:
        Each search's answer (with its interval, whether it is safe, and its note),
        and the run's probes as a polars frame.

    Raises:
        ConfigError: no SLO, a bad SLO, search or range; no requests selected.
        ScenarioError: the base scenario is invalid.
    """
    from pipeline.plan.capacity import capacity_inputs, run_capacity

    cfg = _config(config)
    root = _warehouse(warehouse, cfg)
    base_scenario: Path | dict[str, Any] | None
    if scenario is None or isinstance(scenario, Mapping):
        base_scenario = dict(scenario) if scenario is not None else None
    else:
        base_scenario = Path(scenario)
    inputs = capacity_inputs(
        capacity_file=Path(capacity_file) if capacity_file is not None else None,
        scenario=base_scenario,
        overrides=keys,
        defaults=cfg.sections.get("replay", {}),
        slos=[slos] if isinstance(slos, str) else slos,
        slo_origin="slos",
        searches=_many(searches),
        target_rate=target_rate,
        max_concurrency=max_concurrency,
        max_replicas=max_replicas,
    )
    result = run_capacity(
        root,
        inputs.base,
        inputs.slos,
        inputs.specs,
        **_selection(requests_file, date_from, date_to, models, tenants, where),
        summary_only=summary_only,
        quiet=not progress,
        intervals=intervals,
    )
    answers = {}
    for s in result.searches:
        brief = s.brief()
        answers[s.spec.kind] = SearchAnswer(
            kind=s.spec.kind,
            knob=brief["knob"],
            answer=brief["answer"],
            interval=tuple(brief["interval"]) if brief["interval"] else None,
            safe=brief["safe"],
            note=brief["note"],
            num_probes=len(s.probes),
        )
    return CapacityAnswer(
        run_id=result.run_id,
        warehouse=root,
        base=result.base.to_dict(),
        base_rate=result.base_rate,
        slos=[str(s) for s in result.slos],
        searches=answers,
        num_replays=result.num_replays,
        wall_s=result.wall_s,
        result=result,
    )


def query(
    sql: str | None = None,
    *,
    file: PathLike | None = None,
    params: Mapping[str, Any] | None = None,
    warehouse: PathLike | None = None,
    config: PathLike | None = None,
) -> pl.DataFrame:
    """A read-only SQL query against the warehouse views (``tracereplay sql``).

    Args:
        sql: the SQL (one or more statements; the last one's rows are returned).
        file: instead of ``sql``, a SQL file, or a query of ``sql/`` by its name
            (``"throughput"`` runs sql/throughput.sql).
        params: the query's parameters (DuckDB variables, read with getvariable);
            a query file takes those its header declares, the rest take their defaults.
        warehouse, config: as for ``replay``.

    Returns:
        The last statement's rows (none for a statement such as SET VARIABLE).

    Raises:
        QueryError: bad SQL, a statement that would write, an unknown parameter.
        UnknownQueryError: no such query file or name.
    """
    from pipeline.report.sql import connect_views, read_query_source, run_sql

    if (sql is None) == (file is None):
        raise ConfigError("query: give the SQL or a query file (file=...), one of them")
    if sql is not None:
        text, origin = sql, "inline SQL"
    else:
        text, origin = read_query_source(str(file))
    root = _warehouse(warehouse, _config(config))
    con = connect_views(root)
    try:
        df = run_sql(con, text, origin, dict(params or {}))
    finally:
        con.close()
    return df if df is not None else pl.DataFrame()


_ORDER = {
    "sim_requests": "arrival_s, request_id",
    "sim_steps": "replica, step",
    "capacity_search": "search, probe, slo",
}


def _run_rows(root: Path, view: str, run_id: str, scenario: str | None = None) -> pl.DataFrame:
    """One run's rows (of one scenario) of a view."""
    where = "run_id = getvariable('run_id')"
    params = {"run_id": run_id}
    if scenario is not None:
        where += " AND scenario = getvariable('scenario')"
        params["scenario"] = scenario
    return query(
        f"SELECT * FROM {view} WHERE {where} ORDER BY {_ORDER[view]}",
        params=params,
        warehouse=root,
    )


def _config(path: PathLike | None) -> Config:
    return load_config(Path(path) if path is not None else None)


def _warehouse(flag: PathLike | None, cfg: Config) -> Path:
    return warehouse_path(str(flag) if flag is not None else None, cfg)


def _many(items: Any) -> list[Any]:
    """None, one item (a string or path counts as one) or an iterable, as a list."""
    if items is None:
        return []
    if isinstance(items, str | Path | Mapping):
        return [items]
    return list(items)


def _moment(value: Moment | None, name: str) -> Any:
    """A date_from / date_to argument as the --from / --to flags read it."""
    import click

    from pipeline.cli.options import Moment as Read
    from pipeline.cli.options import MomentType

    if value is None:
        return None
    if isinstance(value, datetime):
        at = value if value.tzinfo else value.replace(tzinfo=UTC)
        return Read(at, True)
    if isinstance(value, date):
        return Read(datetime(value.year, value.month, value.day, tzinfo=UTC), False)
    try:
        return MomentType().convert(value, None, None)
    except click.BadParameter as exc:
        raise ConfigError(f"{name}: {exc.message}") from None


def _selection(
    requests_file: PathLike | None,
    date_from: Moment | None,
    date_to: Moment | None,
    models: str | Sequence[str],
    tenants: str | Sequence[str],
    where: str | None,
) -> dict[str, Any]:
    """Which requests, as the library functions take them (the --requests, --from, --to,
    --model, --tenant and --where flags' ``Requests``)."""
    from pipeline.cli.options import Requests

    file = Path(requests_file) if requests_file is not None else None
    if file is not None and not file.is_file():
        raise ConfigError(f"requests_file {file}: no such file; give a requests Parquet file")
    chosen = Requests(
        file,
        _moment(date_from, "date_from"),
        _moment(date_to, "date_to"),
        tuple(_many(models)),
        tuple(_many(tenants)),
        where,
    )
    return chosen.kwargs()
