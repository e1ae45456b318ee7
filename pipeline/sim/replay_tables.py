"""Replay output tables: the sim_requests and sim_steps rows of one scenario's result.

The stage (``replay``) writes them, a chunk of step rows and a row group of requests
at a time; sweeps and capacity searches build them whole (``run_prepared``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.contracts import SPEC_REQUEST_COLUMNS, BackgroundWriter, TableWriter
from pipeline.sim.state import (
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
    R_SPEC_ACC,
    R_SPEC_DRAFT,
    R_SWAPS,
    S_CPU_HIT,
    S_DECODE,
    S_DISK_HIT,
    S_KV_USED,
    S_NUM_STEPS,
    S_PHIT,
    S_PQUERY,
    S_PREEMPT,
    S_PREFILL,
    S_REPLICA,
    S_RUNNING,
    S_SPEC_ACC,
    S_SPEC_DRAFT,
    S_STEP,
    S_SWAP_IN,
    S_SWAP_OUT,
    S_TIER_LOAD,
    S_WAITING,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    SF_SCHED_CPU,
    SF_SCHED_EXPOSED,
    SF_START,
    W_CPU_HITS,
    W_DISK_HITS,
    SimResult,
)
from pipeline.sim.summary import request_metrics

# rows per chunk of the step timeline, and per row group of sim_requests, while a
# scenario's results are written: what they cost in memory at once, whatever the
# number of requests (131,072 step rows: 14 MB of loop arrays; about DuckDB's own
# row group size, 122,880)
CHUNK_ROWS = 1 << 17


def _constant_strings(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int32)), pa.array([value])
    ).cast(pa.string())


def sim_requests_table(
    name: str,
    ids: pa.Array,
    res: SimResult,
    rows: slice = slice(None),
    *,
    pools: pa.Array | None = None,
) -> pa.Table:
    """The sim_requests rows of one scenario (of its requests ``rows``); ``pools``: each
    request's pool, in a fleet (null otherwise)."""
    rq, rqf, rqw = res.rq[rows], res.rqf[rows], res.rqw[rows]
    n = len(rq)
    m = request_metrics(res, rows, engine=True)
    i32 = np.int32
    return pa.table(
        {
            "pool": pools[rows] if pools is not None else pa.nulls(n, pa.string()),
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
            "kv_transfer_s": _transfer(res, rows, n),
            "num_swaps": rq[:, R_SWAPS].astype(i32),
            "cpu_hit_tokens": rqw[:, W_CPU_HITS],
            "disk_hit_tokens": rqw[:, W_DISK_HITS],
            **_request_speculation(res, rq),
        }
    )


def _request_speculation(res: SimResult, rq: npt.NDArray[np.int32]) -> dict[str, Any]:
    """sim_requests' draft and accepted tokens (of rows ``rq`` of ``res.rq``): null columns
    when no request of the scenario had drafts (as sim_steps' when no row has)."""
    if not res.rq[:, R_SPEC_DRAFT].any():
        return {c: pa.nulls(len(rq), pa.int32()) for c in SPEC_REQUEST_COLUMNS}
    return {
        "num_draft_tokens": rq[:, R_SPEC_DRAFT].astype(np.int32),
        "num_accepted_tokens": rq[:, R_SPEC_ACC].astype(np.int32),
    }


def _transfer(res: SimResult, rows: slice, n: int) -> pa.Array:
    """Each request's KV transfer, prefill done to KV landed (null: not disaggregated)."""
    if res.disagg_times is None:
        return pa.nulls(n, pa.float64())
    t = res.disagg_times[rows]
    s = t[:, 1] - t[:, 0]
    return pa.array(s, mask=np.isnan(s))


def write_sim_requests(
    out: TableWriter,
    name: str,
    ids: pa.Array,
    res: SimResult,
    rows_per_group: int = CHUNK_ROWS,
    *,
    pools: pa.Array | None = None,
) -> Path:
    """Write the sim_requests rows of one scenario through ``out``, a row group at a time.

    Only a few groups' tables exist at once (not the whole scenario's).
    """
    # each group's table is built here while the one before is encoded on the writer's thread
    with out, BackgroundWriter(out) as bg:
        for a in range(0, res.num_requests, rows_per_group):
            bg.write(sim_requests_table(name, ids, res, slice(a, a + rows_per_group), pools=pools))
    return out.path


def sim_steps_table(
    name: str,
    st: npt.NDArray[np.int64],
    stf: npt.NDArray[np.float64],
    num_kv_blocks: int,
    *,
    pool: str | None = None,
    role: npt.NDArray[np.int8] | None = None,
) -> pa.Table:
    """The sim_steps rows of timeline rows ``st``/``stf`` of one scenario (runs of
    identical decode steps are one row); ``pool``: the fleet's pool they are of;
    ``role``: per row, its worker's role when disaggregated (``disagg.ROLE_*``).

    The table owns its memory: the columns of ``st``/``stf`` are strided views,
    which pyarrow copies, so the loop may refill a chunk's arrays afterwards.
    """
    n = len(st)
    i32 = np.int32
    return pa.table(
        {
            "scenario": _constant_strings(name, n),
            "pool": _constant_strings(pool, n) if pool is not None else pa.nulls(n, pa.string()),
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
            "role": _roles(role, n),
            "sched_cpu_s": stf[:, SF_SCHED_CPU],
            "sched_cpu_exposed_s": stf[:, SF_SCHED_EXPOSED],
            "swap_out_bytes": st[:, S_SWAP_OUT],
            "swap_in_bytes": st[:, S_SWAP_IN],
            **_speculation(st),
            "cpu_hit_tokens": st[:, S_CPU_HIT],
            "disk_hit_tokens": st[:, S_DISK_HIT],
            "tier_load_bytes": st[:, S_TIER_LOAD],
        }
    )


def _speculation(st: npt.NDArray[np.int64]) -> dict[str, Any]:
    """sim_steps' draft and accepted tokens per row: null columns when no row has drafts."""
    n = len(st)
    if not st[:, S_SPEC_DRAFT].any():
        return {c: pa.nulls(n, pa.int64()) for c in ("num_draft_tokens", "num_accepted_tokens")}
    return {"num_draft_tokens": st[:, S_SPEC_DRAFT], "num_accepted_tokens": st[:, S_SPEC_ACC]}


_ROLES = pa.array(["prefill", "decode"])  # by disagg.ROLE_*


def _roles(role: npt.NDArray[np.int8] | None, n: int) -> pa.Array:
    if role is None:
        return pa.nulls(n, pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(role.astype(np.int32)), _ROLES).cast(pa.string())
