"""Routers: which replica an arriving request goes to.

- ``round_robin``: the k-th request (in arrival order) goes to replica k mod N.
- ``least_outstanding``: the replica with the fewest outstanding requests at
  the arrival time (routed there and not finished by then; lowest index on a
  tie), like Vidur's ``lor`` global scheduler and most gateways' default.

A request that finishes exactly at the arrival time is no longer outstanding.
Each replica is simulated up to the arrival time before the router looks at
it: every step that starts before the arrival has been decided, and requests
of a step still running at that time are outstanding.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.state import P_DONE, P_LAST_DONE, P_ROUTED, Q_LAST_END

ROUND_ROBIN = 0
LEAST_OUTSTANDING = 1
ROUTERS: dict[str, int] = {"round_robin": ROUND_ROBIN, "least_outstanding": LEAST_OUTSTANDING}


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
