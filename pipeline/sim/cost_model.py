"""Step cost: how long one engine step takes, from what the step computes (model v3).

A step is described by five features (per replica; tensor parallelism is inside
the coefficients):

    num_prefill_tokens   P  prompt tokens computed this step (all prefill chunks)
    prefill_attn         A  attention work of the prefill chunks, in causal (query, key)
                            pairs: sum over chunks of
                            chunk_len * context_before + chunk_len * (chunk_len + 1) / 2
    num_seqs             N  sequences in the step: prefill chunks plus decodes
    num_decode_seqs      D  requests computing one decode token
    decode_ctx           C  sum of the context lengths (KV tokens read) of those decodes
    (a fixed overhead)

and the step time is a roofline of the linear layers plus attention in kernels of its
own, with explicit overheads (T = P + D, s = ``separate_attention``):

    linear    = flop_s_per_token * (T + flop_tokens_half) + flop_s_per_seq * N
    compute_s = linear + (1 - s) * flop_s_per_attn * (A + C)
    memory_s  = mem_s_weights + (1 - s) * mem_s_per_kv_token * C + mem_s_per_token * T
    step_s    = fixed_s + comm_s_fixed + seq_s * N
                + (prefill_fixed_s + prefill_seq_s * (N - D)) * [P > 0]
                + prefill_knee_s * max(0, P - prefill_knee_tokens)
                + max(compute_s, memory_s) + overlap * min(compute_s, memory_s)
                + comm_s_per_token * T
                + s * (flop_s_per_attn * A + max(flop_s_per_attn, mem_s_per_kv_token) * C)

``flop_tokens_half`` is the token count at which the linear layers reach half their
peak efficiency (efficiency(T) = T / (T + half)), a smooth floor for short prefills
and small batches; ``flop_s_per_seq`` is the lm head, computed for one token of every
sequence in the step (engines compute logits only where a token is sampled);
``overlap`` in [0, 1] is the share of the smaller of compute and memory that does not
hide behind the larger; ``seq_s`` is the per-sequence cost (scheduling, sampling,
per-request kernels); ``prefill_fixed_s`` is what a step that computes prompt tokens
costs on top of a decode-only step, whatever its size (engines replay decode-only steps
from captured CUDA graphs but run mixed steps piecewise or eagerly, and set up
variable-length attention for them); ``prefill_seq_s`` what each prefill chunk (N - D of
the step's sequences) adds to it (per-prompt set-up: attention metadata, padding, the
prompt's own sampling state), which decode sequences do not pay; ``prefill_knee_s`` a cost
per prompt token past ``prefill_knee_tokens`` in one step, for engines whose per-token
prefill cost rises past a step size (measured tables show it: GEMM kernels changing
regime, activations leaving the cache), 0 in the analytic profiles; the threshold is
structure, like ``separate_attention``.

``separate_attention`` (v3: 1) says that attention runs in kernels of its own after
the linear layers of each layer: a prefill chunk's attention is compute (its pairs at
the attention kernels' efficiency), a decode's is the larger of its KV reads and its
pairs, and both add to the linear layers' time instead of hiding behind it. In a step
that carries a long prefill next to many decodes, the decodes' KV reads then still
cost their time, as they do on the GPU. At 0 it is the v2 model (one roofline over
everything), and with ``flop_s_per_seq`` also 0 a v2 profile gives exactly its v2
times; with the four v2 terms at 0 as well, a v1 profile its v1 times.

Every coefficient is a plain number in a readable JSON profile, so a calibrated
profile (fitted to live measurements) can replace the analytic ones without
touching the simulator. A step with nothing to do costs nothing. With
non-negative coefficients, overlap in [0, 1] and separate_attention in [0, 1] the
step time never decreases when any feature grows.

v4 adds the scheduler's CPU time per step, ``cpu = sched_cpu_s + sched_cpu_per_seq_s * N``,
which is not the GPU's: a synchronous engine pays ``gpu + cpu``, an asynchronous one
(``SCHED_OVERLAP`` in the cost array, ``StepCost.as_array(sched_overlap)``) ``max(gpu,
cpu)`` (``sched_cpu.py``). With both at 0 (every v1 to v3 profile) a step takes its v3
time bit for bit.

``decode_run_s`` sums k consecutive decode-only steps in closed form: D (= N) is
fixed and C grows by D every step, so compute_s, memory_s and the separate attention
are linear in the step index; max + overlap * min = (1 - overlap) * max + overlap *
(compute + memory), and the max of two lines crosses over at most once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

COST_MODEL_VERSION = 4

# Index of each coefficient in the array the compiled loop receives (v1 first, in v1 order).
(
    FIXED_S,
    FLOP_TOK,
    FLOP_ATTN,
    MEM_W,
    MEM_KV,
    MEM_TOK,
    COMM_FIXED,
    COMM_TOK,
    SEQ_S,
    FLOP_HALF,
    OVERLAP,
    PREFILL_STEP,
    FLOP_SEQ,
    SEP_ATTN,
    PREFILL_SEQ,
    KNEE_TOKENS,
    KNEE_S,
    SCHED_CPU,
    SCHED_CPU_SEQ,
    SCHED_OVERLAP,  # not a coefficient: 1 when the engine's scheduler overlaps the GPU step
) = range(20)

# Coefficients added by v2; a profile without them (v1) gets 0, which is the v1 model.
V2_COEFFICIENTS = ("seq_s", "flop_tokens_half", "overlap", "prefill_fixed_s")
# Added by v3; a profile without them (v1, v2) gets 0, which is the v2 model.
V3_COEFFICIENTS = (
    "flop_s_per_seq",
    "separate_attention",
    "prefill_seq_s",
    "prefill_knee_tokens",
    "prefill_knee_s",
)
# Added by v4: the scheduler's CPU time per step; a profile without them (v1 to v3) gets 0,
# which is the v3 model (the CPU time folded into fixed_s and seq_s, or hidden).
V4_COEFFICIENTS = ("sched_cpu_s", "sched_cpu_per_seq_s")
OPTIONAL_COEFFICIENTS = V2_COEFFICIENTS + V3_COEFFICIENTS + V4_COEFFICIENTS


@dataclass(frozen=True)
class StepCost:
    """Coefficients of the step-time function (seconds, per feature unit)."""

    fixed_s: float  # scheduler + launch overhead per step, incl. per-layer overheads
    flop_s_per_token: float  # linear-layer compute per token at full GEMM efficiency
    flop_s_per_attn: float  # attention compute per (query, key) pair, at its own efficiency
    mem_s_weights: float  # reading the weights once per step
    mem_s_per_kv_token: float  # reading one token of KV cache (all layers)
    mem_s_per_token: float  # activation traffic per token
    comm_s_fixed: float  # tensor-parallel all-reduce latency per step (0 at TP 1)
    comm_s_per_token: float  # all-reduce bytes per token over link bandwidth
    seq_s: float = 0.0  # per sequence in the step (prefill chunk or decode)
    flop_tokens_half: float = 0.0  # tokens at which GEMM efficiency is half its peak
    overlap: float = 0.0  # share of min(compute, memory) not hidden behind the max, [0, 1]
    prefill_fixed_s: float = 0.0  # per step that computes prompt tokens (prefill launch costs)
    flop_s_per_seq: float = 0.0  # lm head compute per sequence in the step (v3)
    separate_attention: float = 0.0  # 1: attention in kernels of its own (v3); 0: v2
    prefill_seq_s: float = 0.0  # per prefill chunk in a step that computes prompt tokens (v3)
    prefill_knee_tokens: float = 0.0  # prompt tokens in a step past which prefill_knee_s counts
    prefill_knee_s: float = 0.0  # per prompt token past prefill_knee_tokens in a step (v3)
    sched_cpu_s: float = 0.0  # the scheduler's CPU time per step, fixed part (v4)
    sched_cpu_per_seq_s: float = 0.0  # ... and per scheduled sequence (v4)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"coefficient {f.name} must be a finite number >= 0, got {v}")
        for name in ("overlap", "separate_attention"):
            if getattr(self, name) > 1:
                raise ValueError(f"coefficient {name} must be in [0, 1], got {getattr(self, name)}")

    def as_array(self, sched_overlap: bool = False) -> npt.NDArray[np.float64]:
        """The coefficients as the compiled code reads them (indices above), and the
        ``SCHED_OVERLAP`` flag: whether the scheduler's CPU time overlaps the GPU step
        (an asynchronous engine, ``sched_cpu.overlaps``) or adds to it (synchronous)."""
        values = [getattr(self, f.name) for f in fields(self)]
        return np.array([*values, float(sched_overlap)], dtype=np.float64)

    def step_s(
        self,
        num_prefill_tokens: float,
        prefill_attn: float,
        num_seqs: float,
        num_decode_seqs: float,
        decode_ctx: float,
    ) -> float:
        """Seconds of one step with these features (see the module docstring)."""
        return float(
            step_time(
                self.as_array(),
                num_prefill_tokens,
                prefill_attn,
                num_seqs,
                num_decode_seqs,
                decode_ctx,
            )
        )

    def prefill_step_s(self, batch: int, prompt_tokens: int, context_tokens: int = 0) -> float:
        """One step computing ``prompt_tokens`` for each of ``batch`` sequences that already
        hold ``context_tokens`` KV tokens (0 for a fresh prompt)."""
        t = prompt_tokens
        pairs = t * context_tokens + t * (t + 1) / 2
        return self.step_s(batch * t, batch * pairs, batch, 0, 0)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences, each reading ``context_tokens`` KV tokens
        (as a measurements file's decode row says it)."""
        return self.step_s(0, 0, batch, batch, batch * context_tokens)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepCost:
        """From a profile's ``coefficients`` object; v2 and v3 names missing (a v1 or v2
        profile) are 0.

        Raises:
            KeyError: a v1 coefficient is missing.
            ValueError: a coefficient is negative, not finite, or overlap or
                separate_attention > 1.
        """
        return cls(
            **{
                f.name: float(
                    d[f.name] if f.name not in OPTIONAL_COEFFICIENTS else d.get(f.name, 0.0)
                )
                for f in fields(cls)
            }
        )


@njit(cache=True)
def step_time(
    c: npt.NDArray[np.float64], p: float, a: float, n: float, d: float, ctx: float
) -> float:
    """Seconds for one step (see the module docstring): the GPU's, with the scheduler's CPU
    time added (synchronous) or overlapping it (asynchronous: the larger of the two)."""
    gpu = gpu_step_time(c, p, a, n, d, ctx)
    cpu = c[SCHED_CPU] + c[SCHED_CPU_SEQ] * n
    if cpu <= 0 or gpu <= 0:  # (v1 to v3 profiles: the GPU time, bit for bit)
        return gpu
    if c[SCHED_OVERLAP] != 0:
        return max(gpu, cpu)
    return gpu + cpu


@njit(cache=True)
def gpu_step_time(
    c: npt.NDArray[np.float64], p: float, a: float, n: float, d: float, ctx: float
) -> float:
    """Seconds the GPU computes one step (the v3 model; see the module docstring)."""
    tok = p + d
    if tok <= 0:
        return 0.0
    shared = 1.0 - c[SEP_ATTN]  # the share of attention inside the linear layers' roofline
    compute = (
        c[FLOP_TOK] * (tok + c[FLOP_HALF]) + c[FLOP_SEQ] * n + shared * (c[FLOP_ATTN] * (a + ctx))
    )
    memory = c[MEM_W] + shared * (c[MEM_KV] * ctx) + c[MEM_TOK] * tok
    # v1 terms first, in v1 order, so that a v1 (or v2) profile gives bit-identical times
    v1 = c[FIXED_S] + max(compute, memory) + c[COMM_FIXED] + c[COMM_TOK] * tok
    v2 = v1 + c[SEQ_S] * n + c[OVERLAP] * min(compute, memory)
    v3 = v2 + c[SEP_ATTN] * (c[FLOP_ATTN] * a + max(c[FLOP_ATTN], c[MEM_KV]) * ctx)
    if p <= 0:
        return v3
    return (
        v3 + c[PREFILL_STEP] + c[PREFILL_SEQ] * (n - d) + c[KNEE_S] * max(p - c[KNEE_TOKENS], 0.0)
    )


@njit(cache=True)
def decode_run_s(c: npt.NDArray[np.float64], d: float, ctx0: float, k: int) -> float:
    """Total seconds of k decode-only steps of d sequences starting at total context ctx0.

    Step j (0-based) has N = D = d and context ctx0 + j*d. Equal to summing step_time
    over the k steps, up to rounding. The scheduler's CPU time is the same every step
    (N is fixed): a synchronous engine adds k times it; an asynchronous one pays the
    larger of each step's GPU time and it, and as the GPU time never shrinks along the
    run, the steps where the CPU leads are a prefix of it (found by bisection).
    """
    gpu = decode_gpu_s(c, d, ctx0, k)
    cpu = c[SCHED_CPU] + c[SCHED_CPU_SEQ] * d
    if cpu <= 0 or gpu <= 0:  # (v1 to v3 profiles: the GPU time, bit for bit)
        return gpu
    if c[SCHED_OVERLAP] == 0:
        return gpu + k * cpu
    if gpu_step_time(c, 0.0, 0.0, d, d, ctx0) >= cpu:  # the GPU leads from the first step
        return gpu
    lo = 1  # steps [0, lo) are CPU-bound; find the first that is not, in [lo, k]
    hi = k
    while lo < hi:
        mid = (lo + hi) // 2
        if gpu_step_time(c, 0.0, 0.0, d, d, ctx0 + mid * d) < cpu:
            lo = mid + 1
        else:
            hi = mid
    return lo * cpu + decode_gpu_s(c, d, ctx0 + lo * d, k - lo)


@njit(cache=True)
def decode_gpu_s(c: npt.NDArray[np.float64], d: float, ctx0: float, k: int) -> float:
    """The GPU's part of ``decode_run_s``: k steps of the v3 model in closed form."""
    if k <= 0 or d <= 0:
        return 0.0
    # compute_j = a0 + a1*j ; memory_j = b0 + b1*j
    shared = 1.0 - c[SEP_ATTN]
    a0 = c[FLOP_TOK] * (d + c[FLOP_HALF]) + c[FLOP_SEQ] * d + shared * (c[FLOP_ATTN] * ctx0)
    a1 = shared * (c[FLOP_ATTN] * d)
    b0 = c[MEM_W] + shared * (c[MEM_KV] * ctx0) + c[MEM_TOK] * d
    b1 = shared * (c[MEM_KV] * d)
    base = k * (c[FIXED_S] + c[COMM_FIXED] + c[COMM_TOK] * d)
    ov = c[OVERLAP]
    w = 1.0 - ov
    # max + overlap * min = (1 - overlap) * max + overlap * (compute + memory)
    both = k * (a0 + b0) + (a1 + b1) * k * (k - 1) / 2.0
    # the separate attention: every step's context times the larger per-token cost
    attn = c[SEP_ATTN] * max(c[FLOP_ATTN], c[MEM_KV]) * (k * ctx0 + d * k * (k - 1) / 2.0)
    extra = k * c[SEQ_S] * d + ov * both + attn
    # f(j) = compute_j - memory_j is linear, so the steps where compute leads
    # form a prefix or a suffix of [0, k): split there and sum two series.
    if a1 == b1:  # parallel lines: one leads at every step
        lead0, lead1 = (a0, a1) if a0 >= b0 else (b0, b1)
        return base + w * (k * lead0) + w * (lead1 * k * (k - 1) / 2.0) + extra
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
    return base + w * s1 + w * s2 + extra


def load_step_cost(path: Path) -> StepCost:
    """Read the ``coefficients`` object of a profile JSON file."""
    from pipeline.validation import loads_json

    data = loads_json(Path(path).read_text(), str(path))
    return StepCost.from_dict(data["coefficients"])
