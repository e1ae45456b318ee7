"""SGLang (``python/sglang/srt/managers/scheduler.py``, ``schedule_policy.py``).

One step is either a **prefill batch** or a **decode step**, never both
(``--enable-mixed-chunk`` is off by default): a prefill batch runs whenever one
can be formed, else the running requests decode.

Prefill batch (``get_new_batch_prefill`` and ``PrefillAdder``). None is tried
while ``batch_is_full`` is set or nobody waits, unless a request is in chunked
prefill. The waiting queue is first sorted in place by ``schedule_policy``
(``fcfs``: not at all; ``lpm``: longest cached prefix first, but FCFS when more
than 128 wait; ``dfs-weight``: depth-first over the prefix tree of the waiting
requests, heavier subtrees first; ``lof``: longest output first; ``random``).
The request in chunked prefill goes first and takes its next chunk of at most
``chunked_prefill_size`` tokens (and at most the memory left after the running
requests' reservation, when that is at least a token); a chunk that spends the
token budget ends the batch. Then, in queue order, while fewer than
``max_running_requests`` run: a request's extend tokens (after its cache hit)
plus ``min(max_new_tokens - generated, 4096)`` plus one page must be below the
free and evictable tokens minus ``Σ min(max_new - generated, 4096) ×
new_token_ratio`` over the running requests and what this batch has taken,
each admitted request counting one page more (else NO_TOKEN: ``batch_is_full``
is set and the batch closes); without chunking, beyond the first, its extend
tokens must be below what is left of ``max_prefill_tokens`` (else the batch
closes); it is truncated to what is left of ``chunked_prefill_size`` (and
becomes the chunked request). These rules follow SGLang 0.5.23
(``PrefillAdder``, ``PrefillBudget``), checked by tests/conformance. Its KV is
allocated after the batch is formed and its prompt units are inserted into the
radix cache at the end of the step (identical units computed twice are shared,
the second copy freed).

Decode step (``update_running_batch``). Finished requests leave the running
batch here (they still count against ``max_running_requests`` until then);
``batch_is_full`` is cleared when the batch shrank. If the next tokens do not
fit in free plus evictable KV (evicting LRU cache leaves as needed), requests
are **retracted**: fewest generated tokens first (ties: longest prompt), at
least one, and more while the rest lack room for 20 more tokens each; they
lose their KV (recompute) and go to the back of the waiting queue, and
``new_token_ratio = min(1, (Σ generated + 20 n) / Σ max_new_tokens)`` over the
n left. Otherwise ``new_token_ratio`` decays by ``(init - min) / 600`` per step
to ``min = 0.14 init`` (``init = min(0.7 × schedule_conservativeness, 1)``).

Memory is counted in tokens: ``block_size`` is SGLang's ``page_size`` (1 by
default: token-granular KV). ``max_new_tokens`` is taken to be the request's
output length: a trace does not say what the client asked for, and a larger
one would only make admission more conservative. Not modelled: in-batch prefix
de-duplication, priority scheduling, hierarchical cache, mixed chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.cache import (
    PrefixCaches,
    capacity,
    commit,
    hit_tokens,
    lookup,
    make_free,
    settles,
    take,
    units_within,
    use_hits,
)
from pipeline.sim.kv import blocks_needed, grow
from pipeline.sim.policies.base import (
    Memory,
    Policy,
    add_scheduled,
    choice,
    count_lookup,
    num_tokens,
    positive,
    retract,
    start,
)
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_CACHING,
    C_CHUNK,
    C_MAX_PREFILL,
    C_MAX_SEQS,
    C_ORDER,
    CF_RATIO_DECAY,
    CF_RATIO_INIT,
    CF_RATIO_MIN,
    P_CHUNKED,
    P_FULL,
    P_PENDING,
    P_RNG,
    P_RUN_N,
    P_STABLE,
    P_WQ_HEAD,
    P_WQ_LEN,
    Q_RATIO,
    R_COMPUTED,
    R_GENERATED,
    R_HELD,
    R_OUTPUT,
    R_PROMPT,
    R_UNIT_TOK,
    W_HOFF,
    State,
    cdiv,
    wide,
    wq_pop_front,
)

CODE = 4

ORDERS = ("fcfs", "lpm", "dfs-weight", "lof", "random")
FCFS, LPM, DFS_WEIGHT, LOF, RANDOM = range(5)
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20
LPM_FALLBACK_QUEUE = 128  # lpm sorts only up to this many waiting requests
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600

CONTINUE = 0
NO_TOKEN = 1
OTHER = 2


@dataclass(frozen=True)
class Params:
    max_prefill_tokens: int = field(
        default=16384, metadata={"help": "prompt tokens one prefill batch may take"}
    )
    chunked_prefill_size: int = field(
        default=8192,
        metadata={
            "help": "most prompt tokens of a request per prefill batch (-1 = no chunking)",
            "lo": -1,
        },
    )
    max_running_requests: int = field(
        default=0,
        metadata={"help": "most requests running (0 = SGLang's default from the KV size)"},
    )
    schedule_policy: str = field(
        default="fcfs", metadata={"help": "waiting order: " + " | ".join(ORDERS)}
    )
    schedule_conservativeness: float = field(
        default=1.0, metadata={"help": "scales the initial new_token_ratio (0.7)"}
    )
    overlap_schedule: bool = field(
        default=True,
        metadata={
            "help": "the overlap scheduler: the next batch is scheduled while the GPU runs "
            "this one, hiding the scheduler's CPU time (SGLang's default; false: "
            "--disable-overlap-schedule). Only the step time (sched_cpu.py) depends on it"
        },
    )


def max_running(params: Params, mem: Memory) -> int:
    """``max_running_requests``, or SGLang's default: min(KV tokens / 2, the request pool).

    The request pool holds min(max(KV tokens / context length × 512, 2048), 4096)
    (``ModelRunner``); the scheduler takes min(KV tokens // 2, that).
    """
    if params.max_running_requests > 0:
        return params.max_running_requests
    tokens = mem.num_gpu_blocks * mem.block_size
    pool = min(max(int(tokens / mem.max_model_len * 512), 2048), 4096)
    return max(1, min(tokens // 2, pool))


class SglangPolicy(Policy):
    name = "sglang"
    code = CODE
    summary = (
        "SGLang: prefill-first, conservative admission with new_token_ratio, retraction, "
        "radix cache, schedule policies"
    )
    Params = Params
    block_size = 1
    prefix_caching = True
    dedupe = True

    def check(self, params: Any, mem: Memory) -> None:
        p: Params = params
        choice("schedule_policy", p.schedule_policy, ORDERS)
        positive("max_prefill_tokens", p.max_prefill_tokens)
        positive("max_running_requests", p.max_running_requests, zero_ok=True)
        positive("schedule_conservativeness", p.schedule_conservativeness)
        if p.chunked_prefill_size != -1 and p.chunked_prefill_size < mem.block_size:
            raise ScenarioError(
                f"chunked_prefill_size must be -1 (no chunking) or >= block_size "
                f"({mem.block_size}), got {p.chunked_prefill_size}"
            )

    def pack(self, params: Any, mem: Memory) -> tuple[dict[int, int], dict[int, float]]:
        p: Params = params
        init = min(INIT_NEW_TOKEN_RATIO * p.schedule_conservativeness, 1.0)
        low = init * MIN_NEW_TOKEN_RATIO_FACTOR
        return (
            {
                C_MAX_SEQS: max_running(p, mem),
                C_MAX_PREFILL: p.max_prefill_tokens,
                C_CHUNK: max(p.chunked_prefill_size, 0),
                C_ORDER: ORDERS.index(p.schedule_policy),
            },
            {
                CF_RATIO_INIT: init,
                CF_RATIO_MIN: low,
                CF_RATIO_DECAY: (init - low) / NEW_TOKEN_RATIO_DECAY_STEPS,
            },
        )

    def blocks_alone(
        self,
        params: Any,
        mem: Memory,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        # admitted alone: prompt + min(output, 4096) + a page must be below the KV tokens
        admit = (prompt + np.minimum(output, CLIP_MAX_NEW_TOKENS)) // mem.block_size + 2
        return np.maximum(super().blocks_alone(params, mem, prompt, output), admit)


POLICY = SglangPolicy()


@njit(cache=True, error_model="numpy")
def decay(cfgf: npt.NDArray[np.float64], rpf: npt.NDArray[np.float64], r: int, steps: int) -> None:
    """``steps`` decode steps without retraction: new_token_ratio decays, step by step."""
    low = cfgf[CF_RATIO_MIN]
    x = rpf[r, Q_RATIO]
    for _ in range(steps):
        if x <= low:
            break
        x = max(x - cfgf[CF_RATIO_DECAY], low)
    rpf[r, Q_RATIO] = x


@njit(cache=True, error_model="numpy", inline="always")
def on_decode_run(s: State, r: int, steps: int) -> None:
    """The decode steps of a run decay new_token_ratio as each step would."""
    cfgf, rpf = s.cfgf, s.rpf
    decay(cfgf, rpf, r, steps)


@njit(cache=True, error_model="numpy", inline="always")
def on_finished(s: State, r: int, done: int, done_decoding: int) -> None:
    """Requests that finished with a decode leave the running batch at the next decode step."""
    rp = s.rp
    rp[r, P_PENDING] += done_decoding


@njit(cache=True, error_model="numpy")
def _splitmix(rp: npt.NDArray[np.int64], r: int) -> np.uint64:
    x = np.uint64(rp[r, P_RNG]) + np.uint64(0x9E3779B97F4A7C15)
    rp[r, P_RNG] = np.int64(x)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, error_model="numpy")
def _max_units(rq: npt.NDArray[np.int32], i: int) -> int:
    u = rq[i, R_UNIT_TOK]
    return 0 if u == 0 else units_within(rq, i, num_tokens(rq, i) - 1)


@njit(cache=True, error_model="numpy")
def _stable_order(keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Positions of ``keys`` in ascending order, equal keys in their given order."""
    m = len(keys)
    order = np.arange(m)
    tmp = np.empty(m, dtype=np.int64)
    size = 1
    while size < m:
        for lo in range(0, m, 2 * size):
            mid = min(lo + size, m)
            hi = min(lo + 2 * size, m)
            a = lo
            b = mid
            for k in range(lo, hi):
                if a < mid and (b >= hi or keys[order[a]] <= keys[order[b]]):
                    tmp[k] = order[a]
                    a += 1
                else:
                    tmp[k] = order[b]
                    b += 1
        order, tmp = tmp, order
        size *= 2
    return order


@njit(cache=True, error_model="numpy")
def _dfs_before(
    a: int,
    b: int,
    off: npt.NDArray[np.int64],
    slot: npt.NDArray[np.int64],
    weight: npt.NDArray[np.int64],
    first: npt.NDArray[np.int64],
) -> bool:
    """dfs-weight order of waiting positions a and b, by their paths of cache nodes."""
    la = off[a + 1] - off[a]
    lb = off[b + 1] - off[b]
    for d in range(min(la, lb)):
        ea = off[a] + d
        eb = off[b] + d
        if slot[ea] != slot[eb]:
            if weight[ea] != weight[eb]:
                return bool(weight[ea] > weight[eb])  # heavier subtree first
            return bool(first[ea] < first[eb])
    if la != lb:
        return bool(la > lb)  # a node's subtrees come before its own requests
    return a < b


@njit(cache=True, error_model="numpy")
def _dfs_order(
    rq: npt.NDArray[np.int32],
    r: int,
    q: npt.NDArray[np.int64],
    kc: PrefixCaches,
) -> npt.NDArray[np.int64]:
    """Positions of q in dfs-weight order (SGLang's ``_sort_by_dfs_weight``).

    A request sits at the tree node where its cached prefix ends; the order is
    a depth-first walk, children by descending number of waiting requests below
    them (ties: the one reached first in queue order), each node's own requests
    after its children's, in queue order.
    """
    uslot = kc.uslot
    m = len(q)
    off = np.zeros(m + 1, dtype=np.int64)
    for j in range(m):
        h, _ = lookup(rq, q[j], r, _max_units(rq, q[j]), kc)
        off[j + 1] = off[j] + h
    total = off[m]
    slot = np.empty(total, dtype=np.int64)  # node (cache slot) of each path entry
    owner = np.empty(total, dtype=np.int64)
    for j in range(m):
        base = wide(rq)[q[j], W_HOFF]
        for d in range(off[j + 1] - off[j]):
            slot[off[j] + d] = uslot[base + d]  # written by lookup above
            owner[off[j] + d] = j
    # weight (requests through the node) and first (earliest of them), per entry
    weight = np.empty(total, dtype=np.int64)
    first = np.empty(total, dtype=np.int64)
    grouped = _stable_order(slot)
    lo = 0
    while lo < total:
        hi = lo
        while hi < total and slot[grouped[hi]] == slot[grouped[lo]]:
            hi += 1
        for k in range(lo, hi):
            weight[grouped[k]] = hi - lo
            first[grouped[k]] = owner[grouped[lo]]
        lo = hi
    # stable merge sort of the positions with the comparator
    order = np.arange(m)
    tmp = np.empty(m, dtype=np.int64)
    size = 1
    while size < m:
        for lo in range(0, m, 2 * size):
            mid = min(lo + size, m)
            hi = min(lo + 2 * size, m)
            a = lo
            b = mid
            for k in range(lo, hi):
                if a < mid and (
                    b >= hi or not _dfs_before(order[b], order[a], off, slot, weight, first)
                ):
                    tmp[k] = order[a]
                    a += 1
                else:
                    tmp[k] = order[b]
                    b += 1
        order, tmp = tmp, order
        size *= 2
    return order


@njit(cache=True, error_model="numpy")
def _sort_waiting(
    cfg: npt.NDArray[np.int64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    wq: npt.NDArray[np.int32],
    r: int,
    kc: PrefixCaches,
) -> None:
    """``calc_priority``: reorder the waiting queue in place by schedule_policy."""
    policy = cfg[C_ORDER]
    m = rp[r, P_WQ_LEN]
    if policy == FCFS or m < 2:
        return
    caching = cfg[C_CACHING] != 0
    if (policy == LPM or policy == DFS_WEIGHT) and not caching:
        return  # no radix cache: cache-aware policies fall back to fcfs
    if policy == LPM and m > LPM_FALLBACK_QUEUE:
        return
    cap = wq.shape[1]
    head = rp[r, P_WQ_HEAD]
    q = np.empty(m, dtype=np.int64)
    for j in range(m):
        q[j] = wq[r, (head + j) % cap]
    if policy == RANDOM:  # random.shuffle
        for j in range(m - 1, 0, -1):
            x = int(_splitmix(rp, r) % np.uint64(j + 1))
            t = q[j]
            q[j] = q[x]
            q[x] = t
        order = np.arange(m)
    elif policy == DFS_WEIGHT:
        order = _dfs_order(rq, r, q, kc)
    else:
        key = np.empty(m, dtype=np.int64)
        for j in range(m):
            i = q[j]
            if policy == LPM:
                h, _ = lookup(rq, i, r, _max_units(rq, i), kc)
                key[j] = -hit_tokens(rq, i, h)
            else:  # LOF
                key[j] = -rq[i, R_OUTPUT]
        order = _stable_order(key)
    for j in range(m):
        wq[r, (head + j) % cap] = q[order[j]]


@njit(cache=True, error_model="numpy")
def _prefill(s: State, kc: PrefixCaches, r: int) -> tuple[int, int]:
    """Form a prefill batch: (requests scheduled, requests admitted); (0, 0) if none."""
    cfg, rq, rp, rpf, run, wq, sched_q = s.cfg, s.rq, s.rp, s.rpf, s.run, s.wq, s.sched_q
    sched_t = s.sched_t
    chunked = rp[r, P_CHUNKED]
    if (rp[r, P_FULL] == 1 or rp[r, P_WQ_LEN] == 0) and chunked < 0:
        return 0, 0
    bs = cfg[C_BLOCK_SIZE]
    running_bs = rp[r, P_RUN_N] + rp[r, P_PENDING] - (1 if chunked >= 0 else 0)
    allocatable = cfg[C_MAX_SEQS] - running_bs
    if allocatable <= 0 and chunked < 0:
        rp[r, P_FULL] = 1
        return 0, 0
    _sort_waiting(cfg, rq, rp, wq, r, kc)
    caching = cfg[C_CACHING] != 0
    chunking = cfg[C_CHUNK] > 0
    ratio = rpf[r, Q_RATIO]
    offset_total = 0.0  # tokens reserved: running requests' expected decodes, this batch
    for k in range(rp[r, P_RUN_N]):
        i = run[r, k]
        if i != chunked:
            offset_total += min(rq[i, R_OUTPUT] - rq[i, R_GENERATED], CLIP_MAX_NEW_TOKENS) * ratio
    offset_cur = 0
    rem_input = cfg[C_MAX_PREFILL]
    rem_chunk = cfg[C_CHUNK]
    n = 0
    new_chunked = -1
    if chunked >= 0:
        ext = num_tokens(rq, chunked) - rq[chunked, R_COMPUTED]
        limit = rem_chunk  # available_chunk_tokens: capped by the memory left, if any
        left = capacity(rp, r) * bs - offset_total
        if left >= 1:
            limit = min(limit, int(left))
        truncated = chunking and ext > limit
        if truncated:
            ext = limit
            new_chunked = chunked
        n = add_scheduled(sched_q, sched_t, n, chunked, ext)
        paged = cdiv(ext, bs) * bs
        reserve = 0 if truncated else min(rq[chunked, R_OUTPUT], CLIP_MAX_NEW_TOKENS)
        offset_total += paged + bs + reserve  # reserve(): one page more per request
        offset_cur += paged + bs
        rem_input -= paged
        rem_chunk -= paged
    n_adm = 0
    cap = wq.shape[1]
    head = rp[r, P_WQ_HEAD]
    for j in range(rp[r, P_WQ_LEN]):
        room = capacity(rp, r) * bs - offset_total > 0 and capacity(rp, r) * bs - offset_cur > 0
        if room and (rem_input <= 0 or (chunking and rem_chunk <= 0)):
            break  # budget_state() == OTHER: the chunked request spent the budget
        if n >= allocatable:
            rp[r, P_FULL] = 1
            break
        i = int(wq[r, (head + j) % cap])
        h = 0
        idle = 0
        if caching and rq[i, R_COMPUTED] == 0:
            h, idle = lookup(rq, i, r, _max_units(rq, i), kc)
        prefix = hit_tokens(rq, i, h)
        ext = num_tokens(rq, i) - prefix
        # + a page: per_req_token_overhead, for the allocator's page alignment
        total = ext + min(rq[i, R_OUTPUT] - rq[i, R_GENERATED], CLIP_MAX_NEW_TOKENS) + bs
        if total >= capacity(rp, r) * bs - offset_total:
            rp[r, P_FULL] = 1
            break
        paged = cdiv(ext, bs) * bs
        if not chunking and paged >= rem_input and n > 0:  # input cap: unchunked only
            break
        if total >= (capacity(rp, r) - idle) * bs - offset_total:  # after locking its prefix
            rp[r, P_FULL] = 1
            break
        reserve = min(rq[i, R_OUTPUT] - rq[i, R_GENERATED], CLIP_MAX_NEW_TOKENS)
        if chunking and paged > rem_chunk:
            trunc = rem_chunk // bs * bs
            if trunc <= 0:
                break
            ext = trunc
            paged = trunc
            reserve = 0
            new_chunked = i
        if h > 0:
            use_hits(rq, rp, i, r, h, kc)
            rq[i, R_COMPUTED] = prefix
        if caching:
            count_lookup(rq, rp, r, i, h)
        n = add_scheduled(sched_q, sched_t, n, i, ext)
        n_adm += 1
        offset_total += paged + bs + reserve
        offset_cur += paged + bs
        rem_input -= paged
        rem_chunk -= paged
        if capacity(rp, r) * bs - offset_total <= 0 or capacity(rp, r) * bs - offset_cur <= 0:
            rp[r, P_FULL] = 1
            break
        if rem_input <= 0 or (chunking and rem_chunk <= 0):
            break
    if n == 0:
        return 0, 0
    # the admitted requests are the head of the (sorted) queue: start them, in order
    first = 1 if chunked >= 0 else 0
    for _ in range(first, n):
        i = wq_pop_front(wq, rp, r)
        start(rq, i)
        run[r, rp[r, P_RUN_N]] = i
        rp[r, P_RUN_N] += 1
    # allocate the batch's KV, then insert its computed units into the radix cache
    for j in range(n):
        i = sched_q[j]
        grow(rq, rp, r, i, rq[i, R_COMPUTED] + sched_t[j], bs, 0, kc)
    if caching:
        for j in range(n):
            i = sched_q[j]
            if settles(rq, i, rq[i, R_COMPUTED] + sched_t[j]):
                commit(rq, rp, i, r, rq[i, R_COMPUTED] + sched_t[j], True, kc)
    rp[r, P_CHUNKED] = new_chunked
    return n, n_adm


@njit(cache=True, error_model="numpy")
def _decode(s: State, kc: PrefixCaches, r: int) -> tuple[int, int]:
    """A decode step of every running request, retracting first if KV is short."""
    cfg, cfgf, rq, rp, rpf, run, wq = s.cfg, s.cfgf, s.rq, s.rp, s.rpf, s.run, s.wq
    sched_q, sched_t = s.sched_q, s.sched_t
    bs = cfg[C_BLOCK_SIZE]
    m = rp[r, P_RUN_N]
    need = 0
    for k in range(m):
        i = run[r, k]
        need += blocks_needed(rq, i, rq[i, R_COMPUTED] + 1, bs)
    n_pre = 0
    if not make_free(rp, r, need, kc):
        # victims from the end of the running batch sorted by (generated, -prompt),
        # descending and stable: fewest generated first, ties the longest prompt
        key = np.empty(m, dtype=np.int64)
        for k in range(m):
            i = run[r, k]
            key[k] = -rq[i, R_GENERATED] * (1 << 32) + rq[i, R_PROMPT]
        order = _stable_order(key)
        left = m
        gone = np.zeros(m, dtype=np.bool_)
        while True:
            if n_pre > 0:
                need = 0
                for j in range(left):
                    i = run[r, order[j]]
                    if blocks_needed(rq, i, rq[i, R_COMPUTED] + 1, bs) > 0:
                        need += RETRACT_DECODE_STEPS
                if make_free(rp, r, need, kc):
                    break
            if left == 1:
                break
            left -= 1
            gone[order[left]] = True
            retract(rq, rp, wq, r, run[r, order[left]], kc)
            n_pre += 1
        decoded = 0
        wanted = 0
        k2 = 0
        for k in range(m):
            i = run[r, k]
            if not gone[k]:
                run[r, k2] = i
                k2 += 1
                decoded += rq[i, R_GENERATED]
                wanted += rq[i, R_OUTPUT]
        rp[r, P_RUN_N] = k2
        rpf[r, Q_RATIO] = min(1.0, (decoded + RETRACT_DECODE_STEPS * k2) / wanted)
    else:
        decay(cfgf, rpf, r, 1)
    n = 0
    total = 0
    for k in range(rp[r, P_RUN_N]):
        i = run[r, k]
        b = blocks_needed(rq, i, rq[i, R_COMPUTED] + 1, bs)
        rq[i, R_HELD] += b
        total += b
        n = add_scheduled(sched_q, sched_t, n, i, 1)
    take(rp, r, total, kc)  # fits: checked above (or by the retraction)
    return n, n_pre


@njit(cache=True, error_model="numpy")
def schedule(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
    rp = s.rp
    rp[r, P_STABLE] = 0
    if rp[r, P_RUN_N] == 0 and rp[r, P_PENDING] == 0:
        rp[r, P_FULL] = 0  # an empty running batch is a fresh one
    for _ in range(2):
        n, n_adm = _prefill(s, kc, r)
        if n > 0:
            return n, 0, n_adm
        initial = rp[r, P_RUN_N] + rp[r, P_PENDING]
        if initial == 0:
            return 0, 0, 0
        rp[r, P_PENDING] = 0  # filter_batch
        if rp[r, P_RUN_N] == 0:  # an empty batch: nothing to decode, try again
            rp[r, P_FULL] = 0
            continue
        n, n_pre = _decode(s, kc, r)
        if rp[r, P_RUN_N] < initial:
            rp[r, P_FULL] = 0
        if rp[r, P_FULL] == 1 or rp[r, P_WQ_LEN] == 0:
            rp[r, P_STABLE] = 1
        return n, n_pre, 0
    return 0, 0, 0
