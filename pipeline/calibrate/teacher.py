"""Each replayed request's latency as a linear function of the profile's cost terms, with
the batches the replay formed held fixed (teacher forcing).

A step's time is a sum of parts, each one group of the cost model's coefficients times
what the step computes (``GROUPS``; with the roofline's leading side, compute or memory,
taken as the replay found it):

    compute   flop_s_per_token, flop_s_per_seq, flop_s_per_attn, comm_s_per_token
    memory    mem_s_weights, mem_s_per_token, mem_s_per_kv_token
    step      fixed_s, comm_s_fixed
    sequence  seq_s
    launch    prefill_fixed_s (one per step that computes prompt tokens)

so a step's time under a profile whose groups are scaled by ``s`` is ``sum_g s_g part_g``.
A request's engine TTFT is the time from its arrival to the end of the step that gave its
first token: the share of the step running at its arrival that was left, and every step
after it up to that one, on its replica; its decode time (E2E - TTFT) the steps after that
up to the one that gave its last token. Both are sums of step parts, so each request gets
a row of per-group seconds (``TeacherRows``), exact at ``s = 1``: ``ttft = rows.ttft @ s +
rows.ttft_rest``. The replay's timeline (sim_steps' columns, kept whole) is all it needs.

Scaling the groups changes the batches a new replay would form (a faster step means less
queueing): ``calibrate observed`` fits on these rows, replays with the fit, and repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.sim.cost_model import (
    COMM_FIXED,
    COMM_TOK,
    FIXED_S,
    FLOP_ATTN,
    FLOP_HALF,
    FLOP_SEQ,
    FLOP_TOK,
    KNEE_S,
    KNEE_TOKENS,
    MEM_KV,
    MEM_TOK,
    MEM_W,
    OVERLAP,
    PREFILL_SEQ,
    PREFILL_STEP,
    SEP_ATTN,
    SEQ_S,
)
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_TOKEN,
    R_OUTPUT,
    R_PROMPT,
    R_REPLICA,
    S_DECODE,
    S_NUM_STEPS,
    S_PREFILL,
    S_REPLICA,
    S_RUNNING,
    SF_ATTN,
    SF_CTX,
    SF_DURATION,
    SF_START,
    SimResult,
)

F64 = npt.NDArray[np.float64]

GROUPS: dict[str, tuple[str, ...]] = {
    "compute": (
        "flop_s_per_token",
        "flop_s_per_seq",
        "flop_s_per_attn",
        "comm_s_per_token",
        "prefill_knee_s",
    ),
    "memory": ("mem_s_weights", "mem_s_per_token", "mem_s_per_kv_token"),
    "step": ("fixed_s", "comm_s_fixed"),
    "sequence": ("seq_s", "prefill_seq_s"),
    "launch": ("prefill_fixed_s",),
}
NAMES = tuple(GROUPS)
COMPUTE, MEMORY, STEP, SEQUENCE, LAUNCH = range(len(NAMES))


def step_parts(c: F64, st: npt.NDArray[np.int64], stf: F64) -> F64:
    """Per timeline row: the seconds of each group (``NAMES`` order) over its steps.

    The ``launch`` column counts the row's steps that compute prompt tokens (its seconds
    are that count times prefill_fixed_s, which may be 0 in the profile).
    """
    k = st[:, S_NUM_STEPS].astype(np.float64)
    p = st[:, S_PREFILL].astype(np.float64)
    d = st[:, S_DECODE].astype(np.float64)
    n = st[:, S_RUNNING].astype(np.float64)
    a = stf[:, SF_ATTN]
    ctx0 = stf[:, SF_CTX]
    # the context summed over the row's steps (a decode run reads d more each step)
    ctx_sum = k * ctx0 + d * k * (k - 1) / 2.0
    ctx_mid = ctx_sum / np.maximum(k, 1.0)
    tok = p + d
    sep = c[SEP_ATTN]
    shared = 1.0 - sep
    lin = c[FLOP_TOK] * (tok + c[FLOP_HALF]) + c[FLOP_SEQ] * n + c[COMM_TOK] * tok
    compute = lin - c[COMM_TOK] * tok + shared * c[FLOP_ATTN] * (a + ctx_mid)
    memory = c[MEM_W] + shared * c[MEM_KV] * ctx_mid + c[MEM_TOK] * tok
    lead = compute >= memory
    ov = c[OVERLAP]
    parts = np.zeros((len(st), len(NAMES)))
    # per step of the row (every step of a run has the same compute and memory but its
    # context; the lead is taken at the run's middle step, exact when attention is apart)
    parts[:, COMPUTE] = np.where(lead, compute, ov * compute) + c[COMM_TOK] * tok
    parts[:, MEMORY] = np.where(lead, ov * memory, memory)
    parts[:, COMPUTE] *= k
    parts[:, MEMORY] *= k
    # the separate attention: prefill pairs are compute; a decode reads its KV (memory)
    # or, where its pairs cost more, computes them
    kv_leads = c[MEM_KV] >= c[FLOP_ATTN]
    parts[:, COMPUTE] += sep * c[FLOP_ATTN] * a * k
    parts[:, COMPUTE] += np.where(p > 0, c[KNEE_S] * np.maximum(p - c[KNEE_TOKENS], 0.0), 0.0)
    decode_attn = sep * max(c[FLOP_ATTN], c[MEM_KV]) * ctx_sum
    parts[:, MEMORY if kv_leads else COMPUTE] += decode_attn
    parts[:, STEP] = k * (c[FIXED_S] + c[COMM_FIXED])
    # per sequence: every sequence's cost, and each prefill chunk's own (N - D of a step
    # that computes prompt tokens)
    parts[:, SEQUENCE] = k * c[SEQ_S] * n + np.where(p > 0, c[PREFILL_SEQ] * (n - d), 0.0)
    parts[:, LAUNCH] = np.where(p > 0, 1.0, 0.0)  # a run (k > 1) never has prompt tokens
    empty = tok <= 0
    parts[empty] = 0.0
    return parts


@dataclass
class TeacherRows:
    """Per request: its engine TTFT and decode time as per-group seconds (``NAMES``) plus
    what no group explains (idle time the replica waited for arrivals, rounding)."""

    ttft: F64  # [n, groups]; LAUNCH column in prefill steps (multiply by prefill_fixed_s)
    ttft_rest: F64  # [n]
    decode: F64  # [n, groups]
    decode_rest: F64  # [n]
    prompt_tokens: F64
    output_tokens: F64
    launch_s: float  # the profile's prefill_fixed_s the rows were taken at

    def engine_ttft(self, s: F64, launch_s: float | None = None) -> F64:
        return self.ttft @ self._weights(s, launch_s) + self.ttft_rest

    def engine_decode(self, s: F64, launch_s: float | None = None) -> F64:
        return self.decode @ self._weights(s, launch_s) + self.decode_rest

    def _weights(self, s: F64, launch_s: float | None) -> F64:
        w = np.asarray(s, dtype=np.float64).copy()
        w[LAUNCH] = self.launch_s if launch_s is None else launch_s
        return w

    def subset(self, mask: npt.NDArray[np.bool_]) -> TeacherRows:
        return TeacherRows(
            self.ttft[mask],
            self.ttft_rest[mask],
            self.decode[mask],
            self.decode_rest[mask],
            self.prompt_tokens[mask],
            self.output_tokens[mask],
            self.launch_s,
        )


def teacher_rows(res: SimResult, cost: F64) -> TeacherRows:
    """The rows of every request of a replay whose timeline was kept whole."""
    st, stf = res.st, res.stf
    n = res.num_requests
    parts = step_parts(cost, st, stf)
    ttft = np.zeros((n, len(NAMES)))
    decode = np.zeros((n, len(NAMES)))
    rq, rqf = res.rq, res.rqf
    arrival = rqf[:, F_ARRIVAL]
    first = rqf[:, F_FIRST_TOKEN]
    finish = rqf[:, F_FINISH]
    replica = rq[:, R_REPLICA]
    # rows in (replica, start) order, each replica a contiguous segment; one cumulative sum
    # of the parts over all of them (a segment's sums are differences within it)
    row_rep = st[:, S_REPLICA]
    start_all = stf[:, SF_START]
    order = np.lexsort((start_all, row_rep))
    ordered = parts[order]
    start = start_all[order]
    end = start + stf[order, SF_DURATION]
    cum = np.vstack([np.zeros(len(NAMES)), np.cumsum(ordered, axis=0)])
    rep_sorted = row_rep[order]
    by_rep = np.argsort(replica, kind="stable")
    rep_of_req = replica[by_rep]
    for r in np.unique(replica):
        lo, hi = np.searchsorted(rep_sorted, [r, r + 1])
        if hi <= lo:
            continue
        q0, q1 = np.searchsorted(rep_of_req, [r, r + 1])
        mine = by_rep[q0:q1]
        seg_end = end[lo:hi]
        a, f, e = arrival[mine], first[mine], finish[mine]
        last = hi - lo - 1
        # rows that end after the arrival (the first of them may have started before it)
        i0 = np.searchsorted(seg_end, a, side="right")
        i_first = np.searchsorted(seg_end, f, side="left")  # the row ending at the first token
        i_last = np.searchsorted(seg_end, e, side="left")
        ok = np.isfinite(f) & (i_first <= last)
        i_first = np.minimum(i_first, last) + lo
        i_last = np.minimum(i_last, last) + lo
        i0c = np.minimum(i0, last) + lo
        # the share of the row running at the arrival that was still to come
        dur0 = end[i0c] - start[i0c]
        inside = (start[i0c] < a) & (i0 <= last)
        frac = np.where(inside & (dur0 > 0), (end[i0c] - a) / np.where(dur0 > 0, dur0, 1.0), 1.0)
        full = cum[i_first + 1] - cum[i0c + 1]  # rows after the arrival's, to the first token
        head = ordered[i0c] * frac[:, None]
        ttft[mine] = np.where(ok[:, None], full + head, 0.0)
        dec = cum[i_last + 1] - cum[i_first + 1]
        done = ok & np.isfinite(e)
        decode[mine] = np.where(done[:, None], dec, 0.0)
    launch_s = float(cost[PREFILL_STEP])
    w = np.ones(len(NAMES))
    w[LAUNCH] = launch_s
    out_tok = rq[:, R_OUTPUT].astype(np.float64)
    with np.errstate(invalid="ignore"):
        ttft_rest = (first - arrival) - ttft @ w
        decode_rest = (finish - first) - decode @ w
    return TeacherRows(
        ttft=ttft,
        ttft_rest=np.nan_to_num(ttft_rest),
        decode=decode,
        decode_rest=np.nan_to_num(decode_rest),
        prompt_tokens=rq[:, R_PROMPT].astype(np.float64),
        output_tokens=out_tok,
        launch_s=launch_s,
    )
