"""Reports: where the SQL results meet the charts.

``build_report`` reads a report definition (``reports/<name>.toml``: sections,
their ``sql/*.sql`` queries and parameters, the chart function or table columns
of each item), runs every query read-only against the warehouse views, turns each
frame into a chart (``charts/``) or a table, and renders one self-contained
HTML file (``render.py``), optionally with a PNG per chart.

Every query aggregates in DuckDB, so the page carries at most a few thousand
points whatever the size of the run.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from pipeline import __version__
from pipeline.errors import ConfigError, PipelineError
from pipeline.pricing import prices_json
from pipeline.report.layout import Layout, build_layout

if TYPE_CHECKING:
    import polars as pl

    from pipeline.report import charts, render
    from pipeline.report.slos import ReportSlos
else:  # altair, jinja2, polars and numpy load when a report is built, not when
    # `tracereplay sql` runs (which imports pipeline.report.sql, hence this package)
    from pipeline.lazy import lazy_import

    charts = lazy_import("pipeline.report.charts")
    render = lazy_import("pipeline.report.render")
    pl = lazy_import("polars")
from pipeline.report.sql import load_query, query
from pipeline.warehouse import Warehouse

DEFAULT_REPORT = "review"

_SECTION_KEYS = {
    "id",
    "title",
    "how_to_read",
    "scope",
    "requires_view",
    "requires_param",
    "requires",
    "empty",
    "items",
}
_ITEM_KEYS = {
    "kind",
    "query",
    "params",
    "chart",
    "title",
    "options",
    "columns",
    "filter",
    "requires",
    "requires_param",
    "note",
    "empty",
    "max_rows",
    "intervals",
    "split_by",
}
# item key intervals: what adds intervals to the query's rows (computed where SQL cannot)
_INTERVALS = {"changes"}
_FORMATS = {"text", "int", "float", "duration", "pct", "time"}


@dataclass(frozen=True)
class Item:
    """One chart or table of a section."""

    kind: str  # chart | table
    query: str  # sql/<query>.sql
    title: str
    chart: str | None = None  # charts.CHARTS key (kind = chart)
    params: dict[str, Any] = field(default_factory=dict)  # beyond run_id / slo_ttft_s
    options: dict[str, Any] = field(default_factory=dict)  # ChartOptions.extra
    columns: tuple[tuple[str, str, str], ...] = ()  # (column, label, format) for tables
    filter: str | None = None  # keep rows where this column is true / not null
    # (query, column): no data unless that query (same parameters) has a non-zero value in
    # that column; spares running an expensive query whose answer is known to be empty
    requires: tuple[str, str] | None = None
    note: str | None = None
    empty: str = "No data."
    max_rows: int = 200
    requires_param: str | None = None  # no data (and no query) unless this parameter is given
    # "changes": the compare_runs rows get each change's 90% interval (report/changes.py)
    intervals: str | None = None
    # a table: one table per value of this column (in the query's order), titled with it
    split_by: str | None = None


@dataclass(frozen=True)
class Section:
    """A titled part of the report with its one-line 'how to read this'."""

    id: str
    title: str
    how_to_read: str
    scope: str  # trace | run
    items: tuple[Item, ...]
    empty: str = "No data."
    requires_view: str | None = None
    # a report parameter (compare_run_id) without which the section is left out
    requires_param: str | None = None
    # (query, column): the section is left out unless that query, for the run, has a
    # non-zero value in that column (the pools section: only for a run with fleets)
    requires: tuple[str, str] | None = None


@dataclass(frozen=True)
class ReportDefinition:
    name: str
    title: str
    template: str
    sections: tuple[Section, ...]


def load_definition(name: str = DEFAULT_REPORT) -> ReportDefinition:
    """Read and check ``reports/<name>.toml``.

    Raises:
        ConfigError: unknown report, key, chart, query, query parameter or format.
    """
    path = render.REPORTS_DIR / f"{name}.toml"
    if not path.exists():
        known = sorted(p.stem for p in render.REPORTS_DIR.glob("*.toml"))
        raise ConfigError(f"no report {name!r} in reports/; available: {', '.join(known)}")
    where = f"reports/{path.name}"
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from exc
    sections = []
    for i, sec in enumerate(data.get("sections", [])):
        at = f"{where}: sections[{i}]"
        _known_keys(sec, _SECTION_KEYS, at)
        items = tuple(_item(it, f"{at}.items[{j}]") for j, it in enumerate(sec.get("items", [])))
        if sec.get("scope", "run") not in ("trace", "run"):
            raise ConfigError(f"{at}.scope must be 'trace' or 'run'")
        sections.append(
            Section(
                id=sec["id"],
                title=sec["title"],
                how_to_read=sec["how_to_read"],
                scope=sec.get("scope", "run"),
                items=items,
                empty=sec.get("empty", "No data."),
                requires_view=sec.get("requires_view"),
                requires_param=sec.get("requires_param"),
                requires=_requires(sec.get("requires"), at),
            )
        )
    return ReportDefinition(
        name=name,
        title=data.get("title", "tracereplay report"),
        template=data.get("template", f"{name}.html.j2"),
        sections=tuple(sections),
    )


def _known_keys(table: dict[str, Any], known: set[str], at: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{at}: unknown key {unknown[0]}; known: {', '.join(sorted(known))}")


def _item(it: dict[str, Any], at: str) -> Item:
    _known_keys(it, _ITEM_KEYS, at)
    kind = it.get("kind")
    if kind not in ("chart", "table"):
        raise ConfigError(f"{at}.kind must be 'chart' or 'table'")
    q = load_query(it["query"])
    params = dict(it.get("params", {}))
    for p in params:
        if p not in q.params:
            raise ConfigError(f"{at}: query {q.name} has no parameter {p}")
    if kind == "chart" and it.get("chart") not in charts.CHARTS:
        raise ConfigError(
            f"{at}: unknown chart {it.get('chart')!r}; known: {', '.join(sorted(charts.CHARTS))}"
        )
    columns = tuple(tuple(c) for c in it.get("columns", ()))
    for c in columns:
        if len(c) != 3 or c[2] not in _FORMATS:
            raise ConfigError(f"{at}: column {c!r} must be [name, label, format in {_FORMATS}]")
    if kind == "table" and not columns:
        raise ConfigError(f"{at}: a table needs columns")
    if it.get("intervals") is not None and it["intervals"] not in _INTERVALS:
        raise ConfigError(f"{at}: intervals must be one of {', '.join(sorted(_INTERVALS))}")
    return Item(
        kind=kind,
        query=q.name,
        title=it.get("title", q.purpose),
        chart=it.get("chart"),
        params=params,
        options=dict(it.get("options", {})),
        columns=columns,  # type: ignore[arg-type]
        filter=it.get("filter"),
        requires=_requires(it.get("requires"), at),
        note=it.get("note"),
        empty=it.get("empty", "No data."),
        max_rows=int(it.get("max_rows", 200)),
        requires_param=it.get("requires_param"),
        intervals=it.get("intervals"),
        split_by=it.get("split_by"),
    )


def _requires(value: Any, at: str) -> tuple[str, str] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2):
        raise ConfigError(f"{at}.requires must be [query, column]")
    load_query(value[0])
    return (str(value[0]), str(value[1]))


def default_output(warehouse: Warehouse, run_id: str | None, report: str = DEFAULT_REPORT) -> Path:
    """Where a report goes unless told: ``<warehouse>/reports/<run id>/<report>.html``."""
    return warehouse.root / "reports" / (run_id or "trace") / f"{report}.html"


def png_dir(output: Path) -> Path:
    """The folder that holds the PNGs of the report at ``output``."""
    return output.with_name(f"{output.stem}_png")


class _Queries:
    """Runs each (query, parameters) once per report."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.cache: dict[tuple[str, str], pl.DataFrame] = {}

    def __call__(self, name: str, **params: Any) -> pl.DataFrame:
        return self.cache[self._run(name, params)]

    def _run(self, name: str, params: dict[str, Any]) -> tuple[str, str]:
        declared = load_query(name).params
        given = {k: v for k, v in params.items() if k in declared and v is not None}
        key = (name, json.dumps(given, sort_keys=True, default=str))
        if key not in self.cache:
            self.cache[key] = query(self.con, name, **given)
        return key

    def with_intervals(self, name: str, kind: str, **params: Any) -> pl.DataFrame:
        """The rows of ``name`` with the intervals ``kind`` adds (item key ``intervals``)."""
        from pipeline.report.changes import with_intervals

        key = self._run(name, params)
        with_key = (f"{name} with {kind}", key[1])
        if with_key not in self.cache:
            self.cache[with_key] = with_intervals(self.con, self.cache[key])
        return self.cache[with_key]


def build_report(
    warehouse: Warehouse,
    run_id: str | None = None,
    *,
    output: Path | None = None,
    png: bool = False,
    slo_ttft_s: float | None = None,
    report: str = DEFAULT_REPORT,
    compare: str | None = None,
    gpu_prices: dict[str, float] | None = None,
    slos: list[str] | None = None,
    pair_by: str = "name",
    pairs: list[tuple[str, str]] | None = None,
) -> Path:
    """Write one self-contained HTML report of a replay run (and its trace).

    Args:
        warehouse: the warehouse to read (read-only).
        run_id: the replay run; None takes the latest. A warehouse without any
            replay run still gets a report: the trace overview, the other
            sections saying there is no data.
        output: the HTML file to write; default ``default_output(...)``.
        png: also write one PNG per chart into ``png_dir(output)``.
        slo_ttft_s: deprecated: an unscoped p99 TTFT SLO in seconds, as ``slos`` would
            give it (not with ``slos``).
        report: which ``reports/<report>.toml`` to build.
        compare: a second run to draw beside this one (the comparison section).
        pair_by, pairs: how the two runs' scenarios pair, as for ``compare``
            (``pipeline.compare.pair_scenarios``).
        gpu_prices: dollars per GPU-hour per GPU kind (``pipeline.pricing``): the costs.
        slos: the SLOs the report judges by (the header, the rules on the charts,
            goodput, the sweep charts, the per-class tables), as ``capacity`` writes them
            (``ttft_p99<=200ms``, ``ttft_p99@tenant=chat<=500ms``); None: the run's own
            (``sweep``/``capacity --slo``, nightly [slo]); without any, the report says so
            and uses p99 TTFT <= 200 ms as an example, named as one (``report/slos.py``).

    Returns:
        The path of the HTML file.

    Raises:
        PipelineError: no warehouse, an unknown run id, a bad report definition,
            or a query that failed.
    """
    if not warehouse.root.is_dir():
        raise PipelineError(
            f"no warehouse at {warehouse.root}: run `tracereplay ingest` first or pass --warehouse"
        )
    definition = load_definition(report)
    con = warehouse.connect()
    try:
        run = _Queries(con)
        runs = run("replay_runs")
        if run_id is None:
            run_id = runs["run_id"][0] if runs.height else None
        elif run_id not in runs["run_id"].to_list():
            known = ", ".join(runs["run_id"].head(5).to_list()) or "none"
            raise PipelineError(f"no replay run {run_id!r} in the warehouse; latest: {known}")
        run_row = runs.filter(pl.col("run_id") == run_id).to_dicts()[0] if run_id else {}
        if compare is not None and compare not in runs["run_id"].to_list():
            known = ", ".join(runs["run_id"].head(5).to_list()) or "none"
            raise PipelineError(f"--compare: no run {compare!r} in the warehouse; latest: {known}")
        from pipeline.report.slos import resolve as resolve_slos

        judged = resolve_slos(slos, run_row.get("slos"), slo_ttft_s)
        pairs_json = None
        if compare is not None and run_id is not None:
            from pipeline.compare import runs_pairing

            pairs_json = runs_pairing(con, run_id, compare, by=pair_by, pairs=pairs).pairs_json()
        given = {
            "compare_run_id": compare,
            "pairs_json": pairs_json,
            "prices_json": prices_json(gpu_prices or {}),
            "slos": json.dumps(judged.texts()),
        }

        # The trace is what the run replayed; when none of its requests are in the
        # warehouse (generated arrivals) or there is no run, the whole warehouse.
        # NOTE: a run that read every request of the warehouse (its runs row says so)
        # or replayed every one is the whole warehouse too, and the queries without the
        # run filter skip a semi-join over every sim_requests row (a second or more per
        # query at 1M requests x 5 scenarios).
        summary = run("trace_summary", run_id=None)
        trace_run = run_id
        if run_id and _read_whole_warehouse(run_row, summary["num_requests"][0], warehouse):
            trace_run = None
        elif run_id:
            of_run = run("trace_summary", run_id=run_id)
            if of_run["num_requests"][0] in (0, summary["num_requests"][0]):
                trace_run = None
            else:
                summary = of_run
        trace = _trace_facts(
            summary.to_dicts()[0],
            run("trace_sources", run_id=trace_run),
            scoped=trace_run is not None,
        )

        scenarios = run("run_scenarios", run_id=run_id) if run_id else pl.DataFrame()
        layout = _layout(scenarios)
        names = layout.scenarios
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}

        specs: dict[str, dict[str, Any]] = {}
        sections = []
        for section in definition.sections:
            if section.requires_param and given.get(section.requires_param) is None:
                continue
            if section.requires and (
                run_id is None
                or not _any_nonzero(
                    run(section.requires[0], run_id=run_id, **given), section.requires[1]
                )
            ):
                continue
            no_data = None
            if section.requires_view and section.requires_view not in views:
                no_data = section.empty
            elif section.scope == "run" and run_id is None:
                no_data = section.empty
            elif section.scope == "trace" and summary["num_requests"][0] == 0:
                no_data = section.empty
            items = []
            for k, item in enumerate(section.items if no_data is None else ()):
                scope = {"run_id": trace_run if section.scope == "trace" else run_id, **given}
                needed = item.requires
                if item.requires_param and scope.get(item.requires_param) is None:
                    df = pl.DataFrame()
                elif needed and not _any_nonzero(run(needed[0], **scope), needed[1]):
                    df = pl.DataFrame()
                elif item.intervals:
                    df = run.with_intervals(item.query, item.intervals, **scope, **item.params)
                else:
                    df = run(item.query, **scope, **item.params)
                items.append(
                    _render_item(
                        item,
                        judged,
                        df,
                        f"chart-{section.id}-{k + 1}",
                        specs,
                        charts.ChartOptions(
                            title=item.title,
                            scenarios=names,
                            slos=judged,
                            extra=item.options,
                            layout=layout,
                        ),
                    )
                )
            sections.append(
                {
                    "id": section.id,
                    "title": section.title,
                    "how_to_read": _with_slos(section.how_to_read, judged),
                    "no_data": no_data,
                    "items": items,
                }
            )
    finally:
        con.close()

    html = render.render_page(
        definition.template,
        {
            "title": definition.title,
            "run_id": run_id,
            "compare_run_id": compare,
            "gpu_prices": ", ".join(f"{k} ${v:g}" for k, v in sorted((gpu_prices or {}).items())),
            "run_started": _when(run_row.get("started_at")),
            "run_version": run_row.get("version"),
            "version": __version__,
            "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "slos_text": judged.describe(),
            "slos_example": judged.is_example,
            "goodput_basis": judged.goodput_basis(),
            "trace": trace,
            "scenarios": [_scenario_row(r) for r in _natural_rows(scenarios)] if run_id else [],
            "scenario_names": list(names),
            "layout_note": _layout_note(layout),
            "sections": sections,
            "specs_json": render.script_json(specs),
        },
    )
    output = output or default_output(warehouse, run_id, report)
    render.write_atomic(output, html)
    if png:
        render.write_pngs(specs, png_dir(output))
    return output


def _with_slos(text: str | None, judged: ReportSlos) -> str | None:
    """A definition's note or how-to-read with ``{slos}`` replaced by what goodput and the
    sweep charts judge (the report's SLOs, or the example, named as one)."""
    if text is None or "{slos}" not in text:
        return text
    return text.replace("{slos}", judged.goodput_basis())


def _render_item(
    item: Item,
    judged: ReportSlos,
    df: pl.DataFrame,
    element_id: str,
    specs: dict[str, dict[str, Any]],
    opts: charts.ChartOptions,
) -> dict[str, Any]:
    if item.filter and item.filter in df.columns:
        col = pl.col(item.filter)
        df = df.filter(col if df.schema[item.filter] == pl.Boolean else col.is_not_null())
    out: dict[str, Any] = {
        "kind": item.kind,
        "title": item.title,
        "note": _with_slos(item.note, judged),
        "no_data": None,
        "chart": item.chart,
        "element_id": element_id,
    }
    if df.is_empty():
        out["no_data"] = item.empty
        return out
    if item.kind == "chart":
        assert item.chart is not None
        specs[element_id] = charts.spec(item.chart, df, opts)
        return out
    out["labels"] = [label for _, label, _ in item.columns]
    parts = (
        [(str(k[0]), g) for k, g in df.group_by(item.split_by, maintain_order=True)]
        if item.split_by and item.split_by in df.columns
        else [(None, df)]
    )
    out["tables"] = []
    for name, part in parts:
        shown = part.head(item.max_rows)
        rows = [[_cell(row.get(c), f) for c, _, f in item.columns] for row in shown.to_dicts()]
        out["tables"].append({"name": name, "rows": rows, "more": part.height - shown.height})
    return out


def _cell(value: Any, kind: str) -> dict[str, Any]:
    """A table cell: its text, whether it is a number, and whether it is a long text (which
    gets room of its own rather than a word per line in a wide table)."""
    text, numeric = render.fmt(value, kind)
    return {"text": text, "numeric": numeric, "long": not numeric and len(text) > 60}


def _read_whole_warehouse(run_row: dict[str, Any], num_requests: int, warehouse: Warehouse) -> bool:
    """Whether the run read every request of the warehouse: as many rows as it holds, from
    its own requests files (a ``--requests`` file elsewhere may hold other requests)."""
    if not num_requests or run_row.get("rows_read") != num_requests:
        return False
    try:
        inputs = json.loads(run_row.get("inputs") or "[]")
    except json.JSONDecodeError:
        return False
    tables = warehouse.root / "requests"
    # by the path inside the warehouse, so that a moved warehouse still matches
    return bool(inputs) and all(
        isinstance(f, str)
        and Path(f).parent.parent.name == "requests"
        and (tables / Path(f).parent.name / Path(f).name).is_file()
        for f in inputs
    )


def _any_nonzero(df: pl.DataFrame, column: str) -> bool:
    if column not in df.columns:
        return False
    return bool((df[column].fill_null(0).cast(pl.Float64) != 0).any())


def _when(value: Any) -> str | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return None


def _trace_facts(summary: dict[str, Any], sources: pl.DataFrame, *, scoped: bool) -> dict[str, str]:
    n = summary["num_requests"] or 0
    if n == 0:
        return {
            "description": "no requests in the warehouse",
            "date_range": "\u2014",
            "requests": "0",
        }
    files = sources["source_file"].to_list()
    shown = ", ".join(Path(f).name for f in files[:3]) + (
        f" and {len(files) - 3} more" if len(files) > 3 else ""
    )
    whose = "the requests this run replayed" if scoped else "every request in the warehouse"
    description = (
        f"{whose}, from {len(files)} log file{'s' if len(files) != 1 else ''} ({shown}); "
        f"formats: {summary['source_formats']}"
    )
    first, last = summary["first_arrival_time"], summary["last_arrival_time"]
    days = summary["num_days"]
    date_range = (
        f"{_when(first)} to {_when(last)} ({days} day{'s' if days != 1 else ''}, "
        f"{render.fmt(summary['duration_s'], 'float')[0]} s)"
    )
    requests = (
        f"{n:,} ({render.fmt(summary['mean_requests_per_s'], 'float')[0]} requests/s on average; "
        f"{_count(summary['num_models'], 'model', 'models')}, "
        f"{_count(summary['num_tenants'], 'tenant', 'tenants')}; prompt p50/p99 "
        f"{render.fmt(summary['p50_prompt_tokens'], 'float')[0]}/"
        f"{render.fmt(summary['p99_prompt_tokens'], 'float')[0]} tokens, output p50/p99 "
        f"{render.fmt(summary['p50_output_tokens'], 'float')[0]}/"
        f"{render.fmt(summary['p99_output_tokens'], 'float')[0]} tokens)"
    )
    return {"description": description, "date_range": date_range, "requests": requests}


def _layout(scenarios: pl.DataFrame) -> Layout:
    """Panels and colours of the run's scenarios, from their resolved configurations."""
    if scenarios.is_empty():
        return Layout()
    configs: dict[str, dict[str, Any]] = {}
    for r in scenarios.select("scenario", "config_json").to_dicts():
        try:
            cfg = json.loads(r["config_json"] or "{}")
        except json.JSONDecodeError:
            cfg = {}
        configs[r["scenario"]] = cfg if isinstance(cfg, dict) else {}
    policies = dict(zip(scenarios["scenario"], scenarios["policy"], strict=True))
    return build_layout(scenarios["scenario"].to_list(), configs, policies)


def _layout_note(layout: Layout) -> str | None:
    if not layout.faceted:
        return None
    others = [a for a in layout.axes if a != layout.facet_by]
    return (
        f"{len(layout.scenarios)} scenarios: charts with one line per scenario are drawn as "
        f"small multiples, one panel per {layout.facet_by}"
        + (f", one colour per {', '.join(others)}" if others else "")
        + "."
    )


def _natural_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    from pipeline.report.layout import natural_key

    return sorted(df.to_dicts(), key=lambda r: natural_key(r.get("scenario")))


def _count(n: int | None, one: str, many: str) -> str:
    """'1 model', '3 models', or 'no model recorded'."""
    if not n:
        return f"no {one} recorded"
    return f"{n:,} {one if n == 1 else many}"


def _scenario_row(r: dict[str, Any]) -> dict[str, Any]:
    def pretty(text: str | None) -> str:
        if not text:
            return ""
        try:
            return json.dumps(json.loads(text), indent=2)
        except json.JSONDecodeError:
            return text

    summary = pretty(r.get("summary_json"))
    return {
        **{
            k: ("\u2014" if r.get(k) in (None, "") else r[k])
            for k in (
                "scenario",
                "label",
                "policy",
                "replicas",
                "profile",
                "max_concurrency",
                "num_kv_blocks",
                "block_size",
            )
        },
        "num_requests": f"{r.get('num_requests') or 0:,}",
        "config": pretty(r.get("config_json")),
        "summary": "" if summary in ("", "{}") else summary,
    }


__all__ = ["build_report", "default_output", "load_definition", "png_dir"]
