"""Replay input: the requests to replay, read from the warehouse (or one file), and each
scenario's ``SimInput`` prepared from them.

    requests (warehouse or one file) ──▶ read_requests ──▶ prepare(scenario) ──▶ Prepared

Arrival times are relative to the earliest selected request (``arrival_time``;
``arrival_s`` is per source file); with ``--busiest``, to the first request of the
window's warm-up, and the warm-up requests are replayed but left out of the result
(``busiest``, ``simulate.LeadInput``). ``prepare`` applies a scenario's arrivals,
length caps, memory checks, prefix keys and priorities, so that every scenario is
checked before the first one runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import busiest
from pipeline.busiest import WARMUP_COLUMN, BusiestWindow
from pipeline.contracts import REQUESTS, check_file, with_optional_columns
from pipeline.errors import ConfigError, ScenarioError
from pipeline.selection import RequestFilter, check_request_columns
from pipeline.sim.arrivals import make_arrivals
from pipeline.sim.classes import ClassLabels, labels_of
from pipeline.sim.prefix import build_keys, describe
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import LeadInput
from pipeline.sim.state import PrefixKeys, SimInput
from pipeline.sim.trace_prefix import trace_prefix_facts
from pipeline.warehouse import Warehouse, iter_partitions

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
class Prepared:
    """One scenario's requests, ready for the loop."""

    inp: SimInput
    request_ids: pa.Array
    num_dropped: int
    num_warmup: int = 0  # leading requests that warmed the caches instead of running
    num_lead: int = 0  # then requests replayed before the busiest window, not in the result
    prefix_info: dict[str, Any] = field(default_factory=dict)  # block-size bridging facts
    # per replayed request: tenant and model (object arrays), for SLOs with a scope
    groups: dict[str, Any] = field(default_factory=dict)
    # per replayed request: its class of each kind (tenant, model), for per-class figures
    classes: dict[str, ClassLabels] = field(default_factory=dict)


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

    ``selection`` keeps some of them (models, tenants, a predicate, a time window, the
    busiest window: ``read_window``). ``arrival_s`` is recomputed here: seconds from the
    earliest selected request.
    """
    return read_window(files, selection)[0]


def read_window(
    files: list[Path], selection: RequestFilter | None = None
) -> tuple[pl.DataFrame, BusiestWindow | None]:
    """``read_requests``, and the busiest window it kept when the selection asks for one
    (None otherwise). The window's warm-up rows are flagged ``WARMUP_COLUMN``.

    Raises:
        ConfigError: no requests selected; a window longer than the selection.
    """
    frame = _read(files, selection)
    spec = selection.busiest if selection is not None else None
    if spec is None:
        return frame, None
    return busiest.cut(frame, spec)


def _read(
    files: list[Path],
    selection: RequestFilter | None,
    *,
    t0_us: int | None = None,
    allow_empty: bool = False,
) -> pl.DataFrame:
    """``read_requests`` without a busiest window; ``t0_us``: the arrival (epoch us) that
    ``arrival_s`` counts from (default: the first row's); ``allow_empty``: no rows is not
    an error (a time window of a replay read a window at a time: ``replay_windows``)."""
    if selection is not None and selection.filters:
        table = with_optional_columns(selection.read(files, allow_empty=allow_empty), REQUESTS)
        source = pl.from_arrow(table).lazy()  # type: ignore[union-attr]
    else:
        source = _scan(files)
    frame = source.select(REQUEST_COLUMNS).collect()
    if frame.height == 0:
        if allow_empty:
            return frame.with_columns(pl.lit(0.0).alias("arrival_s"))
        raise ConfigError("the selected requests files hold no requests")
    us = frame["arrival_time"].dt.epoch("us").to_numpy()
    if not _in_order(us, frame["request_id"]):  # files written in arrival order skip the sort
        order = frame.select(pl.arg_sort_by("arrival_time", "request_id")).to_series()
        frame = frame[order]
        us = us[order.to_numpy()]
    seconds = (us - (us[0] if t0_us is None else t0_us)).astype(np.float64, copy=False)
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
    """Arrivals, length caps, memory checks, prefix keys and priorities of one scenario
    (of a fleet, a ``fleet.FleetPrepared``: each pool's share prepared so).

    With ``prefix_warmup_requests`` = N, the first N requests (in arrival order,
    after the caps) are not replayed: their prompts fill every replica's prefix
    cache first, and the replay starts at the arrival of the next one (time 0).
    The warm-up rows of a busiest window (``WARMUP_COLUMN``) that are left are
    replayed first and left out of the result (``LeadInput.lead``): the ids and
    groups are the window's requests'.
    ``with_groups``: also the tenant and model of each request (for SLOs with a
    scope; an object array per column, so left out where no SLO is judged).

    When every row of the frame is replayed in its order (trace arrivals, no
    length dropped), nothing is gathered: the columns are used as they are.

    Raises:
        ScenarioError: see ``Scenario.cap_lengths`` and ``arrivals.make_arrivals``;
            a warm-up that leaves nothing to replay; drawn requests with a busiest
            window's warm-up.
    """
    if scenario.pools:
        from pipeline.sim.fleet import prepare_fleet  # a fleet splits, then comes back here

        return prepare_fleet(frame, scenario, with_groups=with_groups)
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
    lead = _lead(frame, rows[warm:], scenario)
    if lead and lead >= n - warm:
        raise ScenarioError(
            f"scenario {scenario.name!r}: the busiest window's warm-up ({lead:,} requests) "
            f"leaves none of the {n - warm:,} requests to measure"
        )
    first = warm + lead  # the first measured row, in replay order
    as_is = whole and keep_idx is None and not first  # the replay is the frame, row for row
    ids = frame["request_id"]
    if not as_is:
        ids = ids.gather(rows[first:])
        if not whole and _repeats(idx, frame.height):  # drawn with replacement: keep ids unique
            drawn = np.arange(len(idx)) if keep_idx is None else keep_idx
            ids = ids + "#" + pl.Series(drawn[first:]).cast(pl.String)
    classes = labels_of(frame, None if as_is else rows[first:])  # 4 bytes a request and kind
    groups: dict[str, Any] = {}
    if with_groups:
        for c in ("tenant", "model"):
            if c in frame.columns:
                values = frame[c].to_numpy()
                groups[c] = values if as_is else values[rows[first:]]
    return Prepared(
        inp=LeadInput(
            times,
            kept(prompt)[warm:],
            kept(output)[warm:],
            prefix=prefix,
            priority=priority,
            warmup=warmup,
            lead=lead,
        ),
        request_ids=ids.to_arrow(),
        num_dropped=_dropped(frame, idx, keep),
        num_warmup=warm,
        num_lead=lead,
        prefix_info=info,
        groups=groups,
        classes=classes,
    )


def _dropped(frame: pl.DataFrame, idx: npt.NDArray[np.int64], keep: npt.NDArray[np.bool_]) -> int:
    """Requests left out for their length, a busiest window's warm-up's not counted."""
    dropped = ~keep
    if WARMUP_COLUMN in frame.columns:
        dropped &= ~frame[WARMUP_COLUMN].to_numpy()[idx]
    return int(dropped.sum())


def _lead(frame: pl.DataFrame, rows: npt.NDArray[np.int64], scenario: Scenario) -> int:
    """How many of the replayed ``rows`` lead in: a busiest window's warm-up rows, which
    must come first.

    Raises:
        ScenarioError: they do not (requests drawn from anywhere in the selection).
    """
    if WARMUP_COLUMN not in frame.columns:
        return 0
    flags = frame[WARMUP_COLUMN].to_numpy()[rows]
    lead = int(flags.sum())
    if lead and not flags[:lead].all():
        raise ScenarioError(
            f"scenario {scenario.name!r}: num_requests with arrivals = "
            f"{scenario.arrivals.process!r} draws requests from the busiest window and its "
            "warm-up alike; leave num_requests out, or give --busiest-warmup 0"
        )
    return lead


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


def _is_arange(idx: npt.NDArray[np.int64], chunk: int = 1 << 20) -> bool:
    """Whether each index is one more than the one before; a chunk at a time, so that
    millions of indices make no temporary arrays of their size."""
    for a in range(0, max(len(idx) - 1, 0), chunk):
        part = idx[a : a + chunk + 1]
        if not (part[1:] - part[:-1] == 1).all():
            return False
    return True


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
