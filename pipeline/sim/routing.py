"""Routers: which replica an arriving request goes to.

- ``round_robin``: the k-th request (in arrival order) goes to replica k mod N.
- ``least_outstanding``: the replica with the fewest outstanding requests at
  the arrival time (routed there and not finished by then; lowest index on a
  tie), like Vidur's ``lor`` global scheduler and most gateways' default.
- ``prefix_aware``: the cache-aware rule of SGLang's router (and vLLM's
  router), against the replicas' actual prefix caches (as llm-d's precise
  prefix scorer sees them through KV events, with no staleness). If the load is
  imbalanced, ``max - min > balance_abs_threshold`` and ``max >
  balance_rel_threshold * min`` outstanding requests, the least-loaded replica;
  otherwise the replica whose cache holds the longest prefix of the request
  (ties: fewer outstanding, then lowest index), if that prefix is more than
  ``cache_threshold`` of the prompt; otherwise the least-loaded replica.
  (SGLang's router then takes the replica with the smallest prefix tree, its
  proxy for the most room; replica caches are full in steady state, so load is
  used instead.)

A request that finishes exactly at the arrival time is no longer outstanding.
The router sees each replica as simulated up to the arrival time: every step
that starts before the arrival has been decided, and requests of a step still
running at that time are outstanding. (The loop keeps the counts in a load
tree, ``trees.py``, so that a routing decision costs O(log R) plus, for
``prefix_aware``, the prefix walk; see ``loop.py`` for how replicas are
advanced lazily.)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.cache import PrefixCaches, hit_tokens
from pipeline.sim.prefix_index import find_key
from pipeline.sim.state import (
    C_BAL_ABS,
    CF_BAL_REL,
    CF_CACHE_THRESHOLD,
    P_DONE,
    P_LAST_DONE,
    P_ROUTED,
    Q_LAST_END,
    R_NUNITS,
    R_PROMPT,
    R_UNIT_TOK,
    W_HOFF,
    wide,
)
from pipeline.sim.trees import load_of

ROUND_ROBIN = 0
LEAST_OUTSTANDING = 1
PREFIX_AWARE = 2
ROUTERS: dict[str, int] = {
    "round_robin": ROUND_ROBIN,
    "least_outstanding": LEAST_OUTSTANDING,
    "prefix_aware": PREFIX_AWARE,
}
# parameters of prefix_aware: name -> (default, help); SGLang router's defaults
ROUTER_PARAMS: dict[str, tuple[float, str]] = {
    "cache_threshold": (0.3, "prefix_aware: least share of the prompt cached to follow the cache"),
    "balance_abs_threshold": (64, "prefix_aware: outstanding-request gap that means imbalance"),
    "balance_rel_threshold": (1.5, "prefix_aware: max/min load ratio that means imbalance"),
}


@njit(cache=True, error_model="numpy")
def outstanding(rp: npt.NDArray[np.int64], rpf: npt.NDArray[np.float64], r: int, t: float) -> int:
    """Requests routed to replica r and not finished by time t."""
    n = rp[r, P_ROUTED] - rp[r, P_DONE]
    if rpf[r, Q_LAST_END] > t:  # its latest step ends after t: those completions are pending
        n += rp[r, P_LAST_DONE]
    return n


@njit(cache=True, error_model="numpy", inline="always")
def least_outstanding(lmin: npt.NDArray[np.int64], li: npt.NDArray[np.int64]) -> int:
    """The least-loaded replica (lowest index on a tie): the load tree's root."""
    return int(li[1])


@njit(cache=True, error_model="numpy", inline="always")
def imbalanced(
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    lmin: npt.NDArray[np.int64],
    lmax: npt.NDArray[np.int64],
) -> bool:
    """prefix_aware's test: the load gap and ratio both over their thresholds."""
    lo_n = lmin[1]
    hi = lmax[1]
    return bool(hi - lo_n > cfg[C_BAL_ABS] and hi > cfgf[CF_BAL_REL] * lo_n)


@njit(cache=True, error_model="numpy")
def prefix_aware(
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    i: int,
    kc: PrefixCaches,
    lmin: npt.NDArray[np.int64],
    li: npt.NDArray[np.int64],
    lmax: npt.NDArray[np.int64],
    routable: npt.NDArray[np.uint64],
) -> int:
    """Replica for request i: longest cached prefix unless load is imbalanced.

    ``routable``: the replicas it may choose, as bits (autoscale.py); empty: all
    (the load tree leaves out the others already).

    The loads are the load tree's (``trees.py``); the replicas holding the
    longest prefix come from the replica index (``prefix_index.py``): the
    set of replicas holding units 0..h-1, narrowed unit by unit until it
    would be empty, is the set whose caches hold the longest prefix, h units
    (a replica's cache lookup stops at its first miss). Cost: one probe per
    unit matched plus one per replica in that set, not one lookup per replica.
    """
    lo = int(li[1])
    if imbalanced(cfg, cfgf, lmin, lmax):
        return lo
    u = rq[i, R_UNIT_TOK]
    n = rq[i, R_NUNITS]
    if u == 0 or n == 0:
        return lo
    ukey, gk, gb, gn = kc.ukey, kc.gk, kc.gb, kc.gn
    base = wide(rq)[i, W_HOFF]
    e = find_key(gk, gn, ukey[base])
    if e < 0:
        return lo
    words = gb.shape[1]
    held = gb[e].copy()  # replicas holding every unit so far
    if routable.shape[0] > 0:
        some = False
        for w in range(words):
            held[w] &= routable[w]
            some = some or held[w] != 0
        if not some:
            return lo
    h = 1
    while h < n:
        e = find_key(gk, gn, ukey[base + h])
        if e < 0:
            break
        any_left = False
        for w in range(words):
            if held[w] & gb[e, w]:
                any_left = True
                break
        if not any_left:
            break
        for w in range(words):
            held[w] &= gb[e, w]
        h += 1
    if not hit_tokens(rq, i, h) > cfgf[CF_CACHE_THRESHOLD] * rq[i, R_PROMPT]:
        return lo
    best = -1
    best_n = 0
    for w in range(words):  # the least loaded of them, lowest index on a tie
        m = held[w]
        b = 0
        while m:
            if m & np.uint64(1):
                r = 64 * w + b
                load = load_of(lmin, r)
                if best < 0 or load < best_n:
                    best = r
                    best_n = load
            m >>= np.uint64(1)
            b += 1
    return best
