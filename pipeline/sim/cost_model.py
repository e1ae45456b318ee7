"""Step cost: how long one engine step takes, from what the step computes.

A step is described by five features (per replica; tensor parallelism is inside
the coefficients):

    num_prefill_tokens   P  prompt tokens computed this step (all prefill chunks)
    prefill_attn         A  attention work of the prefill chunks, in causal (query, key)
                            pairs: sum over chunks of
                            chunk_len * context_before + chunk_len * (chunk_len + 1) / 2
    num_decode_seqs      D  requests computing one decode token
    decode_ctx           C  sum of the context lengths (KV tokens read) of those decodes
    (a fixed overhead)

and the step time is an explicit roofline with overheads:

    compute_s = flop_s_per_token * (P + D) + flop_s_per_attn * (A + C)
    memory_s  = mem_s_weights + mem_s_per_kv_token * C + mem_s_per_token * (P + D)
    step_s    = fixed_s + max(compute_s, memory_s) + comm_s_fixed + comm_s_per_token * (P + D)

Every coefficient is a plain number in a readable JSON profile, so a calibrated
profile (fitted to live measurements) can replace the analytic ones without
touching the simulator. A step with nothing to do costs nothing.

``decode_run_s`` sums k consecutive decode-only steps in closed form: D is
fixed and C grows by D every step, so compute_s and memory_s are linear in the
step index and their max crosses over at most once.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import numpy.typing as npt
from numba import njit

# Index of each coefficient in the array the compiled loop receives.
FIXED_S, FLOP_TOK, FLOP_ATTN, MEM_W, MEM_KV, MEM_TOK, COMM_FIXED, COMM_TOK = range(8)


@dataclass(frozen=True)
class StepCost:
    """Coefficients of the step-time function (seconds, per feature unit)."""

    fixed_s: float  # scheduler + launch overhead per step, incl. per-layer overheads
    flop_s_per_token: float  # linear-layer compute per token (2 * params / (peak * eff))
    flop_s_per_attn: float  # attention compute per (query, key) pair
    mem_s_weights: float  # reading the weights once per step
    mem_s_per_kv_token: float  # reading one token of KV cache (all layers)
    mem_s_per_token: float  # activation traffic per token
    comm_s_fixed: float  # tensor-parallel all-reduce latency per step (0 at TP 1)
    comm_s_per_token: float  # all-reduce bytes per token over link bandwidth

    def as_array(self) -> npt.NDArray[np.float64]:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    def step_s(
        self,
        num_prefill_tokens: float,
        prefill_attn: float,
        num_decode_seqs: float,
        decode_ctx: float,
    ) -> float:
        return float(
            step_time(
                self.as_array(), num_prefill_tokens, prefill_attn, num_decode_seqs, decode_ctx
            )
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> StepCost:
        return cls(**{f.name: float(d[f.name]) for f in fields(cls)})


@njit(cache=True)
def step_time(c: npt.NDArray[np.float64], p: float, a: float, d: float, ctx: float) -> float:
    """Seconds for one step (see the module docstring)."""
    tok = p + d
    if tok <= 0:
        return 0.0
    compute = c[FLOP_TOK] * tok + c[FLOP_ATTN] * (a + ctx)
    memory = c[MEM_W] + c[MEM_KV] * ctx + c[MEM_TOK] * tok
    return c[FIXED_S] + max(compute, memory) + c[COMM_FIXED] + c[COMM_TOK] * tok


@njit(cache=True)
def decode_run_s(c: npt.NDArray[np.float64], d: float, ctx0: float, k: int) -> float:
    """Total seconds of k decode-only steps of d sequences starting at total context ctx0.

    Step j (0-based) has context ctx0 + j*d. Equal to summing step_time over the
    k steps, up to rounding.
    """
    if k <= 0 or d <= 0:
        return 0.0
    # compute_j = a0 + a1*j ; memory_j = b0 + b1*j
    a0 = c[FLOP_TOK] * d + c[FLOP_ATTN] * ctx0
    a1 = c[FLOP_ATTN] * d
    b0 = c[MEM_W] + c[MEM_KV] * ctx0 + c[MEM_TOK] * d
    b1 = c[MEM_KV] * d
    base = k * (c[FIXED_S] + c[COMM_FIXED] + c[COMM_TOK] * d)
    # f(j) = compute_j - memory_j is linear, so the steps where compute leads
    # form a prefix or a suffix of [0, k): split there and sum two series.
    if a1 == b1:  # parallel lines: one leads at every step
        lead0, lead1 = (a0, a1) if a0 >= b0 else (b0, b1)
        return base + k * lead0 + lead1 * k * (k - 1) / 2.0
    cross = (b0 - a0) / (a1 - b1)
    if a1 > b1:  # compute leads from ceil(cross) on
        split = min(max(int(math.ceil(cross)), 0), k)
        p0, p1, q0, q1 = b0, b1, a0, a1
    else:  # compute leads up to floor(cross)
        split = min(max(int(math.floor(cross)) + 1, 0), k)
        p0, p1, q0, q1 = a0, a1, b0, b1
    n2 = k - split
    s1 = split * p0 + p1 * split * (split - 1) / 2.0
    s2 = n2 * q0 + q1 * (k * (k - 1) - split * (split - 1)) / 2.0
    return base + s1 + s2


def load_step_cost(path: Path) -> StepCost:
    """Read the ``coefficients`` object of a profile JSON file."""
    data = json.loads(Path(path).read_text())
    return StepCost.from_dict(data["coefficients"])
