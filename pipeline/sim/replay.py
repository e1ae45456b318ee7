"""The replay stage: requests in, one simulated run per scenario out.

    requests (warehouse or one file) ──▶ arrivals + caps ──▶ fast loop ──▶
        sim_requests/run_id=<run>/<scenario>.parquet
        sim_steps/run_id=<run>/<scenario>.parquet
        scenarios/run_id=<run>/scenarios.parquet
        runs/<run>.parquet

Every scenario is validated, and its requests checked against its memory,
before the first one runs. Arrival times are relative to the earliest
selected request (``arrival_time``; ``arrival_s`` is per source file).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contracts import (
    REQUESTS,
    SCENARIOS,
    SIM_REQUESTS,
    SIM_STEPS,
    TableWriter,
    check_file,
    with_optional_columns,
)
from pipeline.errors import ConfigError, ScenarioError
from pipeline.jit import compile_notice
from pipeline.lock import with_warehouse_lock
from pipeline.progress import progress
from pipeline.runs import write_run_row
from pipeline.selection import RequestFilter, check_request_columns
from pipeline.sim import uncertainty
from pipeline.sim.arrivals import make_arrivals
from pipeline.sim.prefix import build_keys, describe
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate, warm_up
from pipeline.sim.state import (
    C_NUM_BLOCKS,
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CACHED,
    R_CHUNKS,
    R_OUTPUT,
    R_PREEMPT,
    R_PROMPT,
    R_QDEPTH,
    R_REPLICA,
    S_DECODE,
    S_KV_USED,
    S_NUM_STEPS,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_PREFILL,
    S_REPLICA,
    S_RUNNING,
    S_STEP,
    S_WAITING,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    SF_START,
    EngineConfig,
    PrefixKeys,
    SimInput,
    SimResult,
)
from pipeline.sim.summary import StepTotals, request_metrics, summarize
from pipeline.sim.trace_prefix import trace_prefix_facts
from pipeline.warehouse import Warehouse, iter_partitions, new_run_id

# rows per chunk of the step timeline, and per row group of sim_requests, while a
# scenario's results are written: what they cost in memory at once, whatever the
# number of requests (131,072 step rows: 14 MB of loop arrays; about DuckDB's own
# row group size, 122,880)
CHUNK_ROWS = 1 << 17

REQUEST_COLUMNS = [
    "request_id",
    "arrival_time",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "block_size",
    "prefix_hashes",
    "output_hashes",
    "priority",
    "tenant",
    "cached_tokens",
    "model",
]


@dataclass
class ScenarioRun:
    """The outcome of one scenario."""

    scenario: Scenario
    summary: dict[str, Any]
    num_dropped: int  # requests left out (drop_too_long)
    sim_s: float  # wall seconds in the replay loop
    paths: dict[str, Path] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """What ``replay`` wrote."""

    run_id: str
    num_requests_read: int
    inputs: list[str]
    runs: list[ScenarioRun]


@dataclass
class Prepared:
    """One scenario's requests, ready for the loop."""

    inp: SimInput
    request_ids: pa.Array
    num_dropped: int
    num_warmup: int = 0  # leading requests that warmed the caches instead of running
    prefix_info: dict[str, Any] = field(default_factory=dict)  # block-size bridging facts
    # per replayed request: tenant and model (object arrays), for SLOs with a scope
    groups: dict[str, Any] = field(default_factory=dict)


def select_request_files(
    wh: Warehouse,
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
) -> list[Path]:
    """The requests files to replay: one given file, or the warehouse's in a date range."""
    if requests_file is not None:
        # any Parquet with the requests columns (e.g. from `tracereplay sql --format parquet`)
        check_request_columns(Path(requests_file))
        return [Path(requests_file)]
    files = []
    days: set[str] = set()
    for values, path in iter_partitions(wh.good_files(REQUESTS)):
        day = values.get("date", "")
        days.add(day)
        if date_from is not None and day < date_from.isoformat():
            continue
        if date_to is not None and day > date_to.isoformat():
            continue
        files.append(path)
    if not files:
        where = (
            f" between {date_from or '...'} and {date_to or '...'}" if date_from or date_to else ""
        )
        held = sorted(d for d in days if d)
        if held:
            shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
            raise ConfigError(f"no requests in warehouse {wh.root}{where}; it holds days {shown}")
        raise ConfigError(
            f"no requests in warehouse {wh.root}{where}; run `tracereplay ingest` first or "
            "pass --requests FILE"
        )
    for path in files:
        check_file(path, REQUESTS)
    return files


def read_requests(files: list[Path], selection: RequestFilter | None = None) -> pl.DataFrame:
    """The requests of ``files``, sorted by arrival (ties by request id), with arrival_s.

    ``selection`` keeps some of them (models, tenants, a predicate, a time window).
    ``arrival_s`` is recomputed here: seconds from the earliest selected request.
    """
    if selection is not None and selection.active:
        table = with_optional_columns(selection.read(files), REQUESTS)
        source = pl.from_arrow(table).lazy()  # type: ignore[union-attr]
    else:
        source = _scan(files)
    frame = source.select(REQUEST_COLUMNS).collect()
    if frame.height == 0:
        raise ConfigError("the selected requests files hold no requests")
    us = frame["arrival_time"].dt.epoch("us").to_numpy()
    if not _in_order(us, frame["request_id"]):  # files written in arrival order skip the sort
        order = frame.select(pl.arg_sort_by("arrival_time", "request_id")).to_series()
        frame = frame[order]
        us = us[order.to_numpy()]
    seconds = (us - us[0]).astype(np.float64, copy=False)
    seconds /= 1e6  # in place: one array of 8 bytes a request, not three
    return frame.with_columns(pl.Series("arrival_s", seconds))


def _scan(files: list[Path]) -> pl.LazyFrame:
    """One lazy scan of ``files``, in order; a file written before an optional column
    was added (``contracts.REQUESTS.optional``) gives it as nulls."""
    schemas = [set(pq.read_schema(p).names) for p in files]
    if all(REQUESTS.optional <= names for names in schemas):
        return pl.scan_parquet([str(p) for p in files], hive_partitioning=False)
    types = dict(REQUESTS.columns)
    scans = []
    for path, names in zip(files, schemas, strict=True):
        scan = pl.scan_parquet(str(path), hive_partitioning=False)
        lacking = [c for c in sorted(REQUESTS.optional) if c not in names]
        nulls = [
            pl.lit(None, dtype=pl.Series(c, pa.array([], types[c])).dtype).alias(c) for c in lacking
        ]
        scans.append(scan.with_columns(nulls).select(REQUEST_COLUMNS))
    return pl.concat(scans, how="vertical")


def _in_order(us: npt.NDArray[np.int64], request_id: pl.Series) -> bool:
    """Whether rows are sorted by (arrival, request id) already; linear, unlike a sort."""
    step = np.diff(us)
    if not (step >= 0).all():
        return False
    ties = np.flatnonzero(step == 0)
    return bool((request_id.gather(ties) <= request_id.gather(ties + 1)).all())


def prepare(frame: pl.DataFrame, scenario: Scenario, *, with_groups: bool = True) -> Prepared:
    """Arrivals, length caps, memory checks, prefix keys and priorities of one scenario.

    With ``prefix_warmup_requests`` = N, the first N requests (in arrival order,
    after the caps) are not replayed: their prompts fill every replica's prefix
    cache first, and the replay starts at the arrival of the next one (time 0).
    ``with_groups``: also the tenant and model of each request (for SLOs with a
    scope; an object array per column, so left out where no SLO is judged).

    When every row of the frame is replayed in its order (trace arrivals, no
    length dropped), nothing is gathered: the columns are used as they are.

    Raises:
        ScenarioError: see ``Scenario.cap_lengths`` and ``arrivals.make_arrivals``;
            a warm-up that leaves nothing to replay.
    """
    rng = np.random.default_rng(scenario.seed)
    idx, arrival = make_arrivals(scenario.arrivals, frame["arrival_s"].to_numpy(), rng)
    whole = _is_whole(idx, frame.height)  # idx is every row, in order

    def column(name: str) -> npt.NDArray[Any]:
        values = frame[name].fill_null(0).to_numpy()
        return values if whole else values[idx]

    prompt, output, keep = scenario.cap_lengths(
        column("prompt_tokens"), column("output_tokens"), column("max_tokens")
    )
    keep_idx = None if keep.all() else np.flatnonzero(keep)  # None: every one is kept

    def kept(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return values if keep_idx is None else values[keep_idx]

    rows = kept(idx)  # frame rows, in replay order
    n = len(rows)
    prefix = None
    info: dict[str, Any] = {}
    if scenario.prefix_caching:
        engine_block = scenario.memory.block_size
        if _has_hashes(frame):
            trace_block = frame["block_size"].fill_null(0).to_numpy().astype(np.int64)[rows]
            hashes = frame["prefix_hashes"].to_arrow().take(pa.array(rows))
            outputs = None  # the hashes of generated blocks, where the trace has them
            if _has_output_hashes(frame):
                outputs = frame["output_hashes"].to_arrow().take(pa.array(rows))
            prefix = build_keys(
                kept(prompt),
                trace_block,
                hashes,
                engine_block,
                partial_blocks=scenario.prefix_partial_blocks,
                output_hashes=outputs,
            )
        else:
            trace_block = np.zeros(n, dtype=np.int64)
            prefix = PrefixKeys.empty(n)
        info = describe(
            prefix, trace_block, engine_block, partial_blocks=scenario.prefix_partial_blocks
        )
    info.update(trace_prefix_facts(frame, rows))
    priority = None
    if scenario.by_priority:
        priority = _priorities(frame, rows, scenario.tenant_priority or {})
    warm = min(scenario.prefix_warmup_requests, n)
    if warm and warm >= n:
        raise ScenarioError(
            f"scenario {scenario.name!r}: prefix_warmup_requests "
            f"({scenario.prefix_warmup_requests}) leaves none of the {n} requests to replay"
        )
    times = kept(arrival)
    warmup = None
    if warm:
        assert prefix is not None
        warmup = prefix.slice(0, warm)
        prefix = prefix.slice(warm, n)
        times = times[warm:] - times[warm]
        priority = None if priority is None else priority[warm:]
    as_is = whole and keep_idx is None and not warm  # the replay is the frame, row for row
    ids = frame["request_id"]
    if not as_is:
        ids = ids.gather(rows[warm:])
        if not whole and _repeats(idx, frame.height):  # drawn with replacement: keep ids unique
            drawn = np.arange(len(idx)) if keep_idx is None else keep_idx
            ids = ids + "#" + pl.Series(drawn[warm:]).cast(pl.String)
    groups: dict[str, Any] = {}
    if with_groups:
        for c in ("tenant", "model"):
            if c in frame.columns:
                values = frame[c].to_numpy()
                groups[c] = values if as_is else values[rows[warm:]]
    return Prepared(
        inp=SimInput(
            times,
            kept(prompt)[warm:],
            kept(output)[warm:],
            prefix=prefix,
            priority=priority,
            warmup=warmup,
        ),
        request_ids=ids.to_arrow(),
        num_dropped=int(len(idx) - n),
        num_warmup=warm,
        prefix_info=info,
        groups=groups,
    )


def _has_hashes(frame: pl.DataFrame) -> bool:
    """Whether any request carries prefix hashes (and a block size to read them with)."""
    if "prefix_hashes" not in frame.columns or "block_size" not in frame.columns:
        return False
    return bool(frame["prefix_hashes"].list.len().sum() > 0)  # a pass over list offsets


def _has_output_hashes(frame: pl.DataFrame) -> bool:
    """Whether any request carries the hashes of its generated blocks."""
    return "output_hashes" in frame.columns and frame["output_hashes"].null_count() < frame.height


def _is_whole(idx: npt.NDArray[np.int64], num_rows: int) -> bool:
    """Whether ``idx`` is 0, 1, ..., num_rows - 1 (every row, in order)."""
    n = len(idx)
    return n == num_rows and (n == 0 or (idx[0] == 0 and idx[-1] == n - 1 and _is_arange(idx)))


def _repeats(idx: npt.NDArray[np.int64], num_rows: int) -> bool:
    """Whether some row index occurs twice; linear (no sort), and O(1) work for an arange."""
    n = len(idx)
    if n == 0 or (idx[0] == 0 and idx[-1] == n - 1 and n <= num_rows and _is_arange(idx)):
        return False
    return bool(np.bincount(idx, minlength=num_rows).max() > 1)


def _is_arange(idx: npt.NDArray[np.int64]) -> bool:
    return bool((np.diff(idx) == 1).all())


def _priorities(
    frame: pl.DataFrame, rows: npt.NDArray[np.int64], tenant_priority: dict[str, int]
) -> npt.NDArray[np.int64]:
    """Per request: its tenant's priority if mapped, else the trace's, else 0."""
    n = len(rows)
    prio = np.zeros(n, dtype=np.int64)
    if "priority" in frame.columns:
        prio = frame["priority"].fill_null(0).to_numpy().astype(np.int64)[rows]
    if tenant_priority and "tenant" in frame.columns:
        tenant = frame["tenant"].gather(rows)
        mapped = tenant.replace_strict(
            list(tenant_priority),
            list(tenant_priority.values()),
            default=None,
            return_dtype=pl.Int64,
        )
        prio = np.where(mapped.is_null().to_numpy(), prio, mapped.fill_null(0).to_numpy())
    return prio.astype(np.int64)


def _constant_strings(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int32)), pa.array([value])
    ).cast(pa.string())


def sim_requests_table(
    name: str, ids: pa.Array, res: SimResult, rows: slice = slice(None)
) -> pa.Table:
    """The sim_requests rows of one scenario (of its requests ``rows``)."""
    rq, rqf = res.rq[rows], res.rqf[rows]
    n = len(rq)
    m = request_metrics(res, rows, engine=True)
    i32 = np.int32
    return pa.table(
        {
            "scenario": _constant_strings(name, n),
            "request_id": ids[rows],
            "replica": rq[:, R_REPLICA].astype(i32),
            "arrival_s": rqf[:, F_ARRIVAL],
            "prompt_tokens": rq[:, R_PROMPT].astype(i32),
            "output_tokens": rq[:, R_OUTPUT].astype(i32),
            "first_scheduled_s": rqf[:, F_FIRST_SCHED],
            "first_token_s": rqf[:, F_FIRST_TOKEN],
            "finished_s": rqf[:, F_FINISH],
            "queue_s": m["queue_s"],
            "ttft_s": m["ttft_s"],
            "tpot_s": pa.array(m["tpot_s"], mask=np.isnan(m["tpot_s"])),
            "e2e_s": m["e2e_s"],
            "engine_ttft_s": m["engine_ttft_s"],
            "engine_e2e_s": m["engine_e2e_s"],
            "num_preemptions": rq[:, R_PREEMPT].astype(i32),
            "num_prefill_chunks": rq[:, R_CHUNKS].astype(i32),
            "cached_tokens": rq[:, R_CACHED].astype(i32),
            "queue_depth_at_arrival": rq[:, R_QDEPTH].astype(i32),
        }
    )


def write_sim_requests(
    out: TableWriter, name: str, ids: pa.Array, res: SimResult, rows_per_group: int = CHUNK_ROWS
) -> Path:
    """Write the sim_requests rows of one scenario through ``out``, a row group at a time.

    Only one group's table exists at once (not the whole scenario's).
    """
    with out:
        for a in range(0, res.num_requests, rows_per_group):
            out.write(sim_requests_table(name, ids, res, slice(a, a + rows_per_group)))
    return out.path


def sim_steps_table(
    name: str,
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    num_kv_blocks: int,
) -> pa.Table:
    """The sim_steps rows of timeline rows ``st``/``stf`` of one scenario (runs of
    identical decode steps are one row).

    The table owns its memory: the columns of ``st``/``stf`` are strided views,
    which pyarrow copies, so the loop may refill a chunk's arrays afterwards.
    """
    n = len(st)
    i32 = np.int32
    return pa.table(
        {
            "scenario": _constant_strings(name, n),
            "replica": st[:, S_REPLICA].astype(i32),
            "step": st[:, S_STEP],
            "num_steps": st[:, S_NUM_STEPS],
            "start_s": stf[:, SF_START],
            "duration_s": stf[:, SF_DURATION],
            "num_running": st[:, S_RUNNING].astype(i32),
            "num_waiting": st[:, S_WAITING].astype(i32),
            "num_prefill_tokens": st[:, S_PREFILL],
            "num_decode_tokens": st[:, S_DECODE],
            "prefill_attn_pairs": stf[:, SF_ATTN],
            "decode_context_tokens": stf[:, SF_CTX].astype(np.int64),
            "num_kv_blocks_used": st[:, S_KV_USED],
            "num_kv_blocks_total": np.full(n, num_kv_blocks, dtype=np.int64),
            "num_preemptions": st[:, S_PREEMPT].astype(i32),
            "num_prefix_query_tokens": st[:, S_PQUERY],
            "num_prefix_hit_tokens": st[:, S_PHIT],
        }
    )


def _simulate(
    sc: Scenario,
    inputs: list[SimInput],
    keep: Callable[[pa.Table], None],
    *,
    chunk_rows: int,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[SimResult, StepTotals, float]:
    """Run one scenario, handing its sim_steps rows to ``keep`` a chunk at a time.

    ``inputs`` holds the scenario's input, taken out of it for the loop: when
    the caller keeps no other reference, the loop frees it once copied.

    Returns the result (its timeline empty), the timeline's totals, and the
    seconds spent in the loop (not in converting and keeping the chunks).
    """
    eng = sc.engine()
    blocks = eng.get(C_NUM_BLOCKS)
    steps = StepTotals()
    kept_s = 0.0

    def on_steps(st: npt.NDArray[np.int64], stf: npt.NDArray[np.float64]) -> None:
        nonlocal kept_s
        t = time.perf_counter()
        steps.add(st, stf)
        keep(sim_steps_table(sc.name, st, stf, blocks))
        kept_s += time.perf_counter() - t

    t0 = time.perf_counter()
    res = simulate(
        inputs.pop(), eng, on_progress=on_progress, on_steps=on_steps, step_rows=chunk_rows
    )
    return res, steps, time.perf_counter() - t0 - kept_s


def _facts(prep: Prepared) -> dict[str, Any]:
    """What a scenario's summary says of its preparation (dropped, warm-up, prefix facts)."""
    return {
        "num_dropped": prep.num_dropped,
        "num_warmup_requests": prep.num_warmup,
        **prep.prefix_info,
    }


@with_warehouse_lock
def replay(
    warehouse: Path,
    scenarios: list[Scenario],
    *,
    requests_file: Path | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    quiet: bool = False,
    run_id: str | None = None,
    selection: RequestFilter | None = None,
    chunk_rows: int = CHUNK_ROWS,
    intervals: bool = True,
) -> ReplayResult:
    """Replay the selected requests through every scenario and write the results.

    Args:
        warehouse: warehouse directory (requests are read from it unless
            ``requests_file`` is given; results are always written to it).
        scenarios: validated scenarios (``scenario.resolve_scenarios``).
        requests_file: one requests Parquet file instead of the warehouse.
        date_from, date_to: inclusive range of request days (warehouse only).
        quiet: no progress bar.
        run_id: the run id to write under (default: a new one).
        selection: which of those requests (models, tenants, predicate, time window).
        chunk_rows: step rows converted and written at once, and requests per
            row group of sim_requests (bounds the memory the writing takes).
        intervals: give each summary's TTFT, TPOT and E2E percentiles their 90%
            intervals (``pipeline.sim.uncertainty``: a bootstrap, and two more
            replays for the profile term).

    Returns:
        The run id, the inputs and each scenario's summary and files.

    Raises:
        ScenarioError: a scenario cannot run on these requests (nothing is written).
        ConfigError: no requests selected.
    """
    started = datetime.now(UTC)
    wh = Warehouse(warehouse)
    run_id = run_id or new_run_id(started)
    files = select_request_files(
        wh, requests_file=requests_file, date_from=date_from, date_to=date_to
    )
    frame = read_requests(files, selection)
    # every check before any run; the groups (tenant, model) are only for SLOs
    prepared = [prepare(frame, sc, with_groups=False) for sc in scenarios]
    rows_read = frame.height
    del frame  # the prepared arrays are all the runs need: free the frame's memory
    wh.init()
    runs: list[ScenarioRun] = []
    status = "failed"
    try:
        if scenarios:
            load_loop(scenarios[0].engine(), quiet=quiet)
        run_one = functools.partial(_run_one, quiet=quiet, rows=chunk_rows, intervals=intervals)
        for sc in scenarios:  # each scenario's inputs are let go once it has run
            runs.append(run_one(wh, run_id, sc, prepared.pop(0)))
        wh.write(SCENARIOS, _scenarios_table(runs), {"run_id": run_id}, "scenarios")
        status = "ok"
    finally:
        _write_run_row(wh, run_id, started, status, files, rows_read, runs)
    return ReplayResult(
        run_id=run_id, num_requests_read=rows_read, inputs=[str(f) for f in files], runs=runs
    )


def load_loop(eng: EngineConfig, *, quiet: bool = False) -> None:
    """Load the compiled loop from numba's cache, or compile it with a notice on stderr."""
    from pipeline.sim import loop

    # NOTE: numba's list of compiled signatures: non-empty once this process has the loop
    with compile_notice(quiet=quiet, loaded=bool(loop.replay_loop.signatures)):
        warm_up(eng)


def _run_one(
    wh: Warehouse,
    run_id: str,
    sc: Scenario,
    prep: Prepared,
    *,
    quiet: bool,
    rows: int,
    intervals: bool = False,
) -> ScenarioRun:
    """Run one scenario; its step rows are written as the loop hands them out."""
    # the profile term's replays run first, while the input is still held
    at_cost = uncertainty.profile_statistics(sc, prep.inp) if intervals else None
    n, inputs, ids, facts = len(prep.inp), [prep.inp], prep.request_ids, _facts(prep)
    del prep  # the caller holds it no more: the loop frees the input once it has copied it
    part = {"run_id": run_id}
    with (
        progress(f"replay {sc.name}", total=n, quiet=quiet) as bar,
        wh.writer(SIM_STEPS, part, sc.name) as steps_out,
    ):
        seen = [0]

        def on_progress(k: int) -> None:
            bar.advance(k - seen[0])
            seen[0] = k

        res, steps, sim_s = _simulate(
            sc, inputs, steps_out.write, chunk_rows=rows, on_progress=on_progress
        )
    summary = {**summarize(res, steps), **facts}
    if intervals:
        summary["intervals"] = uncertainty.summary_intervals(sc, res, at_cost)
    paths = {
        "sim_steps": steps_out.path,
        "sim_requests": write_sim_requests(
            wh.writer(SIM_REQUESTS, part, sc.name), sc.name, ids, res, rows
        ),
    }
    return ScenarioRun(
        scenario=sc, summary=summary, num_dropped=facts["num_dropped"], sim_s=sim_s, paths=paths
    )


def _scenarios_table(runs: list[ScenarioRun]) -> pa.Table:
    return pa.table(
        {
            "scenario": [r.scenario.name for r in runs],
            "policy": [r.scenario.policy for r in runs],
            "replicas": pa.array([r.scenario.replicas for r in runs], pa.int32()),
            "profile": [r.scenario.profile for r in runs],
            "config_json": [json.dumps(r.scenario.to_dict(), sort_keys=True) for r in runs],
            "summary_json": [json.dumps(r.summary, sort_keys=True) for r in runs],
        }
    )


def _write_run_row(
    wh: Warehouse,
    run_id: str,
    started: datetime,
    status: str,
    files: list[Path],
    rows_read: int,
    runs: list[ScenarioRun],
) -> None:
    details = {
        "scenarios": {
            r.scenario.name: {"config": r.scenario.to_dict(), "summary": r.summary} for r in runs
        }
    }
    write_run_row(
        wh,
        run_id=run_id,
        command="replay",
        started=started,
        status=status,
        inputs=[str(f) for f in files],
        rows_read=rows_read,
        rows_kept=sum(r.summary["num_requests"] for r in runs),
        details=details,
    )


# --- Hooks for stages that run many scenarios (sweeps, capacity searches) ---


def run_prepared(sc: Scenario, prep: Prepared) -> tuple[ScenarioRun, pa.Table, pa.Table]:
    """Simulate one prepared scenario and return its run, sim_requests and sim_steps tables.

    Writes nothing: the caller writes the tables, in bulk or from another process.
    Uses no polars, so it is safe in a forked worker process.
    """
    chunks: list[pa.Table] = []
    res, steps, sim_s = _simulate(sc, [prep.inp], chunks.append, chunk_rows=CHUNK_ROWS)
    blocks = res.num_kv_blocks
    steps_table = pa.concat_tables(chunks or [sim_steps_table(sc.name, res.st, res.stf, blocks)])
    summary = {**summarize(res, steps), **_facts(prep)}
    run = ScenarioRun(scenario=sc, summary=summary, num_dropped=prep.num_dropped, sim_s=sim_s)
    return run, sim_requests_table(sc.name, prep.request_ids, res), steps_table


def summarize_prepared(sc: Scenario, prep: Prepared) -> tuple[ScenarioRun, SimResult]:
    """Simulate one prepared scenario for its summary only: no tables are built.

    Returns the run and the result (its step timeline kept whole, for the summary).
    """
    t0 = time.perf_counter()
    res = simulate(prep.inp, sc.engine())
    sim_s = time.perf_counter() - t0
    summary = {**summarize(res), **_facts(prep)}
    return ScenarioRun(scenario=sc, summary=summary, num_dropped=prep.num_dropped, sim_s=sim_s), res


def scenarios_table(runs: list[ScenarioRun]) -> pa.Table:
    """The scenarios table rows of ``runs``, one per scenario."""
    return _scenarios_table(runs)
