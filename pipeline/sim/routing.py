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
Each replica is simulated up to the arrival time before the router looks at
it: every step that starts before the arrival has been decided, and requests
of a step still running at that time are outstanding.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.cache import lookup
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
)

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


@njit(cache=True, error_model="numpy")
def least_outstanding(rp: npt.NDArray[np.int64], rpf: npt.NDArray[np.float64], t: float) -> int:
    best = 0
    best_n = outstanding(rp, rpf, 0, t)
    for r in range(1, rp.shape[0]):
        n = outstanding(rp, rpf, r, t)
        if n < best_n:
            best = r
            best_n = n
    return best


@njit(cache=True, error_model="numpy")
def prefix_aware(
    cfg: npt.NDArray[np.int64],
    cfgf: npt.NDArray[np.float64],
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    rpf: npt.NDArray[np.float64],
    i: int,
    t: float,
    kc: tuple,  # type: ignore[type-arg]
) -> int:
    """Replica for request i arriving at t: longest cached prefix unless load is imbalanced."""
    num = rp.shape[0]
    loads = np.empty(num, dtype=np.int64)
    lo = 0
    for r in range(num):
        loads[r] = outstanding(rp, rpf, r, t)
        if loads[r] < loads[lo]:
            lo = r
    hi = int(loads.max())
    if hi - loads[lo] > cfg[C_BAL_ABS] and hi > cfgf[CF_BAL_REL] * loads[lo]:
        return lo
    u = rq[i, R_UNIT_TOK]
    if u == 0:
        return lo
    best = -1
    best_units = 0
    for r in range(num):
        h, _ = lookup(rq, i, r, rq[i, R_NUNITS], kc)
        if h > best_units or (h == best_units and best >= 0 and loads[r] < loads[best]):
            best = r
            best_units = h
    if best >= 0 and best_units > 0 and best_units * u > cfgf[CF_CACHE_THRESHOLD] * rq[i, R_PROMPT]:
        return best
    return lo
