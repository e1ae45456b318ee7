"""Disaggregated prefill and decode (xPyD): prefill workers, a KV link, decode workers.

The model is vLLM's P/D disaggregation with a KV connector (``NixlConnector``) behind
its toy proxy (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``):

1. a request goes first to a **prefill** worker, as a request of ``max_tokens = 1``:
   its prompt is computed there under that worker's own scheduler, token budget and
   prefix cache (the scenario's router picks the worker; ``prefix_aware`` works here,
   where the cache lives);
2. when that step ends, the prompt's KV (``prompt_tokens * kv_bytes_per_token``) goes
   over the prefill worker's **link** to a decode worker: ``bytes / bandwidth`` on
   the link, plus a fixed latency. The link is the prefill worker's send side (its
   NIC): transfers from one prefill worker queue behind each other, first done first
   sent; transfers from different prefill workers overlap. (A link per decode worker,
   or per pair, would tie the transfer to the decode choice, which
   ``least_outstanding`` makes only once the transfer has landed);
3. the request arrives on a **decode** worker (``decode_router``: round_robin |
   least_outstanding) when its transfer lands, with ``prompt - 1`` tokens computed,
   as vLLM's connector leaves it: ``get_num_new_matched_tokens`` reports the whole
   prompt as loadable asynchronously, and ``Scheduler._update_waiting_for_remote_kv``
   sets ``num_computed_tokens = num_tokens - 1`` once it has landed, so the decode
   worker's first step on it computes the last prompt token and samples the first
   output token: the client's first token is the decode worker's. Its KV blocks are
   allocated there, under the scheduler's usual admission rules. A decode request that
   is preempted recomputes its prompt locally from zero (the connector reports nothing
   to load a second time: ``do_remote_prefill`` is cleared after the first load).

Simplifications (docs/replay.md): the decode worker allocates a request's blocks when
the transfer lands, not when it admits the request and starts the pull (vLLM's
``WAITING_FOR_REMOTE_KVS`` holds them during the transfer, and the transfer starts only
once the decode worker has the blocks); the prefill worker frees its blocks when its
step ends, not when the decode worker has read them; the decode worker's own prefix
cache is not looked up on arrival (every prompt's KV crosses the link). Both sides are
replayed by ``simulate.simulate`` unchanged: the prefill side first, then the decode
side with ``SimInput.remote_tokens``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.policies import POLICIES
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    R_CACHED,
    R_CHUNKS,
    R_LOOKUPS,
    R_PREEMPT,
    R_QDEPTH,
    R_REPLICA,
    S_REPLICA,
    SF_START,
    W_CPU_HITS,
    W_DISCARDED,
    W_DISK_HITS,
    W_HITS,
    W_TOTAL,
    PrefixKeys,
    SimInput,
    SimResult,
    wide,
)
from pipeline.sim.swap import PCIE5_X16

if TYPE_CHECKING:
    from pipeline.sim.scenario import Scenario

ROLE_PREFILL = 0  # DisaggResult.step_role of a prefill worker's step row
ROLE_DECODE = 1
DECODE_ROUTERS = ("round_robin", "least_outstanding")


@dataclass(frozen=True)
class Link:
    """A KV-transfer link preset: one direction's bandwidth, a per-transfer latency."""

    gbps: float  # gigabits per second, one direction
    latency_s: float  # per transfer, on top of bytes / bandwidth
    source: str  # where the bandwidth comes from


# Bandwidths are the vendors' line rates, one direction; a transfer rarely reaches them,
# so lower kv_link_gbps to what your fabric measures. The latencies are not vendor
# figures: they are a nominal per-transfer cost (NIC, connector handshake and
# notification) of the order such links show; set kv_link_latency_s from a measurement.
LINKS: dict[str, Link] = {
    "nvlink4": Link(
        3600.0,
        5e-6,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM): NVLink 900 GB/s, both directions "
        "together: 450 GB/s = 3,600 Gb/s each way (prefill and decode GPUs in one NVLink "
        "domain, e.g. one HGX H100 board)",
    ),
    "nvlink5": Link(
        7200.0,
        5e-6,
        "NVIDIA HGX B200 datasheet: NVLink 5 at 1.8 TB/s per GPU, both directions: "
        "900 GB/s = 7,200 Gb/s each way",
    ),
    "pcie5_x16": Link(
        PCIE5_X16 * 8 / 1e9,  # one figure for PCIe 5.0 x16 (swap.py's host link)
        1e-5,
        "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b "
        "encoding: 16 lanes carry 504 Gb/s (63 GB/s) each way",
    ),
    "ib_ndr": Link(
        400.0,
        2e-5,
        "NVIDIA ConnectX-7 adapter and Quantum-2 switch datasheets: InfiniBand NDR, "
        "400 Gb/s per port",
    ),
    "ib_hdr": Link(
        200.0,
        2e-5,
        "NVIDIA ConnectX-6 VPI adapter datasheet: InfiniBand HDR, 200 Gb/s per port",
    ),
    "roce_400g": Link(
        400.0,
        3e-5,
        "NVIDIA ConnectX-7 adapter datasheet: 400 GbE with RoCE (RDMA over Converged "
        "Ethernet), 400 Gb/s per port",
    ),
    "eth_100g": Link(
        100.0,
        1e-4,
        "IEEE 802.3 100 Gb/s Ethernet (100GBASE-*), 100 Gb/s per port; over TCP, not RDMA",
    ),
}
DEFAULT_LINK = "ib_ndr"


@dataclass(frozen=True)
class Disagg:
    """How a scenario disaggregates prefill and decode (see the module docstring)."""

    prefill_replicas: int  # prefill workers (replicas 0 .. prefill_replicas - 1 of the result)
    decode_replicas: int  # decode workers (replicas prefill_replicas .. of the result)
    link: str  # the LINKS preset its figures start from (kv_link_gbps etc. may override them)
    link_gbps: float  # gigabits per second, one direction, per prefill worker's link
    link_latency_s: float  # per transfer, on top of bytes / bandwidth
    kv_bytes_per_token: int  # KV bytes of one token (all layers, K and V, all TP ranks)
    decode_router: str = "round_robin"  # DECODE_ROUTERS
    prefill_num_gpu_blocks: int = 0  # KV blocks of a prefill worker; 0: the scenario's
    decode_num_gpu_blocks: int = 0  # KV blocks of a decode worker; 0: the scenario's

    def transfer_bytes(self, prompt_tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Bytes each prompt's KV takes over the link."""
        return np.asarray(prompt_tokens, dtype=np.float64) * float(self.kv_bytes_per_token)

    def wire_s(self, prompt_tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Seconds each transfer occupies the link (bytes / bandwidth), latency aside."""
        return self.transfer_bytes(prompt_tokens) * 8.0 / (self.link_gbps * 1e9)

    def to_dict(self) -> dict[str, object]:
        """The scenario keys this resolves (the scenarios table's config_json)."""
        return {
            "prefill_replicas": self.prefill_replicas,
            "decode_replicas": self.decode_replicas,
            "kv_link": self.link,
            "kv_link_gbps": self.link_gbps,
            "kv_link_latency_s": self.link_latency_s,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "decode_router": self.decode_router,
            "prefill_num_gpu_blocks": self.prefill_num_gpu_blocks,
            "decode_num_gpu_blocks": self.decode_num_gpu_blocks,
        }


@dataclass
class DisaggResult:
    """What a disaggregated replay produced, per request in the input order."""

    # client-facing: arrival, first scheduled (on the prefill worker), first token and
    # finish (on the decode worker); R_REPLICA the decode worker (numbered after the
    # prefill workers), R_PREEMPT / R_CHUNKS / R_LOOKUPS / W_HITS / W_DISCARDED /
    # W_TOTAL / W_CPU_HITS / W_DISK_HITS summed over both sides, R_QDEPTH and R_CACHED
    # the prefill side's, the rest the decode side's; st/stf both sides' step rows by
    # start, replicas numbered prefill 0..x-1, decode x..x+y-1; num_kv_blocks the decode
    # workers'
    result: SimResult
    prefill: SimResult  # the prefill side (its requests of max_tokens = 1), input order
    decode: SimResult  # the decode side, input order; its replicas 0..y-1, its own clock
    transfer_s: npt.NDArray[np.float64]  # prefill done -> KV landed (queueing + wire + latency)
    prefill_done_s: npt.NDArray[np.float64]  # end of the prefill step that computed the prompt
    decode_arrival_s: npt.NDArray[np.float64]  # when the KV landed on the decode worker
    step_role: npt.NDArray[np.int8]  # per row of result.st: ROLE_PREFILL or ROLE_DECODE


def check_disagg(sc: Scenario) -> Disagg:
    """The scenario's ``Disagg``.

    Raises:
        ScenarioError: the scenario is not disaggregated, or its policy is not vllm.
    """
    if sc.disagg is None:
        raise ScenarioError(
            f"scenario {sc.name!r} is not disaggregated: set prefill_replicas and decode_replicas"
        )
    if sc.policy != "vllm":
        raise ScenarioError(f"scenario {sc.name!r}: {policy_error(sc.policy)}")
    return sc.disagg


def policy_error(policy: str) -> str:
    """Why a policy other than vllm cannot be disaggregated (one line)."""
    return (
        f"prefill_replicas/decode_replicas: policy {policy} cannot be disaggregated; only "
        "vllm models the decode side of a KV connector (a request arriving with its "
        "prompt's KV); set policy = 'vllm' or leave prefill_replicas unset"
    )


@njit(cache=True, error_model="numpy")
def link_queue(
    done: npt.NDArray[np.float64],
    link: npt.NDArray[np.int64],
    wire: npt.NDArray[np.float64],
    latency: float,
    num_links: int,
) -> npt.NDArray[np.float64]:
    """When each transfer lands: transfers of one link go one at a time, in order of
    ``done`` (ties in index order), each ``wire`` seconds on it, landing ``latency`` after."""
    n = len(done)
    order = np.argsort(done, kind="mergesort")
    free = np.zeros(num_links)
    land = np.empty(n)
    for j in range(n):
        i = order[j]
        r = link[i]
        begin = max(done[i], free[r])
        free[r] = begin + wire[i]
        land[i] = free[r] + latency
    return land


def take_keys(pk: PrefixKeys, order: npt.NDArray[np.int64]) -> PrefixKeys:
    """The keys of requests ``order[0], order[1], ...``, in that order."""
    lens = np.diff(pk.offsets)[order]
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    starts = pk.offsets[:-1][order]
    idx = np.repeat(starts - offsets[:-1], lens) + np.arange(int(offsets[-1]), dtype=np.int64)
    return PrefixKeys(
        offsets,
        pk.keys[idx],
        pk.unit_tokens[order],
        None if pk.tail_tokens is None else pk.tail_tokens[order],
        None if pk.output is None else take_keys(pk.output, order),
    )


def side_scenarios(sc: Scenario) -> tuple[Scenario, Scenario]:
    """(prefill side, decode side) as aggregated scenarios of their own."""
    d = check_disagg(sc)

    def with_blocks(s: Scenario, blocks: int) -> Scenario:
        if not blocks:
            return s
        return dataclasses.replace(s, memory=dataclasses.replace(s.memory, num_gpu_blocks=blocks))

    prefill = dataclasses.replace(sc, replicas=d.prefill_replicas, disagg=None)
    decode = dataclasses.replace(
        sc, replicas=d.decode_replicas, router=d.decode_router, router_params=None, disagg=None
    )
    return with_blocks(prefill, d.prefill_num_gpu_blocks), with_blocks(
        decode, d.decode_num_gpu_blocks
    )


def _check_fits(
    side: Scenario, role: str, prompt: npt.NDArray[np.int64], output: npt.NDArray[np.int64]
) -> None:
    pol = POLICIES[side.policy]
    need = pol.blocks_alone(side.params, side.memory, prompt, output)
    if len(need) and int(need.max()) > side.num_kv_blocks:
        raise ScenarioError(
            f"scenario {side.name!r}: a request needs {int(need.max())} KV blocks on a "
            f"{role} worker, which has {side.num_kv_blocks}; raise {role}_num_gpu_blocks"
        )


def simulate_disaggregated(
    inp: SimInput,
    sc: Scenario,
    *,
    on_progress: Callable[[int], None] | None = None,
    simulate_side: Callable[..., SimResult] | None = None,
) -> DisaggResult:
    """Replay ``inp`` through the disaggregated scenario ``sc`` (module docstring).

    Args:
        inp: requests sorted by arrival, lengths capped (``Scenario.cap_lengths``).
        sc: a scenario with ``disagg`` set, policy vllm.
        on_progress: called with the requests done so far: the prefill side counts the
            first half of ``2 * len(inp)``, the decode side the second.
        simulate_side: replays one side, ``(inp, sc) -> SimResult``; default the fast
            loop (``simulate.simulate`` on ``sc.engine()``); tests pass the reference loop.

    Raises:
        ScenarioError: ``sc`` is not disaggregated or not vllm, a request does not fit a
            worker's KV cache on its own, or ``inp`` is a ``LeadInput`` with a lead.
    """
    from pipeline.sim.simulate import LeadInput

    d = check_disagg(sc)
    if isinstance(inp, LeadInput) and inp.lead:
        raise ScenarioError(
            f"scenario {sc.name!r}: a busiest window's warm-up lead is not replayed with "
            "prefill_replicas; replay the whole selection instead"
        )
    if simulate_side is None:
        simulate_side = _fast
    n = len(inp)
    pre_sc, dec_sc = side_scenarios(sc)
    prompt = np.asarray(inp.prompt_tokens, dtype=np.int64)
    output = np.asarray(inp.output_tokens, dtype=np.int64)
    ones = np.ones(n, dtype=np.int64)
    _check_fits(pre_sc, "prefill", prompt, ones)
    _check_fits(dec_sc, "decode", prompt, output)

    def progress(offset: int) -> Callable[[int], None] | None:
        if on_progress is None:
            return None
        return lambda k: on_progress(offset + k)

    # 1. prefill: every request is a request of max_tokens = 1
    pre_inp = dataclasses.replace(inp, output_tokens=ones, remote_tokens=None)
    pre = simulate_side(pre_inp, pre_sc, on_progress=progress(0))
    done = pre.rqf[:, F_FIRST_TOKEN].copy()
    # 2. the KV transfer over the prefill worker's link
    wire = d.wire_s(prompt)
    links = pre.rq[:, R_REPLICA].astype(np.int64)
    land = link_queue(done, links, wire, float(d.link_latency_s), d.prefill_replicas)
    # 3. decode: arrivals in landing order, the prompt's KV but its last token present
    order = np.argsort(land, kind="stable")
    dec_inp = SimInput(
        arrival_s=land[order],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        prefix=None if inp.prefix is None else take_keys(inp.prefix, order),
        priority=None if inp.priority is None else np.asarray(inp.priority)[order],
        remote_tokens=prompt[order] - 1,
    )
    dec_sorted = simulate_side(dec_inp, dec_sc, on_progress=progress(n))
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)
    dec = SimResult(
        rq=dec_sorted.rq[back],
        rqf=dec_sorted.rqf[back],
        st=dec_sorted.st,
        stf=dec_sorted.stf,
        num_kv_blocks=dec_sorted.num_kv_blocks,
        frontend=dec_sorted.frontend,
    )
    result = _combine(inp, d, pre, dec)
    role = np.concatenate(
        [np.full(len(pre.st), ROLE_PREFILL, np.int8), np.full(len(dec.st), ROLE_DECODE, np.int8)]
    )
    rows = np.lexsort(
        (
            np.concatenate([pre.st[:, S_REPLICA], dec.st[:, S_REPLICA] + d.prefill_replicas]),
            np.concatenate([pre.stf[:, SF_START], dec.stf[:, SF_START]]),
        )
    )
    result.st, result.stf = result.st[rows], result.stf[rows]
    result.disagg_times = np.column_stack([done, land])
    result.step_role = role[rows]
    return DisaggResult(
        result=result,
        prefill=pre,
        decode=dec,
        transfer_s=land - done,
        prefill_done_s=done,
        decode_arrival_s=land,
        step_role=role[rows],
    )


def _fast(inp: SimInput, sc: Scenario, *, on_progress: Callable[[int], None] | None) -> SimResult:
    from pipeline.sim.simulate import simulate

    return simulate(inp, sc.engine(), on_progress=on_progress)


def _combine(inp: SimInput, d: Disagg, pre: SimResult, dec: SimResult) -> SimResult:
    """The client-facing per-request rows and both sides' step rows (unsorted)."""
    rq = dec.rq.copy()
    rq[:, R_REPLICA] += d.prefill_replicas
    for col in (R_PREEMPT, R_CHUNKS, R_LOOKUPS):
        rq[:, col] += pre.rq[:, col]
    rq[:, R_QDEPTH] = pre.rq[:, R_QDEPTH]
    rq[:, R_CACHED] = pre.rq[:, R_CACHED]
    rqw, pw = wide(rq), wide(pre.rq)
    for wcol in (W_HITS, W_DISCARDED, W_TOTAL, W_CPU_HITS, W_DISK_HITS):
        rqw[:, wcol] += pw[:, wcol]
    rqf = dec.rqf.copy()
    rqf[:, F_ARRIVAL] = np.asarray(inp.arrival_s, dtype=np.float64)
    rqf[:, F_FIRST_SCHED] = pre.rqf[:, F_FIRST_SCHED]
    # F_FIRST_TOKEN and F_FINISH: the decode worker's
    st = dec.st.copy()
    st[:, S_REPLICA] += d.prefill_replicas
    return SimResult(
        rq=rq,
        rqf=rqf,
        st=np.concatenate([pre.st, st]),
        stf=np.concatenate([pre.stf, dec.stf]),
        num_kv_blocks=dec.num_kv_blocks,
        frontend=dec.frontend,
    )


ROLE_NAMES = ("prefill", "decode")  # by ROLE_*: sim_steps' role column


def disagg_summary(res: SimResult) -> dict[str, Any]:
    """The ``disagg`` entry of a summary: a disaggregated replay's TTFT split into its
    parts (percentiles over the completed requests that were disaggregated): ``prefill``
    (arrival to the end of the prefill step), ``kv_transfer`` (queueing on the link and
    the wire), ``decode_wait`` (KV landed to the decode worker's first token)."""
    times = res.disagg_times
    assert times is not None
    done = ~np.isnan(res.rqf[:, F_FINISH]) & ~np.isnan(times[:, 1])
    arrival = res.rqf[done, F_ARRIVAL]
    parts = {
        "prefill": times[done, 0] - arrival,
        "kv_transfer": times[done, 1] - times[done, 0],
        "decode_wait": res.rqf[done, F_FIRST_TOKEN] - times[done, 1],
    }
    out: dict[str, Any] = {"num_requests": int(done.sum())}
    for name, v in parts.items():
        for q in (50, 99):
            out[f"{name}_p{q}_s"] = float(np.percentile(v, q)) if len(v) else None
        out[f"{name}_mean_s"] = float(v.mean()) if len(v) else None
    return out
