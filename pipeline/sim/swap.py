"""Swap preemption: vLLM V0's ``preemption_mode = "swap"`` for the ``vllm`` policy.

vLLM V1 preempts by recompute only (vllm issue #18115: "--preemption-mode is not
supported by the V1 Engine"); V0 could instead swap a preempted sequence's KV
blocks to host memory (``--swap-space``, GiB of CPU memory per GPU, default 4) and
back. What is modelled, as V0's ``core/scheduler.py`` and ``worker/`` did it:

- **Swap out** (``Scheduler._preempt`` -> ``_preempt_by_swap`` -> ``_swap_out``): the
  victim (chosen as for recompute: the last of the running list) gives its GPU blocks
  back at once (``BlockSpaceManager.swap_out`` maps them to CPU blocks in the
  scheduler) and keeps its computed tokens; it waits, swapped, at the front of the
  queue. Recompute drops the tokens instead.
- **Swap in** (``_schedule_swapped``): only in a step that preempted nothing, and
  before any new prefill is admitted (the swapped requests sit ahead of every
  waiting one; V0 kept them in a ``swapped`` queue it tried first). It needs GPU
  blocks for its tokens again; it resumes where it stopped, without recompute. A
  swapped request that does not fit blocks the queue behind it (V0: ``AllocStatus.LATER``
  stops ``_schedule_swapped``).
- **Time**: the copies run in the worker before the step's forward pass
  (``LocalOrDistributedWorkerBase.execute_worker``: ``CacheEngine.swap_in``, then
  ``swap_out``, then the model) on the same CUDA stream, so **the step waits for
  them**. A step's swap traffic is ``blocks * block_size * kv_bytes_per_token``
  bytes over the replica's one host link (PCIe), queued one after the other:
  ``blocks * block_s`` seconds added to the step. The link is busy only inside
  steps (each step's copies finish before its forward pass), so its busy-until
  clock is the step's own; the convoy is that every request of the batch waits for
  every transfer of the step. The link's default is what V0's copies reached
  (``V0_SWAP_BYTES_PER_S``, below), not the PCIe line rate.
- **Host memory full**: V0 raised ("Aborted due to the lack of CPU swap space. Please
  increase the swap space to avoid this error."), killing the engine. The simulator
  instead falls back to recompute for that victim (a run that would have crashed
  V0 still finishes; a swap count of 0 with preemptions says so).

Not modelled (refused by ``resolve``): prefix caching (V0's swap of shared cached
blocks), the priority policy (V0 preempted for priority differently) and async
scheduling (V0 had none).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.state import (
    C_BLOCK_SIZE,
    C_SWAP_BLOCK_BYTES,
    C_SWAP_BLOCKS,
    CF_SWAP_BLOCK_S,
    P_FREE,
    P_STEP_SWAP_IN,
    P_STEP_SWAP_OUT,
    P_SWAP_FREE,
    R_COMPUTED,
    R_HELD,
    R_PREEMPT,
    R_STATUS,
    R_SWAPS,
    ST_SWAPPED,
    cdiv,
)

MODES = ("recompute", "swap")
KEYS = ("preemption_mode", "swap_space_gb", "swap_link_gb_s", "swap_kv_bytes_per_token")
GIB = 2**30

# Host link per GPU, one direction, the PCIe line rate (x16 lanes, 128b/130b encoding:
# Gen4 16 GT/s -> 31.5 GB/s, Gen5 32 GT/s -> 63 GB/s; PCI-SIG PCI Express Base
# Specification 4.0 / 5.0). Pinned-memory copies reach about 80-90% of it; set
# swap_link_gb_s from a measurement (e.g. CUDA's bandwidthTest) when you have one.
PCIE4_X16 = 31.5e9
PCIE5_X16 = 63.0e9
# What V0's swap reached per GPU: ``CacheEngine.swap_in`` / ``swap_out`` call the
# ``swap_blocks`` op once per layer, and it issues one ``cudaMemcpyAsync`` per block,
# so a swap is thousands of small copies and runs far below the line rate. vLLM PR
# #11531 (LMCache's CPU-offloading kernels, December 2024) measured that implementation
# on A100-40GB SXM: 3.11 GB/s swapping 1,250 pages in, 3.12 GB/s out (1.21 GB/s for
# one page), against 12.6 GB/s for a batched kernel. The default is this figure, capped
# by the line rate; set swap_link_gb_s from a measurement of your engine when you have one.
V0_SWAP_BYTES_PER_S = 3.11e9
HOST_LINK_BYTES_PER_S: dict[str, tuple[float, str]] = {
    "a100-80gb": (PCIE4_X16, "NVIDIA A100 datasheet: PCIe Gen4 host interface"),
    "a100-40gb": (PCIE4_X16, "NVIDIA A100 datasheet: PCIe Gen4 host interface"),
    "h100-80gb": (PCIE5_X16, "NVIDIA H100 datasheet: PCIe Gen5 host interface"),
    "h100-pcie": (PCIE5_X16, "NVIDIA H100 datasheet, PCIe column: PCIe Gen5 x16"),
    "h200": (PCIE5_X16, "NVIDIA H200 datasheet: PCIe Gen5 host interface"),
    "b200": (PCIE5_X16, "NVIDIA HGX B200 datasheet: PCIe Gen5 host interface"),
    "l40s": (PCIE4_X16, "NVIDIA L40S datasheet: PCIe Gen4 x16"),
    "l4": (PCIE4_X16, "NVIDIA L4 datasheet: PCIe Gen4 x16"),
    "a10g": (PCIE4_X16, "NVIDIA A10 datasheet: PCIe Gen4 x16"),
    "mi300x": (PCIE5_X16, "AMD Instinct MI300X datasheet: PCIe Gen5 x16"),
    "rtx-4090": (PCIE4_X16, "NVIDIA GeForce RTX 4090 specifications: PCIe Gen4 x16"),
    "rtx-pro-6000": (PCIE5_X16, "NVIDIA RTX PRO 6000 Blackwell datasheet: PCIe Gen5 x16"),
}


@dataclass(frozen=True)
class Swap:
    """A scenario's swap space, resolved (one replica's)."""

    host_blocks: int  # KV blocks of host memory (swap_space_gb per GPU, all its GPUs)
    block_bytes: int  # bytes of one KV block (all layers, K and V, all TP ranks)
    link_bytes_per_s: float  # the replica's host link, one direction (its GPUs together)

    @property
    def block_s(self) -> float:
        """Seconds one block occupies the host link."""
        return self.block_bytes / self.link_bytes_per_s

    def pack(self, cfg: npt.NDArray[np.int64], cfgf: npt.NDArray[np.float64]) -> None:
        cfg[C_SWAP_BLOCKS] = self.host_blocks
        cfg[C_SWAP_BLOCK_BYTES] = self.block_bytes
        cfgf[CF_SWAP_BLOCK_S] = self.block_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "swap_host_blocks": self.host_blocks,
            "swap_block_bytes": self.block_bytes,
            "swap_link_bytes_per_s": self.link_bytes_per_s,
        }


def refusal(policy: str, key: str) -> str | None:
    """Why ``key`` (a swap key) cannot apply to ``policy``; None when it is not a swap key."""
    if key not in KEYS:
        return None
    if policy == "tgi":
        return (
            f"{key}: TGI never preempts (router v3 reserves every request's whole KV up "
            "front, queue.rs next_batch), so it has nothing to swap; swap preemption is "
            "vLLM V0's, use policy = vllm"
        )
    return f"{key}: swap preemption is vLLM V0's (policy = vllm), not {policy}'s"


def _profile_gpu(profile: str) -> tuple[str, int]:
    """(GPU name, tensor-parallel GPUs) of a profile, by name or path."""
    from pipeline.sim import profiles

    path = profiles.PROFILE_DIR / f"{profile}.json"
    if profile not in profiles.list_profiles():
        from pathlib import Path

        path = Path(profile)
    data = json.loads(path.read_text())
    gpu = data.get("gpu", {}).get("name", "?") if isinstance(data.get("gpu"), dict) else "?"
    tp = data.get("tensor_parallel", 1)
    tp = int(tp.get("tp", 1)) if isinstance(tp, dict) else int(tp or 1)
    return str(gpu), max(tp, 1)


def resolve(
    params: Any,
    *,
    profile: str | None,
    block_size: int,
    caching: bool,
    where: str,
) -> Swap | None:
    """The scenario's swap space (None: recompute preemption), its keys checked.

    ``profile``: the profile's name or path ("": the default profile; None with a [cost]
    table): its KV bytes per token and its GPU's host link are the defaults.
    """
    mode = params.preemption_mode
    if mode not in MODES:
        raise ScenarioError(f"{where}: unknown preemption_mode {mode!r}; allowed: recompute, swap")
    if not 0 <= params.swap_space_gb < math.inf:
        raise ScenarioError(
            f"{where}: swap_space_gb must be >= 0 and finite (GiB of host memory per GPU), got "
            f"{params.swap_space_gb}"
        )
    if not 0 <= params.swap_link_gb_s < math.inf:
        raise ScenarioError(
            f"{where}: swap_link_gb_s must be >= 0 and finite (GB/s one way per GPU; 0 = "
            f"vLLM V0's measured copy rate), got {params.swap_link_gb_s}"
        )
    if mode == "recompute":
        return None
    if profile == "":
        from pipeline.sim import profiles

        profile = profiles.DEFAULT_PROFILE
    for bad, why in (
        (params.async_scheduling, "async_scheduling = false (V0 had no async scheduling)"),
        (params.scheduling_policy != "fcfs", "scheduling_policy = 'fcfs'"),
        (caching, "enable_prefix_caching = false (swapping cached blocks is not modelled)"),
    ):
        if bad:
            raise ScenarioError(f"{where}: preemption_mode = 'swap' (vLLM V0) needs {why}")
    kv = params.swap_kv_bytes_per_token
    if not kv and profile is not None:
        from pipeline.sim import profiles

        kv = profiles.load_profile(profile).kv_bytes_per_token
    if not kv:
        raise ScenarioError(
            f"{where}: preemption_mode = 'swap' with a [cost] table needs "
            "swap_kv_bytes_per_token and swap_link_gb_s (there is no model or GPU to derive "
            "them from)"
        )
    tp = 1
    if params.swap_link_gb_s > 0:
        per_gpu = params.swap_link_gb_s * 1e9
        if profile is not None:
            tp = _profile_gpu(profile)[1]
    else:
        if profile is None:
            raise ScenarioError(
                f"{where}: preemption_mode = 'swap' with a [cost] table needs swap_link_gb_s"
            )
        gpu, tp = _profile_gpu(profile)
        if gpu not in HOST_LINK_BYTES_PER_S:
            raise ScenarioError(
                f"{where}: no host-link figure for GPU {gpu!r}; set swap_link_gb_s (GB/s one way)"
            )
        per_gpu = min(HOST_LINK_BYTES_PER_S[gpu][0], V0_SWAP_BYTES_PER_S)
    link = per_gpu * tp  # each GPU copies its shard over its own link
    block_bytes = int(kv) * block_size
    host = int(params.swap_space_gb * GIB * tp) // block_bytes
    return Swap(host_blocks=host, block_bytes=block_bytes, link_bytes_per_s=link)


# --- the compiled side (policies/vllm.py calls these) --------------------------------


@njit(cache=True, error_model="numpy")
def swap_out(
    cfg: npt.NDArray[np.int64], rq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int
) -> bool:
    """Swap preempted request i's blocks to host memory; False (nothing done) if they do
    not fit there, and the caller preempts by recompute. The caller requeues it."""
    blocks = rq[i, R_HELD]
    if cfg[C_SWAP_BLOCKS] == 0 or blocks > rp[r, P_SWAP_FREE]:
        return False
    rp[r, P_SWAP_FREE] -= blocks
    rp[r, P_FREE] += blocks
    rp[r, P_STEP_SWAP_OUT] += blocks
    rq[i, R_HELD] = 0
    rq[i, R_STATUS] = ST_SWAPPED
    rq[i, R_PREEMPT] += 1
    rq[i, R_SWAPS] += 1
    return True


@njit(cache=True, error_model="numpy")
def swap_in(
    cfg: npt.NDArray[np.int64], rq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], r: int, i: int
) -> None:
    """Request i, just admitted with GPU blocks again, gives its host blocks back: those
    of its computed tokens (what it held when it was swapped out)."""
    blocks = cdiv(rq[i, R_COMPUTED], cfg[C_BLOCK_SIZE])
    rp[r, P_SWAP_FREE] += blocks
    rp[r, P_STEP_SWAP_IN] += blocks
