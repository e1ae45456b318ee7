"""The nightly job: ``run_nightly`` is ``tracereplay nightly --config nightly.toml``.

The job a scheduler runs once a night over an inbox of log globs. Under the
warehouse lock it ingests only the inbox files that are new or changed
(``inbox.py``), replays the days they cover through the production scenarios,
runs the capacity searches against the SLOs, compares tonight's figures with the
last night's (``drift.py``), writes the report, keeps the last ``keep_nights``
nights, and writes ``<warehouse>/nightly/<night id>/manifest.json``. Exit codes:
``EXIT_OK``, ``EXIT_FAILED``, ``EXIT_DRIFT`` (see docs/nightly.md). The one-shot
job of ``tracereplay run`` is ``job.py``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.objectstore import display, is_remote
from pipeline.sim.replay import ReplayResult, replay
from pipeline.sim.scenario import Scenario, build_scenario

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DRIFT = 3
NIGHTS_DIR = "nightly"
DEFAULT_KEEP_NIGHTS = 14
MAX_KEEP_NIGHTS = 100_000
NIGHTLY_SECTIONS = {"nightly", "ingest", "replay", "scenario", "slo", "capacity", "drift"}
NIGHTLY_KEYS = {"warehouse", "inbox", "keep_nights", "report"}
INGEST_KEYS = {"format", "block_size", "hash_salt", "trace_start", "tokenizer"}
CAPACITY_KEYS = {"scenario", "summary_only", "search"}


@dataclass
class NightlyConfig:
    """A parsed nightly.toml (see docs/nightly.md); relative paths are from its folder."""

    path: Path
    inbox: list[str]
    scenarios: list[Scenario]
    slos: list[Any] = field(default_factory=list)  # pipeline.plan.slo.Slo
    capacity_base: dict[str, Any] | None = None  # the scenario the searches start from
    capacity_specs: list[Any] = field(default_factory=list)  # pipeline.plan.capacity.SearchSpec
    capacity_summary_only: bool = True
    thresholds: dict[str, float] = field(default_factory=dict)
    slo_headroom_pct: float | None = None  # [drift] slo_headroom_pct: least headroom, % of limit
    keep_nights: int = DEFAULT_KEEP_NIGHTS
    report: bool = True
    warehouse: Path | str | None = None  # a directory, or an s3:// URI
    ingest: IngestOptions = field(default_factory=IngestOptions)


def load_nightly_config(path: Path) -> NightlyConfig:
    """Read and check a nightly.toml; every key, scenario and SLO is validated here,
    before the job takes the lock: of the right type (a list of strings for the inbox,
    true/false for switches), numbers finite and in range (``pipeline.validation``).

    Raises:
        ConfigError, ScenarioError: naming the file and the key.
    """
    from pipeline import validation
    from pipeline.config import check_ingest_table, parse_trace_start
    from pipeline.drift import HEADROOM_KEY, headroom_margin, thresholds
    from pipeline.errors import ConfigError, PipelineError
    from pipeline.plan.capacity import parse_specs
    from pipeline.plan.slo import parse_slos
    from pipeline.sim.scenario import check_scenario_keys, read_scenario_file

    raw = validation.read_toml_file(path, "the nightly config")
    base_dir = Path(path).resolve().parent

    def table(name: str, known: set[str] | None = None) -> dict[str, Any]:
        value = raw.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {name} must be a table ([{name}])")
        if known is not None:
            bad = sorted(set(value) - known)
            if bad:
                raise ConfigError(
                    f"{path}: unknown key(s) {', '.join(f'{name}.{k}' for k in bad)}; "
                    f"known: {', '.join(sorted(known))}"
                )
        return value

    unknown = sorted(set(raw) - NIGHTLY_SECTIONS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown section(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(NIGHTLY_SECTIONS))}"
        )
    where = str(path)
    night = table("nightly", NIGHTLY_KEYS)
    if night.get("inbox") in (None, [], ""):
        raise ConfigError(
            f'{path}: nightly.inbox must list the log globs, e.g. inbox = ["logs/*.jsonl.gz"]'
        )
    inbox = validation.string_list(
        night["inbox"], "nightly.inbox", where, example='["logs/*.jsonl.gz"]'
    )
    keep = validation.integer(
        night.get("keep_nights", DEFAULT_KEEP_NIGHTS),
        "nightly.keep_nights",
        where,
        lo=1,
        hi=MAX_KEEP_NIGHTS,
    )
    report = validation.boolean(night.get("report", True), "nightly.report", where)
    warehouse = night.get("warehouse")
    if warehouse is not None:
        warehouse = validation.string(warehouse, "nightly.warehouse", where, nonempty=True)
    ing = table("ingest", INGEST_KEYS)
    check_ingest_table(ing, "ingest", where)
    if ing.get("format"):
        from pipeline.ingest.formats import FORMATS

        if ing["format"] not in FORMATS:
            raise ConfigError(
                f"{path}: unknown ingest.format {ing['format']!r}; allowed: "
                f"{', '.join(sorted(FORMATS))}"
            )

    replay_defaults = table("replay")
    try:
        check_scenario_keys(replay_defaults, f"{path} [replay]")
    except PipelineError as exc:
        raise ConfigError(str(exc)) from None
    defaults = {"drop_too_long": True, **replay_defaults}
    entries = raw.get("scenario", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{path}: give at least one production scenario as [[scenario]] "
            '(file = "prod.toml", or the scenario keys inline)'
        )
    scenario_values: list[dict[str, Any]] = []
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: scenario {i} must be a table ([[scenario]])")
        values = dict(entry)
        if "file" in values:
            file = Path(
                validation.string(values.pop("file"), f"scenario {i} file", where, nonempty=True)
            )
            file = file if file.is_absolute() else base_dir / file
            values = {**read_scenario_file(file), **values}
        scenario_values.append({**defaults, **values})
    scenarios = [
        build_scenario(v, where=f"{path} [[scenario]] {i}")
        for i, v in enumerate(scenario_values, 1)
    ]
    names = [sc.name for sc in scenarios]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: scenario names must differ, got {', '.join(names)}")

    slos = parse_slos(table("slo"), where=f"{path} [slo]")
    margin = headroom_margin(table("drift"), where=f"{path} [drift]")
    if margin is not None and not slos:
        raise ConfigError(f"{path}: [drift] {HEADROOM_KEY} needs the SLOs to watch: add [slo]")
    capacity_base = None
    specs: list[Any] = []
    summary_only = True
    if "capacity" in raw:
        cap = table("capacity", CAPACITY_KEYS)
        if not slos:
            raise ConfigError(f"{path}: [capacity] needs the SLOs to meet: add [slo]")
        which = validation.string(cap.get("scenario", names[0]), "capacity.scenario", where)
        if which not in names:
            raise ConfigError(
                f"{path}: capacity.scenario {which!r} is not a scenario; known: {', '.join(names)}"
            )
        capacity_base = scenario_values[names.index(which)]
        capacity_base.setdefault("name", which)
        specs = parse_specs(cap.get("search", {}), where=f"{path} [capacity.search]")
        summary_only = validation.boolean(
            cap.get("summary_only", True), "capacity.summary_only", where
        )

    opts = IngestOptions(
        format=ing.get("format") or None,
        block_size=ing.get("block_size"),
        hash_salt=ing.get("hash_salt", ""),
        tokenizer=Path(ing["tokenizer"]) if ing.get("tokenizer") else None,
    )
    if ing.get("trace_start"):
        opts.trace_start = parse_trace_start(ing["trace_start"], "ingest.trace_start", where)
    return NightlyConfig(
        path=Path(path),
        inbox=[
            str(g) if os.path.isabs(str(g)) or is_remote(g) else str(base_dir / str(g))
            for g in inbox
        ],
        scenarios=scenarios,
        slos=slos,
        capacity_base=capacity_base,
        capacity_specs=specs,
        capacity_summary_only=summary_only,
        thresholds=thresholds(table("drift"), where=f"{path} [drift]"),
        slo_headroom_pct=margin,
        keep_nights=keep,
        report=report,
        warehouse=(warehouse if is_remote(warehouse) else base_dir / warehouse)
        if warehouse
        else None,
        ingest=opts,
    )


@dataclass
class NightResult:
    """What one night did; ``manifest`` is what was written to disk."""

    night_id: str
    exit_code: int
    manifest_path: Path
    manifest: dict[str, Any]


def nights(warehouse: Path) -> list[Path]:
    """The manifests of the nights kept, oldest first.

    By the manifest's ``started_at`` (microseconds), then the id: night ids sort by start
    time only to the second, and two nights can start within one.
    """
    return sorted((warehouse / NIGHTS_DIR).glob("*/manifest.json"), key=_started)


def _started(manifest: Path) -> tuple[str, str]:
    try:
        started = str(json.loads(manifest.read_text()).get("started_at", ""))
    except (OSError, ValueError, AttributeError):
        started = ""
    return (started, manifest.parent.name)


def _previous_figures(warehouse: Path) -> tuple[str | None, dict[str, float | None]]:
    """The figures of the last night that measured any, and its id."""
    import json

    for path in reversed(nights(warehouse)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("figures"):
            return str(data["night_id"]), dict(data["figures"])
    return None, {}


def _figures(
    warehouse: Path, days: list[str], replayed: ReplayResult | None, capacity: Any
) -> dict[str, float | None]:
    """Tonight's figures (see ``pipeline.drift``)."""
    from pipeline.drift import slo_figure
    from pipeline.report.sql import query
    from pipeline.warehouse import Warehouse

    def num(x: Any) -> float | None:
        return None if x is None or x != x else float(x)  # NaN -> None

    con = Warehouse(warehouse).connect()
    try:
        traffic = query(
            con,
            "nightly_traffic",
            date_from=date.fromisoformat(days[0]),
            date_to=date.fromisoformat(days[-1]),
        ).row(0, named=True)
    finally:
        con.close()
    out: dict[str, float | None] = {
        "traffic.requests_per_day": num(traffic["requests_per_day"]),
        "traffic.mean_prompt_tokens": num(traffic["mean_prompt_tokens"]),
        "traffic.mean_output_tokens": num(traffic["mean_output_tokens"]),
    }
    observed = {
        "ttft": num(traffic["observed_ttft_p99_s"]),
        "tpot": num(traffic["observed_tpot_p99_s"]),
    }
    for run in replayed.runs if replayed else []:
        name = run.scenario.name
        for metric in ("ttft", "tpot"):
            sim = num(run.summary.get(f"{metric}_p99_s"))
            out[f"{metric}_p99.{name}"] = sim
            obs = observed[metric]
            if sim is not None and obs:
                out[f"sim_vs_observed.{metric}.{name}"] = sim / obs
        for key, verdict in (run.summary.get("slo") or {}).items():
            out[slo_figure(name, key)] = num(verdict["measured_s"])
        for pool, entry in (run.summary.get("pools") or {}).items():  # a fleet's pools
            for key, verdict in (entry.get("slo") or {}).items():
                out[slo_figure(name, key, pool)] = num(verdict["measured_s"])
    for search in capacity.searches if capacity else []:
        out[f"capacity.{capacity.base.name}.{search.spec.kind}"] = num(search.answer)
    return out


def _forget_night(warehouse: Path, manifest: Path) -> None:
    """Remove a night: its runs (runs row first, so they vanish whole), reports and folder."""
    import json
    import shutil

    from pipeline.contracts import CONTRACTS

    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        data = {}
    for run_id in (data.get("replay_run_id"), data.get("capacity_run_id")):
        if not run_id:
            continue
        (warehouse / "runs" / f"{run_id}.parquet").unlink(missing_ok=True)
        for contract in CONTRACTS.values():
            if "run_id" in contract.partition_by:
                shutil.rmtree(warehouse / contract.name / f"run_id={run_id}", ignore_errors=True)
        shutil.rmtree(warehouse / "reports" / run_id, ignore_errors=True)
    shutil.rmtree(manifest.parent, ignore_errors=True)


def run_nightly(
    cfg: NightlyConfig,
    warehouse: Path,
    *,
    lock_timeout_s: float | None = None,
    quiet: bool = True,
    log: Any = None,
) -> NightResult:
    """One night: ingest what is new, replay, search capacity, compare, report, keep N nights.

    Args:
        cfg: the parsed nightly.toml.
        warehouse: the warehouse directory.
        lock_timeout_s: how long to wait for the warehouse lock (default 10 min).
        quiet: no progress bars.
        log: called with one line per step (default: nothing).

    A full disk, a read-only mount or a missing permission ends the night as failed
    with its one-line error (``pipeline.storage``): what the night wrote unfinished is
    removed, and the manifest records the failure where its directory can be written.

    Raises:
        LockTimeoutError: another command held the warehouse for too long.
        StorageError: the night failed and not even its manifest could be written (the
            line says why), or the warehouse could not be locked and no manifest written.
    """
    import time
    from contextlib import ExitStack
    from datetime import UTC, datetime

    from pipeline import __version__
    from pipeline.drift import compare, headrooms
    from pipeline.errors import PipelineError
    from pipeline.inbox import expand, load_manifest, name, new_or_changed, save_manifest
    from pipeline.lock import DEFAULT_TIMEOUT_S, warehouse_lock
    from pipeline.plan.capacity import run_capacity
    from pipeline.storage import StorageError, storage_error
    from pipeline.warehouse import Warehouse, new_run_id

    say = log or (lambda line: None)
    timeout = DEFAULT_TIMEOUT_S if lock_timeout_s is None else lock_timeout_s

    def begin() -> dict[str, Any]:
        started = datetime.now(UTC)
        return {
            "night_id": new_run_id(started),
            "started_at": started.isoformat(),
            "config": str(cfg.path),
            "warehouse": display(Path(warehouse).resolve()),
            "version": __version__,
            "status": "running",
            "errors": [],
        }

    with ExitStack() as stack:
        t0 = time.perf_counter()
        try:
            stack.enter_context(warehouse_lock(warehouse, timeout_s=timeout))
        except StorageError as exc:  # e.g. a read-only warehouse: record the night if we can
            m = begin()
            m["errors"].append(str(exc))
            m["status"] = "failed"
            path = _finish_manifest(Path(warehouse), m, EXIT_FAILED, t0)
            return NightResult(m["night_id"], EXIT_FAILED, path, m)
        t0 = time.perf_counter()
        m = begin()
        night_id = m["night_id"]
        errors: list[str] = m["errors"]
        replayed = capacity = None
        refused = False
        try:
            files = expand(cfg.inbox)
            seen = load_manifest(Path(warehouse))
            todo, skipped = new_or_changed(files, seen)
            m["inbox"] = {
                "matched": len(files),
                "skipped_unchanged": skipped,
                "new_or_changed": [
                    {"path": name(f.path), "sha256": f.sha256, "bytes": f.size} for f in todo
                ],
            }
            say(f"inbox: {len(files)} file(s), {len(todo)} new or changed, {skipped} unchanged")
            days: list[str] = []
            if todo:
                cfg.ingest.quiet = quiet
                ingested = ingest_logs(
                    [str(f.path) for f in todo], Warehouse(warehouse), cfg.ingest
                )
                m["ingest"] = ingested.to_dict()
                by_path = {
                    r.path if is_remote(r.path) else str(Path(r.path).resolve()): r
                    for r in ingested.files
                }
                for f in todo:
                    r = by_path.get(name(f.path))
                    if r is not None and r.error is None:
                        seen[name(f.path)] = f.sha256
                    elif r is not None:
                        errors.append(f"ingest: {r.error}")
                days = sorted({d for r in ingested.files if r.error is None for d in r.dates})
                say(
                    f"ingest: {ingested.total('rows_kept'):,} kept, "
                    f"{ingested.total('rows_quarantined'):,} quarantined, "
                    f"{ingested.total('rows_duplicate'):,} duplicates; days {', '.join(days)}"
                )
            m["days"] = days
            if days:
                d0, d1 = date.fromisoformat(days[0]), date.fromisoformat(days[-1])
                replayed = replay(
                    warehouse,
                    cfg.scenarios,
                    date_from=d0,
                    date_to=d1,
                    quiet=quiet,
                    slos=list(cfg.slos),
                )
                m["replay_run_id"] = replayed.run_id
                m["scenarios"] = {r.scenario.name: r.summary for r in replayed.runs}
                say(f"replay: run {replayed.run_id}, {len(replayed.runs)} scenario(s)")
                if cfg.capacity_base is not None:
                    capacity = run_capacity(
                        warehouse,
                        dict(cfg.capacity_base),
                        list(cfg.slos),
                        list(cfg.capacity_specs),
                        date_from=d0,
                        date_to=d1,
                        summary_only=cfg.capacity_summary_only,
                        quiet=quiet,
                    )
                    m["capacity_run_id"] = capacity.run_id
                    m["capacity"] = {s.spec.kind: s.brief() for s in capacity.searches}
                    say(f"capacity: run {capacity.run_id}, {capacity.num_replays} replays")
                figures = _figures(Path(warehouse), days, replayed, capacity)
                prev_id, prev = _previous_figures(Path(warehouse))
                changes = compare(prev, figures, cfg.thresholds) if prev_id else []
                m["figures"] = figures
                m["previous_night"] = prev_id
                m["changes"] = [c.to_dict() for c in changes]
                m["drifts"] = [c.describe() for c in changes if c.drift]
                watched = [
                    (r.scenario.name, s.key, s.limit_s) for r in replayed.runs for s in cfg.slos
                ]
                pools = {r.scenario.name: list(r.summary.get("pools") or {}) for r in replayed.runs}
                heads = headrooms(prev, figures, watched, cfg.slo_headroom_pct, pools)
                m["slo_headroom"] = [h.to_dict() for h in heads]
                for h in heads:
                    say(f"slo: {h.describe()}")
                m["drifts"] += [f"slo headroom: {h.describe()}" for h in heads if h.below_margin]
                for line in m["drifts"]:
                    say(f"drift: {line}")
                if cfg.report:
                    from pipeline.report import build_report

                    slos = [str(s) for s in cfg.slos] or None  # its TTFT objective too
                    path = build_report(Warehouse(warehouse), replayed.run_id, slos=slos)
                    m["report"] = str(path)
                    say(f"report: {m['report']}")
            save_manifest(Path(warehouse), seen)
        except StorageError as exc:  # a full disk, a read-only mount, ...
            errors.append(str(exc))
            refused = True
        except PipelineError as exc:
            errors.append(str(exc))
        except OSError as exc:  # one raised here, outside the commands' own translation
            err = storage_error(exc)
            if err is None:
                raise
            errors.append(str(err))
            refused = True
        if refused:
            _remove_unfinished(Path(warehouse))  # and free the space it took
        if errors:
            m["status"], code = "failed", EXIT_FAILED
        elif m.get("drifts"):
            m["status"], code = "drift", EXIT_DRIFT
        else:
            m["status"], code = ("ok" if m.get("days") else "nothing new"), EXIT_OK
        path = _finish_manifest(Path(warehouse), m, code, t0)
        try:
            kept = nights(Path(warehouse))
            baseline, _ = _previous_figures(Path(warehouse))  # never drop the last measured
            for old in kept[: max(0, len(kept) - cfg.keep_nights)]:
                if old.parent.name == baseline:
                    continue
                _forget_night(Path(warehouse), old)
                say(f"retention: removed night {old.parent.name}")
        except OSError as exc:  # the night is recorded; older ones stay until next time
            err = storage_error(exc)
            if err is None:
                raise
            say(f"retention: {err}")
        return NightResult(night_id, code, path, m)


def _remove_unfinished(warehouse: Path) -> None:
    """After a refused write: remove the night's unfinished files (we hold the lock)."""
    from pipeline.warehouse import Warehouse

    try:
        Warehouse(warehouse).remove_stale()
    except OSError:
        pass


def _finish_manifest(warehouse: Path, m: dict[str, Any], code: int, t0: float) -> Path:
    """Complete the manifest ``m`` and write it atomically to
    ``<warehouse>/nightly/<night id>/manifest.json``.

    Raises:
        StorageError: it could not be written; the line gives the night's own error too.
    """
    import time
    from datetime import UTC, datetime

    from pipeline.storage import StorageError, storage_error, write_atomic

    m["exit_code"] = code
    m["finished_at"] = datetime.now(UTC).isoformat()
    m["wall_s"] = round(time.perf_counter() - t0, 3)
    night_dir = warehouse / NIGHTS_DIR / str(m["night_id"])
    path = night_dir / "manifest.json"
    try:
        write_atomic(path, json.dumps(m, indent=2, default=str) + "\n")
    except OSError as exc:
        landed = m.get("ingest") or m.get("replay_run_id")
        err = storage_error(
            exc,
            outcome="what the night ingested and replayed landed; its manifest did not"
            if landed and not m["errors"]
            else None,
        )
        if err is None:
            raise
        if night_dir.is_dir() and not any(night_dir.iterdir()):
            night_dir.rmdir()  # no empty night folder left behind
        if m["errors"]:
            raise StorageError(
                f"{m['errors'][-1]}; and no manifest could be written for night "
                f"{m['night_id']} ({err.path}: {err.reason})",
                err.path,
                err.errno,
                err.reason,
            ) from exc
        raise StorageError(
            f"no manifest could be written for night {m['night_id']}: {err}",
            err.path,
            err.errno,
            err.reason,
        ) from exc
    return path
