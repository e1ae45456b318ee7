"""Every Parquet table the pipeline reads or writes, declared once.

Stage data flow:
    ingest   logs         -> REQUESTS, QUARANTINE, RUNS
    replay   REQUESTS     -> SIM_REQUESTS, SIM_STEPS, SCENARIOS, RUNS
    sweep    REQUESTS     -> SIM_REQUESTS, SIM_STEPS, SCENARIOS, RUNS (many scenarios, one run)
    capacity REQUESTS     -> CAPACITY_SEARCH, and what a sweep writes for every probe
    calibrate REQUESTS    -> CALIBRATION, RUNS (observed against replayed latencies)
    live     REQUESTS     -> LIVE_REQUESTS, LIVE_METRICS, RUNS (a real engine, not the simulator)
    validate LIVE_REQUESTS -> VALIDATION, VALIDATION_REQUESTS, RUNS (simulator vs live engine)
    report   all of them  -> one HTML file (through sql/*.sql, read-only)

Column names carry their unit: *_s seconds, *_tokens token counts, num_* counts.
A table's ``partition_by`` columns live in the directory names
(``requests/date=2024-05-01/...``), not inside the files; readers get them back
through hive partitioning.

Every file carries ``tracereplay.table`` and ``tracereplay.schema_version`` in its
Parquet footer. Writers and readers check the columns, their types and their
nullability and fail with a message that names the table, the column and the file.

Every file is written with Parquet page checksums (CRC32 of each page) and read with
them verified; each column may also declare the values it can hold (``Valid``: finite,
a lower and an upper bound), and ``value_problems`` applies them, so a reader can tell a
damaged file from a good one (``pipeline.integrity``).

Schema evolution: a column added to a table without changing what the others
mean is declared ``optional`` (and nullable) and keeps the table's version.
Every file written now has it (``conform`` writes nulls where a writer has no
values); files written before it existed lack it, and readers (``check_file``,
``read_table``, the DuckDB views with ``union_by_name``) take it as all nulls
there, so an old warehouse reads as it is.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import ContractError
from pipeline.storage import discard

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # loaded when a table is read, written or checked, not by `tracereplay sql` on its
    # own (pyarrow and numpy: about 0.1 s); the contracts name their types as text
    from pipeline.lazy import lazy_import

    pa = lazy_import("pyarrow")
    pc = lazy_import("pyarrow.compute")
    pq = lazy_import("pyarrow.parquet")

TABLE_KEY = b"tracereplay.table"
VERSION_KEY = b"tracereplay.schema_version"


# The most tokens a prompt, an output or a cache hit may count. No model's context comes
# near it (the longest are about 10M tokens); a count above it is a unit or parsing
# error, or a damaged file. Ingest refuses such records; readers refuse such files.
MAX_TOKENS = 100_000_000
# The longest span a time in seconds may cover: arrival times run from 1970 to 2262
# (``pipeline.ingest.validate``), about 9.2e9 s apart.
MAX_SECONDS = 1e10
FIRST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LAST_TIME = datetime(2262, 4, 11, tzinfo=UTC)


@dataclass(frozen=True)
class Valid:
    """The values a column may hold; a file with any other is damaged.

    ``lo``/``hi``: inclusive bounds (numbers, or datetimes for a timestamp column);
    ``finite``: NaN and infinities are refused (else NaN passes, and infinities only
    within the bounds). Nulls are judged by the contract's ``nullable``, not here.
    """

    lo: Any = None
    hi: Any = None
    finite: bool = True

    def describe(self) -> str:
        lo = "-inf" if self.lo is None else _show(self.lo)
        hi = "inf" if self.hi is None else _show(self.hi)
        return f"[{lo}, {hi}]"


def _show(v: Any) -> str:
    return v.isoformat() if isinstance(v, datetime) else f"{v:g}"


TIME_S = Valid(0.0, MAX_SECONDS)  # a time or duration in seconds, always known
SIM_TIME_S = Valid(0.0, MAX_SECONDS, finite=False)  # NaN: not reached (never scheduled, ...)
LATENCY_S = Valid(0.0, finite=False)  # as a log states it: NaN or large is the log's
TOKENS = Valid(0, MAX_TOKENS)
COUNT = Valid(0)
POSITIVE = Valid(1)
WHEN = Valid(FIRST_TIME, LAST_TIME)


@dataclass(frozen=True)
class Contract:
    """One table: its columns in order, which may be null, its key and its partitioning."""

    name: str  # also the directory name in the warehouse and the DuckDB view name
    version: int  # bump when a column changes meaning, unit or type
    description: str
    types: tuple[tuple[str, str], ...]  # each column's Arrow type by name (``arrow_type``)
    nullable: frozenset[str] = frozenset()
    primary_key: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()  # hive partition columns (not stored in files)
    docs: dict[str, str] = field(default_factory=dict, compare=False)
    # columns added after files were first written: nullable; a file written before them may
    # lack them (readers get nulls), so old warehouses stay readable
    optional: frozenset[str] = frozenset()
    # the values each column may hold (columns not named: any of their type)
    valid: dict[str, Valid] = field(default_factory=dict, compare=False)

    @functools.cached_property
    def columns(self) -> tuple[tuple[str, pa.DataType], ...]:
        """Each column and its Arrow type (importing pyarrow)."""
        return tuple((n, arrow_type(t)) for n, t in self.types)

    @property
    def column_names(self) -> list[str]:
        return [n for n, _ in self.types]

    @property
    def file_columns(self) -> list[str]:
        """Columns stored inside each Parquet file (the partition columns are not)."""
        return [n for n, _ in self.types if n not in self.partition_by]

    def schema(self, *, with_partitions: bool = False) -> pa.Schema:
        """The Arrow schema of the file (or of the table, with partitions)."""
        names = self.column_names if with_partitions else self.file_columns
        types = dict(self.columns)
        return pa.schema(
            [pa.field(n, types[n], nullable=n in self.nullable) for n in names],
            metadata={TABLE_KEY: self.name.encode(), VERSION_KEY: str(self.version).encode()},
        )


Column = tuple[str, str, str, "Valid | None"]


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type a contract names (``str()`` of the type gives the name back)."""
    return _ARROW_TYPES[name]()


_ARROW_TYPES = {  # (built when asked: pyarrow loads on first use)
    "string": lambda: pa.string(),
    "double": lambda: pa.float64(),
    "int32": lambda: pa.int32(),
    "int64": lambda: pa.int64(),
    "bool": lambda: pa.bool_(),
    "date32[day]": lambda: pa.date32(),
    "timestamp[us, tz=UTC]": lambda: pa.timestamp("us", tz="UTC"),  # (TS)
    "list<item: uint64>": lambda: pa.list_(pa.uint64()),
}


SCHED_CPU_COLS = ("sched_cpu_s", "sched_cpu_exposed_s")  # sim_steps, cost model v4
SWAP_COLS = ("swap_out_bytes", "swap_in_bytes")  # sim_steps, swap preemption
TIER_COLS = ("cpu_hit_tokens", "disk_hit_tokens", "tier_load_bytes")  # sim_steps, KV offloading


def _c(name: str, dtype: str, doc: str, valid: Valid | None = None) -> Column:
    return (name, dtype, doc, valid)


def _contract(
    name: str,
    version: int,
    description: str,
    cols: list[Column],
    *,
    nullable: set[str] | None = None,
    primary_key: tuple[str, ...] = (),
    partition_by: tuple[str, ...] = (),
    optional: set[str] | None = None,
) -> Contract:
    assert not (optional or set()) - (nullable or set()), "an optional column must be nullable"
    return Contract(
        name=name,
        version=version,
        description=description,
        types=tuple((n, t) for n, t, _, _ in cols),
        nullable=frozenset(nullable or ()),
        primary_key=primary_key,
        partition_by=partition_by,
        docs={n: d for n, _, d, _ in cols},
        optional=frozenset(optional or ()),
        valid={n: v for n, _, _, v in cols if v is not None},
    )


TS = "timestamp[us, tz=UTC]"

REQUESTS = _contract(
    "requests",
    1,
    "One row per request from a production log. Never holds prompt text.",
    [
        _c("request_id", "string", "id from the log, or a content hash when it has none"),
        _c("arrival_time", TS, "when the request arrived (UTC)", WHEN),
        _c("arrival_s", "double", "seconds since the first request of its source file", TIME_S),
        _c("prompt_tokens", "int32", "prompt (input, context) tokens", TOKENS),
        _c("output_tokens", "int32", "generated tokens", TOKENS),
        _c("max_tokens", "int32", "the request's max_tokens cap, when logged", POSITIVE),
        _c("block_size", "int32", "tokens per prefix hash block; null without hashes", POSITIVE),
        _c("prefix_hashes", "list<item: uint64>", "chained hashes of full prompt blocks"),
        _c(
            "output_hashes",
            "list<item: uint64>",
            "the chain continued over prompt + output: hashes of the full blocks after the "
            "prompt's full blocks; null when the log has no output tokens",
        ),
        _c("model", "string", "model name, when logged"),
        _c("tenant", "string", "user, team or API key the request belongs to"),
        _c("priority", "int32", "scheduling priority (lower first), when logged"),
        _c("session_id", "string", "conversation / chat id, when logged"),
        _c("parent_id", "string", "previous request of the conversation, when logged"),
        _c("turn", "int32", "turn number within the conversation, when logged"),
        _c("observed_ttft_s", "double", "time to first token seen in the log", LATENCY_S),
        _c("observed_e2e_s", "double", "end-to-end latency seen in the log", LATENCY_S),
        _c("observed_queue_s", "double", "queueing time seen in the log", LATENCY_S),
        _c(
            "cached_tokens",
            "int32",
            "prompt tokens served from a prefix cache, as logged",
            TOKENS,
        ),
        _c("source_format", "string", "log format the row was read from"),
        _c("source_file", "string", "file the row was read from"),
        _c("source_line", "int64", "1-based line (or record number) in that file", COUNT),
        _c("date", "date32[day]", "UTC day of arrival_time (partition)"),
    ],
    nullable={
        "max_tokens",
        "block_size",
        "model",
        "tenant",
        "priority",
        "session_id",
        "parent_id",
        "turn",
        "observed_ttft_s",
        "observed_e2e_s",
        "observed_queue_s",
        "cached_tokens",
        "output_hashes",
    },
    primary_key=("request_id",),
    partition_by=("date",),
    optional={"output_hashes"},
)

QUARANTINE = _contract(
    "quarantine",
    1,
    "One row per input record that ingest rejected, with where it was and why.",
    [
        _c("run_id", "string", "the ingest run that rejected it"),
        _c("source_format", "string", "log format of the file"),
        _c("source_file", "string", "file the record was read from"),
        _c("source_line", "int64", "1-based line (or record number) in that file", COUNT),
        _c("byte_offset", "int64", "byte offset of the record in the decompressed file", COUNT),
        _c("reason", "string", "what is wrong with the record"),
        _c("raw_excerpt", "string", "start of the raw record (formats without text only)"),
    ],
    nullable={"byte_offset", "raw_excerpt"},
)

RUNS = _contract(
    "runs",
    1,
    "One row per pipeline run: what ran, on what, when, and how it ended.",
    [
        _c("run_id", "string", "unique id, sortable by start time"),
        _c("command", "string", "ingest, replay, ..."),
        _c("started_at", TS, "start (UTC)"),
        _c("finished_at", TS, "end (UTC)"),
        _c("status", "string", "ok, partial (some files failed) or failed"),
        _c("inputs", "string", "JSON list of input paths"),
        _c("rows_read", "int64", "records read", COUNT),
        _c("rows_kept", "int64", "records written", COUNT),
        _c("rows_quarantined", "int64", "records sent to quarantine", COUNT),
        _c("rows_duplicate", "int64", "records dropped as duplicates of kept ones", COUNT),
        _c("details", "string", "JSON: per-file counts, errors, resolved config"),
        _c("version", "string", "tracereplay version"),
    ],
    primary_key=("run_id",),
)

# speculative decoding (sim/speculation.py): sim_requests columns, null when it is off
SPEC_REQUEST_COLUMNS = ("num_draft_tokens", "num_accepted_tokens")

SIM_REQUESTS = _contract(
    "sim_requests",
    1,
    "One row per scenario and replayed request: when it was scheduled and served.",
    [
        _c("run_id", "string", "replay run (partition)"),
        _c("scenario", "string", "scenario name"),
        _c("request_id", "string", "requests.request_id"),
        _c("pool", "string", "the fleet's pool that served it (null: one pool)"),
        _c("replica", "int32", "replica the router sent it to", COUNT),
        _c("arrival_s", "double", "simulated arrival, seconds from replay start", TIME_S),
        _c("prompt_tokens", "int32", "prompt tokens", TOKENS),
        _c("output_tokens", "int32", "output tokens generated (after any cap)", TOKENS),
        _c(
            "first_scheduled_s",
            "double",
            "start of the first step that scheduled it",
            SIM_TIME_S,
        ),
        _c(
            "first_token_s",
            "double",
            "end of the step that computed its last prompt token",
            SIM_TIME_S,
        ),
        _c("finished_s", "double", "end of the step that produced its last token", SIM_TIME_S),
        _c("queue_s", "double", "first_scheduled_s - arrival_s", SIM_TIME_S),
        _c("ttft_s", "double", "TTFT a client sees: engine_ttft_s + the front end", SIM_TIME_S),
        _c(
            "tpot_s",
            "double",
            "(e2e - ttft) / (output_tokens - 1); null if <= 1 token",
            SIM_TIME_S,
        ),
        _c("e2e_s", "double", "E2E a client sees: engine_e2e_s + the front end", SIM_TIME_S),
        _c(
            "engine_ttft_s",
            "double",
            "first_token_s - arrival_s (the engine core's)",
            SIM_TIME_S,
        ),
        _c("engine_e2e_s", "double", "finished_s - arrival_s (the engine core's)", SIM_TIME_S),
        _c("num_preemptions", "int32", "times it was preempted (recompute)", COUNT),
        _c("num_prefill_chunks", "int32", "steps that computed part of its prompt", COUNT),
        _c("cached_tokens", "int32", "prompt tokens served from the prefix cache", TOKENS),
        _c(
            "queue_depth_at_arrival",
            "int32",
            "requests waiting on its replica when it came",
            COUNT,
        ),
        _c(
            "kv_transfer_s",
            "double",
            "disaggregated: prefill done to its KV landed on the decode worker (null: not)",
            SIM_TIME_S,
        ),
        _c(
            "num_swaps",
            "int32",
            "swap preemption: times its KV went to host memory and back (0: never, "
            "or recompute preemption)",
            COUNT,
        ),
        _c(
            "cpu_hit_tokens",
            "int64",
            "KV offloading: tokens loaded for it from the CPU tier, past its GPU prefix "
            "hits, over all its lookups (resumptions too; 0: none, or no tiers)",
            COUNT,
        ),
        _c("disk_hit_tokens", "int64", "KV offloading: ... from the disk tier", COUNT),
        # speculative decoding (sim/speculation.py); null when no step has drafts
        _c(
            "num_draft_tokens",
            "int32",
            "speculative decoding: draft tokens its steps verified (padded ones too; redone "
            "after a preemption too: they sum to sim_steps'; null: no drafts)",
            COUNT,
        ),
        _c(
            "num_accepted_tokens",
            "int32",
            "speculative decoding: of which accepted (null: no drafts)",
            COUNT,
        ),
    ],
    # engine_*: added with cost model v3, pool with fleets, kv_transfer_s with
    # disaggregation, num_swaps with swap preemption, the tier columns with KV offloading,
    # the draft columns with speculative decoding (files written before lack them)
    nullable={
        "tpot_s",
        "engine_ttft_s",
        "engine_e2e_s",
        "pool",
        "kv_transfer_s",
        "num_swaps",
        "cpu_hit_tokens",
        "disk_hit_tokens",
        *SPEC_REQUEST_COLUMNS,
    },
    optional={
        "engine_ttft_s",
        "engine_e2e_s",
        "pool",
        "kv_transfer_s",
        "num_swaps",
        "cpu_hit_tokens",
        "disk_hit_tokens",
        *SPEC_REQUEST_COLUMNS,
    },
    primary_key=("scenario", "request_id"),
    partition_by=("run_id",),
)

# speculative decoding (sim/speculation.py): sim_steps columns, null when it is off
SPEC_STEP_COLUMNS = ("num_draft_tokens", "num_accepted_tokens")

SIM_STEPS = _contract(
    "sim_steps",
    1,
    "One row per scenario, replica and engine step, or run of identical decode steps.",
    [
        _c("run_id", "string", "replay run (partition)"),
        _c("scenario", "string", "scenario name"),
        _c("pool", "string", "the fleet's pool of the replica (null: one pool)"),
        _c("replica", "int32", "replica index (a fleet numbers its pools' in order)", COUNT),
        _c("step", "int64", "index of the first step in the row", COUNT),
        _c("num_steps", "int64", "steps the row covers (>1 for a skipped decode run)", COUNT),
        _c("start_s", "double", "start of the first step", SIM_TIME_S),
        _c("duration_s", "double", "total time of the steps in the row", SIM_TIME_S),
        _c("num_running", "int32", "requests in the batch", COUNT),
        _c("num_waiting", "int32", "requests queued (queue depth) at the start", COUNT),
        _c("num_prefill_tokens", "int64", "prompt tokens computed per step", COUNT),
        _c("num_decode_tokens", "int64", "decode tokens computed per step", COUNT),
        _c(
            "prefill_attn_pairs",
            "double",
            "causal (query, key) pairs of the prefill chunks (A of the cost model), per step",
        ),
        _c(
            "decode_context_tokens",
            "int64",
            "KV tokens the decodes read in the row's first step (C); each later step of a "
            "run reads num_decode_tokens more",
        ),
        _c("num_kv_blocks_used", "int64", "KV blocks in use at the end of the row", COUNT),
        _c("num_kv_blocks_total", "int64", "KV blocks the replica has", COUNT),
        _c("num_preemptions", "int32", "requests preempted in the row", COUNT),
        _c("num_prefix_query_tokens", "int64", "prompt tokens looked up in the prefix cache"),
        _c("num_prefix_hit_tokens", "int64", "of which found"),
        _c("role", "string", "disaggregated: the worker's role, prefill or decode (null: not)"),
        # scheduler CPU time (docs/replay.md, "Scheduler CPU time")
        _c("sched_cpu_s", "double", "scheduler CPU seconds of the row's steps", SIM_TIME_S),
        _c(
            "sched_cpu_exposed_s",
            "double",
            "of which on the critical path (all of it when the engine schedules synchronously)",
            SIM_TIME_S,
        ),
        _c(
            "swap_out_bytes",
            "int64",
            "swap preemption: KV bytes the row's step copied to host memory before its "
            "forward pass, which waited for them (0: none)",
            COUNT,
        ),
        _c("swap_in_bytes", "int64", "swap preemption: KV bytes copied back", COUNT),
        # speculative decoding (sim/speculation.py); null when it is off
        _c("num_draft_tokens", "int64", "draft tokens verified in the row (null: no drafts)"),
        _c("num_accepted_tokens", "int64", "of which accepted (null: no drafts)"),
        # KV offloading tiers (sim/kv_tiers.py); 0 when they are off
        _c(
            "cpu_hit_tokens",
            "int64",
            "KV offloading: tokens the row's step loaded from the CPU tier, past the GPU "
            "prefix hits (every lookup, resumptions too)",
            COUNT,
        ),
        _c("disk_hit_tokens", "int64", "KV offloading: ... from the disk tier", COUNT),
        _c(
            "tier_load_bytes",
            "int64",
            "KV offloading: KV bytes those loads moved; the step waited for them",
            COUNT,
        ),
    ],
    # added with cost model v3, pool with fleets, role with disaggregation, sched_cpu_*
    # with cost model v4, swap_*_bytes with swap preemption, the draft columns with
    # speculative decoding, the tier columns with KV offloading (files written before
    # lack them)
    nullable={
        "prefill_attn_pairs",
        "decode_context_tokens",
        "pool",
        "role",
        *SCHED_CPU_COLS,
        *SWAP_COLS,
        *SPEC_STEP_COLUMNS,
        *TIER_COLS,
    },
    optional={
        "prefill_attn_pairs",
        "decode_context_tokens",
        "pool",
        "role",
        *SCHED_CPU_COLS,
        *SWAP_COLS,
        *SPEC_STEP_COLUMNS,
        *TIER_COLS,
    },
    primary_key=("scenario", "replica", "step"),
    partition_by=("run_id",),
)

SCENARIOS = _contract(
    "scenarios",
    1,
    "One row per replayed scenario: its full resolved configuration and summary.",
    [
        _c("run_id", "string", "replay run (partition)"),
        _c("scenario", "string", "scenario name"),
        _c("policy", "string", "scheduler policy"),
        _c("replicas", "int32", "number of replicas"),
        _c("profile", "string", "step-cost profile name"),
        _c("config_json", "string", "every resolved parameter, as JSON"),
        _c("summary_json", "string", "the printed summary figures, as JSON"),
    ],
    primary_key=("scenario",),
    partition_by=("run_id",),
)

# columns capacity_search gained with intervals: older files lack them (read as null)
CAPACITY_INTERVAL_COLUMNS = (
    "probe_role",
    "measured_lo_s",
    "measured_hi_s",
    "interval_level",
    "answer_lo",
    "answer_hi",
    "answer_safe",
    "reversal_beyond_interval",
    "num_replicates",
    "cost_log_sd",
    "cost_sd_default",
)

CAPACITY_SEARCH = _contract(
    "capacity_search",
    1,
    "One row per capacity-search probe and SLO: the search path, each verdict, the answer.",
    [
        _c("run_id", "string", "capacity run (partition)"),
        _c("search", "string", "concurrency, rate, replicas or kv_offloading"),
        _c("knob", "string", "what the search turns: max_num_seqs, rate, replicas, ..."),
        _c("probe", "int32", "order of the probe within its search (0 first)"),
        _c("value", "double", "the knob's value at this probe (rate in requests/s)"),
        _c("scenario", "string", "the probe's scenario (scenarios, sim_requests)"),
        _c("slo", "string", "the SLO of this row, e.g. ttft_p99"),
        _c("limit_s", "double", "the SLO's limit (inclusive), seconds"),
        _c("measured_s", "double", "the SLO's statistic here; null: no request has it"),
        _c("slo_met", "bool", "measured_s <= limit_s"),
        _c("met", "bool", "every SLO met at this probe"),
        _c("num_requests", "int64", "requests replayed"),
        _c("offered_rate", "double", "requests / last arrival, requests/s"),
        _c("request_throughput", "double", "completed requests/s, first arrival to last token"),
        _c("output_token_throughput", "double", "output tokens/s over the same span"),
        _c("goodput", "double", "requests/s that met every SLO on their own (vLLM's)"),
        _c("num_preemptions", "int64", "preemptions in the replay"),
        _c("answer", "double", "the search's answer (every row); null: nothing meets"),
        _c("is_answer", "bool", "this probe is the answer"),
        _c("monotone", "bool", "every probe of the search agrees with the assumed shape"),
        _c("note", "string", "range end reached, or the probes that break monotony"),
        # added with intervals (null in files written before, and with --no-intervals)
        _c("probe_role", "string", "search (the bisection) or interval (for its ends only)"),
        _c("measured_lo_s", "double", "low end of measured_s's interval (the answer's spread)"),
        _c("measured_hi_s", "double", "high end of measured_s's interval"),
        _c("interval_level", "double", "coverage of the intervals (0.9)"),
        _c("answer_lo", "double", "low end of the answer's interval; null: none in range"),
        _c("answer_hi", "double", "high end of the answer's interval; null: none in range"),
        _c("answer_safe", "bool", "the answer meets every SLO at its upper bounds too"),
        _c("reversal_beyond_interval", "bool", "a verdict against the shape, not noise"),
        _c("num_replicates", "int32", "replicate replays at the answer (arrivals term)"),
        _c("cost_log_sd", "double", "sd of log step time of the profile term"),
        _c("cost_sd_default", "bool", "that sd is the default (the profile states none)"),
    ],
    nullable={
        "measured_s",
        "offered_rate",
        "request_throughput",
        "output_token_throughput",
        "goodput",
        "answer",
        "note",
        *CAPACITY_INTERVAL_COLUMNS,
    },
    optional=set(CAPACITY_INTERVAL_COLUMNS),
    primary_key=("search", "probe", "slo"),
    partition_by=("run_id",),
)

CALIBRATION = _contract(
    "calibration",
    1,
    "One row per calibrate-observed run, metric and statistic: observed vs simulated latency.",
    [
        _c("run_id", "string", "calibration run (partition)"),
        _c("scenario", "string", "the production scenario replayed"),
        _c("profile", "string", "the profile it started from"),
        _c("calibrated_profile", "string", "the calibrated profile JSON written"),
        _c("metric", "string", "ttft or tpot"),
        _c("statistic", "string", "p50, p90 or p99 over the requests"),
        _c("num_requests", "int64", "requests with both an observed and a simulated value"),
        _c("observed_s", "double", "the statistic of the logged latencies"),
        _c("before_s", "double", "the statistic simulated with the starting profile"),
        _c("after_s", "double", "the statistic simulated with the calibrated profile"),
        _c("before_error", "double", "before_s / observed_s - 1"),
        _c("after_error", "double", "after_s / observed_s - 1"),
        _c(
            "held_out_before_error",
            "double",
            "the starting profile's error on held-out hours (median over folds)",
        ),
        _c(
            "held_out_error",
            "double",
            "cross-validated: a fit on the other hours predicting held-out ones (median)",
        ),
        _c(
            "scale",
            "double",
            "fitted factor of the metric's cost group (ttft: compute, tpot: memory)",
        ),
        _c("iterations", "int32", "replays after the first"),
    ],
    nullable={
        "observed_s",
        "before_s",
        "after_s",
        "before_error",
        "after_error",
        "held_out_before_error",
        "held_out_error",
    },
    optional={"held_out_before_error", "held_out_error"},  # added with calibrate observed v2
    primary_key=("metric", "statistic"),
    partition_by=("run_id",),
)

LIVE_REQUESTS = _contract(
    "live_requests",
    1,
    "One row per request replayed through a live engine (in-process or over HTTP).",
    [
        _c("run_id", "string", "live run (partition)"),
        _c("request_id", "string", "requests.request_id"),
        _c("engine", "string", "inprocess or http"),
        _c("arrival_s", "double", "scheduled send time, seconds from replay start", TIME_S),
        _c("sent_s", "double", "when it left the client / was added to the engine"),
        _c("first_scheduled_s", "double", "engine-side first scheduling, when known"),
        _c("first_token_s", "double", "first non-empty chunk (first generated token)"),
        _c("finished_s", "double", "last chunk (request finished)"),
        _c("prompt_tokens", "int32", "prompt tokens sent", TOKENS),
        _c("output_tokens", "int32", "output tokens asked for (EOS ignored)", TOKENS),
        _c("output_tokens_received", "int32", "output tokens received", TOKENS),
        _c("ttft_s", "double", "first_token_s - arrival_s"),
        _c("tpot_s", "double", "(e2e - ttft) / (output_tokens_received - 1); null if <= 1"),
        _c("e2e_s", "double", "finished_s - arrival_s"),
        _c("itl_mean_s", "double", "mean gap between chunks after the first"),
        _c("itl_max_s", "double", "longest gap between chunks after the first"),
        _c("error", "string", "why it failed; null when it completed"),
        _c("ok", "bool", "completed with every token asked for (error is null)"),
    ],
    nullable={
        "sent_s",
        "first_scheduled_s",
        "first_token_s",
        "finished_s",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "itl_mean_s",
        "itl_max_s",
        "error",
    },
    primary_key=("request_id",),
    partition_by=("run_id",),
)

LIVE_METRICS = _contract(
    "live_metrics",
    1,
    "The time series of a live run: server metrics scraped from /metrics and client counts.",
    [
        _c("run_id", "string", "live run (partition)"),
        _c("time_s", "double", "when it was sampled, seconds from replay start"),
        _c("metric", "string", "num_requests_running, kv_cache_usage, client_in_flight, ..."),
        _c("value", "double", "its value then"),
    ],
    primary_key=("time_s", "metric"),
    partition_by=("run_id",),
)

VALIDATION = _contract(
    "validation",
    1,
    "The simulator against a live run: per metric and statistic, live, simulated, error.",
    [
        _c("run_id", "string", "validate run (partition)"),
        _c("live_run_id", "string", "the live run compared"),
        _c("metric", "string", "ttft, tpot, e2e, request_throughput, output_token_throughput"),
        _c("stat", "string", "p50, p90, p99, mean (latencies); overall (throughputs)"),
        _c("live", "double", "measured on the live engine (s, or per s)"),
        _c("simulated", "double", "the simulator's value for the same requests"),
        _c("error", "double", "simulated / live - 1"),
    ],
    nullable={"live", "simulated", "error"},
    primary_key=("metric", "stat"),
    partition_by=("run_id",),
)

VALIDATION_REQUESTS = _contract(
    "validation_requests",
    1,
    "The simulator against a live run, per request: live and simulated latencies side by side.",
    [
        _c("run_id", "string", "validate run (partition)"),
        _c("live_run_id", "string", "the live run compared"),
        _c("request_id", "string", "requests.request_id"),
        _c("arrival_s", "double", "arrival, seconds from the live replay's start"),
        _c("prompt_tokens", "int32", "prompt tokens"),
        _c("output_tokens", "int32", "output tokens"),
        _c("live_first_scheduled_s", "double", "engine's first scheduling (in-process)"),
        _c("sim_first_scheduled_s", "double", "simulated first scheduling"),
        _c("live_ttft_s", "double", "measured TTFT"),
        _c("sim_ttft_s", "double", "simulated TTFT"),
        _c("ttft_error", "double", "sim_ttft_s / live_ttft_s - 1"),
        _c("live_tpot_s", "double", "measured TPOT (null for one output token)"),
        _c("sim_tpot_s", "double", "simulated TPOT"),
        _c("tpot_error", "double", "sim_tpot_s / live_tpot_s - 1"),
        _c("live_e2e_s", "double", "measured end-to-end latency"),
        _c("sim_e2e_s", "double", "simulated end-to-end latency"),
        _c("e2e_error", "double", "sim_e2e_s / live_e2e_s - 1"),
    ],
    nullable={
        "live_first_scheduled_s",
        "sim_first_scheduled_s",
        "live_ttft_s",
        "sim_ttft_s",
        "ttft_error",
        "live_tpot_s",
        "sim_tpot_s",
        "tpot_error",
        "live_e2e_s",
        "sim_e2e_s",
        "e2e_error",
    },
    primary_key=("request_id",),
    partition_by=("run_id",),
)

CONTRACTS: dict[str, Contract] = {
    c.name: c
    for c in (
        REQUESTS,
        QUARANTINE,
        RUNS,
        SIM_REQUESTS,
        SIM_STEPS,
        SCENARIOS,
        CAPACITY_SEARCH,
        CALIBRATION,
        LIVE_REQUESTS,
        LIVE_METRICS,
        VALIDATION,
        VALIDATION_REQUESTS,
    )
}


def _type_name(t: pa.DataType) -> str:
    return str(t)


def conform(table: pa.Table, contract: Contract, where: str) -> pa.Table:
    """Return ``table`` with exactly the contract's file columns, in order, cast safely.

    Columns may arrive in any order and with types that cast losslessly
    (int64 -> int32 within range, large_string -> string, ...); an optional
    column that is absent becomes nulls.

    Raises:
        ContractError: naming the table, every problem column, and ``where``.
    """
    problems: list[str] = []
    types = dict(contract.columns)
    arrays = []
    for name in contract.file_columns:
        if name not in table.column_names:
            if name in contract.optional:
                arrays.append(pa.chunked_array([pa.nulls(table.num_rows, types[name])]))
            else:
                problems.append(f"missing column {name!r}")
            continue
        col = table.column(name)
        want = types[name]
        if not col.type.equals(want):
            try:
                col = col.cast(want, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                problems.append(
                    f"column {name!r} has type {_type_name(col.type)}, expected "
                    f"{_type_name(want)} ({str(exc).splitlines()[0]})"
                )
                continue
        if name not in contract.nullable and col.null_count:
            problems.append(f"column {name!r} has {col.null_count} nulls but may not be null")
        arrays.append(col)
    if problems:
        raise ContractError(
            f"table {contract.name} v{contract.version} in {where}: " + "; ".join(problems)
        )
    return pa.Table.from_arrays(arrays, schema=contract.schema())


def write_table(table: pa.Table, contract: Contract, path: Path) -> Path:
    """Check ``table`` against ``contract`` and write it to ``path`` atomically.

    The file is written next to its destination under a temporary name, flushed,
    then renamed, so a killed run never leaves half a file.
    """
    table = conform(table, contract, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        pq.write_table(table, tmp, **_parquet_options(table.schema))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def parquet_bytes(tables: list[pa.Table], contract: Contract, where: str) -> bytes:
    """The Parquet file of ``tables`` (each checked against ``contract``, appended as
    ``TableWriter`` appends), made in memory: what a worker in another process or on
    another machine hands back, for ``write_bytes`` to put in place as it is."""
    sink = pa.BufferOutputStream()
    schema = contract.schema()
    with pq.ParquetWriter(sink, schema, **_parquet_options(schema)) as writer:
        for table in tables:
            writer.write_table(conform(table, contract, where))
    return bytes(sink.getvalue().to_pybytes())


def write_bytes(data: bytes, path: Path) -> Path:
    """Write a file made by ``parquet_bytes`` to ``path`` atomically (as ``write_table``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


# Every Parquet file the warehouse writes carries a CRC32 of each page, and every
# pyarrow reader verifies it (``open_verified``): a flipped byte is an error, not a value.
CHECKSUMS: dict[str, Any] = {"write_page_checksum": True}


def _temporary(path: Path) -> Path:
    """Where a file is written before it is renamed into place (``.<name>.tmp-<pid>``)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _parquet_options(schema: pa.Schema) -> dict[str, object]:
    # Dictionary pages only for columns that can repeat: float columns (times) rarely
    # do, and trying a dictionary first makes the write slower and the file larger.
    keyed = [f.name for f in schema if not pa.types.is_floating(f.type)]
    return {"compression": "zstd", "use_dictionary": keyed, **CHECKSUMS}


class TableWriter:
    """One file of ``contract`` written in row groups as its rows come, atomically.

    Each ``write`` checks its rows against the contract (as ``write_table``
    does) and appends them as row groups to a temporary file next to
    ``path``; leaving the ``with`` block renames the finished file into place,
    and an exception removes it instead, so a killed or failed writer never
    leaves half a file under the final name::

        with TableWriter(SIM_STEPS, path) as out:
            for chunk in chunks:
                out.write(chunk)
    """

    def __init__(self, contract: Contract, path: Path) -> None:
        self.contract = contract
        self.path = path
        self.rows = 0
        self._tmp = _temporary(path)
        self._schema = contract.schema()
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> TableWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(self._tmp, self._schema, **_parquet_options(self._schema))
        return self

    def write(self, table: pa.Table) -> None:
        """Check ``table`` against the contract and append it (one row group per 1Mi rows)."""
        assert self._writer is not None, "use TableWriter in a with block"
        self._writer.write_table(conform(table, self.contract, str(self.path)))
        self.rows += table.num_rows

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        assert self._writer is not None
        try:
            self._writer.close()
            if kind is None:
                os.replace(self._tmp, self.path)
        finally:
            discard(self._tmp)


class BackgroundWriter:
    """Append tables through a ``TableWriter`` on a thread of its own, so that their
    Parquet encoding (which lets the GIL go, as the replay loop does) runs beside the
    caller on another core::

        with TableWriter(SIM_STEPS, path) as out, BackgroundWriter(out) as bg:
            for chunk in chunks:
                bg.write(chunk)

    At most ``depth`` tables wait, which bounds the memory they hold. ``write`` raises
    what an earlier write raised; leaving the ``with`` block waits until every table is
    written (and raises a write's error), or, leaving on an exception, drops what waits.
    ``write(table, to=other)`` appends to another writer through the same thread (one
    thread for several files: fewer threads than cores on a small machine).
    """

    def __init__(self, out: TableWriter, depth: int = 4) -> None:
        import queue
        import threading

        self.out = out
        self._queue: queue.Queue[tuple[TableWriter, pa.Table] | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._drop = False
        self._thread = threading.Thread(target=self._run, name="parquet-writer", daemon=True)

    def __enter__(self) -> BackgroundWriter:
        self._thread.start()
        return self

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None and not self._drop:
                try:
                    item[0].write(item[1])
                except BaseException as exc:  # raised in the caller's thread
                    self._error = exc

    def write(self, table: pa.Table, to: TableWriter | None = None) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((self.out if to is None else to, table))

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._drop = kind is not None
        self._queue.put(None)
        self._thread.join()
        if self._error is not None and kind is None:
            raise self._error


def open_verified(path: Path) -> pq.ParquetFile:
    """Open a Parquet file whose pages are checked against their checksums as they are read."""
    return pq.ParquetFile(path, page_checksum_verification=True)


def footer_problems(schema: pa.Schema, contract: Contract) -> list[str]:
    """What is wrong with a file's footer for ``contract``: its table, version, columns."""
    meta = schema.metadata or {}
    table = meta.get(TABLE_KEY, b"").decode(errors="replace")
    if table != contract.name:
        return [
            f"expected a {contract.name!r} file, footer says {table or 'nothing'!r}; "
            "was it written by tracereplay?"
        ]
    version = meta.get(VERSION_KEY, b"").decode(errors="replace")
    if version != str(contract.version):
        return [
            f"table {contract.name} has schema version {version or 'none'}, this "
            f"tracereplay reads v{contract.version}; re-run the stage that wrote it"
        ]
    types = dict(contract.columns)
    problems = []
    for name in contract.file_columns:
        if name not in schema.names:
            if name not in contract.optional:  # an optional one: a file from before it
                problems.append(f"missing column {name!r}")
        elif not schema.field(name).type.equals(types[name]):
            problems.append(
                f"column {name!r} has type {schema.field(name).type}, expected {types[name]}"
            )
    return problems


def check_file(path: Path, contract: Contract) -> pq.ParquetFile:
    """Open a Parquet file and check its footer and columns against ``contract``.

    The file's pages are verified against their checksums as they are read.

    Raises:
        ContractError: wrong table, unknown schema version, missing or mistyped column.
    """
    pf = open_verified(path)
    problems = footer_problems(pf.schema_arrow, contract)
    if len(problems) == 1 and not problems[0].startswith(("missing", "column")):
        raise ContractError(f"{path}: {problems[0]}")
    if problems:
        raise ContractError(f"table {contract.name} in {path}: " + "; ".join(problems))
    return pf


def value_problems(table: pa.Table, contract: Contract) -> list[str]:
    """What is wrong with the values of ``table`` (rows of a ``contract`` file).

    Nulls where the contract allows none, and values outside a column's ``Valid``;
    each problem names the column, how many rows and one of the values. Vectorized
    (``pyarrow.compute``): a million rows take milliseconds.
    """
    problems = []
    for name in table.column_names:
        col = table.column(name)
        if name not in contract.nullable and name not in contract.partition_by and col.null_count:
            problems.append(f"column {name!r} has {col.null_count} nulls but may not be null")
        valid = contract.valid.get(name)
        if valid is None or len(col) == 0:
            continue
        bad = _outside(col, valid)
        if bad is None:
            continue
        n = pc.sum(bad).as_py() or 0
        if n:
            example = col.filter(bad)[0].as_py()
            shown = example.isoformat() if isinstance(example, datetime) else f"{example:g}"
            finite = " or not finite" if valid.finite and pa.types.is_floating(col.type) else ""
            problems.append(
                f"column {name!r} has {n} value{'s' if n > 1 else ''} outside "
                f"{valid.describe()}{finite} (e.g. {shown})"
            )
    return problems


def _outside(col: pa.ChunkedArray, valid: Valid) -> pa.ChunkedArray | None:
    """A boolean mask of the values ``valid`` refuses (nulls: false), or None for none."""
    masks = []
    floating = pa.types.is_floating(col.type)
    if floating and valid.finite:
        masks.append(pc.invert(pc.is_finite(col)))
    for bound, op in ((valid.lo, pc.less), (valid.hi, pc.greater)):
        if bound is None:
            continue
        if isinstance(bound, datetime):
            scalar = pa.scalar(bound, type=col.type)
        elif pa.types.is_integer(col.type) and not float(bound).is_integer():
            scalar = pa.scalar(float(bound))
        else:
            scalar = pa.scalar(int(bound) if pa.types.is_integer(col.type) else float(bound))
        masks.append(op(col, scalar))
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = pc.or_(out, m)
    return pc.fill_null(out, False)


def read_table(path: Path, contract: Contract) -> pa.Table:
    """Read one Parquet file after checking it against ``contract``; the optional
    columns it lacks (a file from before they existed) come back as nulls."""
    pf = check_file(path, contract)
    present = set(pf.schema_arrow.names)
    table = pf.read(columns=[c for c in contract.file_columns if c in present])
    return with_optional_columns(table, contract)


def with_optional_columns(table: pa.Table, contract: Contract) -> pa.Table:
    """``table`` with the contract's optional columns it lacks added as nulls, in order."""
    missing = [c for c in contract.optional if c not in table.column_names]
    if not missing:
        return table
    types = dict(contract.columns)
    for name in missing:
        table = table.append_column(
            pa.field(name, types[name]), pa.nulls(table.num_rows, types[name])
        )
    order = [c for c in contract.column_names if c in table.column_names]
    order += [c for c in table.column_names if c not in order]
    return table.select(order)
