"""Drive vLLM's own V1 scheduler and the simulator's ``vllm`` policy on the same requests.

vLLM side: the real ``vllm.v1.core.sched.scheduler.Scheduler`` (synchronous),
built from a local ``config.json`` (no hub access) with ``DeviceConfig("cpu")``
and one full-attention KV group of ``num_blocks`` blocks. There is no model:
after each ``schedule()`` a fake runner samples one token for every scheduled
request whose computed tokens reach its length (``SamplingParams(max_tokens=
output, ignore_eos=True)`` ends it), and a simulated clock advances by the
step cost of the batch vLLM chose. A request samples its ``output_ids`` when
it has them (a trace that logs what was generated); otherwise every token it
samples is the same id, its own (``1 + index``), so its generated blocks never
match another request's.

Simulator side: the reference loop (recording what each step scheduled and
preempted) and the fast loop, on the same requests, with the scenario's cost
model. Its prefix keys are the requests' chained hashes of their token ids, of
16-token blocks as vLLM's, or of ``trace_block`` tokens with the partial last
block hashed too (a trace like Mooncake's), and, for requests with
``output_ids``, the hashes of their generated blocks (``output_hashes``).
``step_cost`` (a plain callable of a batch) times vLLM's steps; the default,
``cost_function``, is the simulator's own ``cost_model.step_time`` on the
batch's features, whichever signature it has.

A batch is a list of ``(computed_before, tokens, is_decode)``, one per scheduled
request; a request decodes when its prompt (or recompute after a preemption)
is done, exactly the simulator's definition.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import inspect
import json
import math
import os
import pickle
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.ingest.hashing import block_digests, digests_to_uint64, none_hash, prefix_hashes
from pipeline.sim.cost_model import step_time
from pipeline.sim.prefix import build_keys
from pipeline.sim.reference import ReferenceLoop
from pipeline.sim.reference_kv import Replica, Req, Scheduled
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.speculation import accepted_py, check_table
from pipeline.sim.state import (
    F_FINISH,
    F_FIRST_TOKEN,
    R_CACHED,
    S_NUM_STEPS,
    S_PREEMPT,
    PrefixKeys,
    SimInput,
)

Batch = list[tuple[int, int, bool]]
StepCost = Callable[[Batch], float]

REPO = Path(__file__).resolve().parents[2]
AZURE_SAMPLE = REPO / "traces" / "azure_conv.csv"
BLOCK = 16
PROFILE = "llama-3-8b_h100-80gb_tp1"
VOCAB = 32000


@dataclass
class Request:
    arrival_s: float
    prompt: list[int]  # token ids
    output: int
    priority: int = 0
    output_ids: list[int] | None = None  # what it generates (None: its own id, repeated)


@dataclass
class Config:
    """One conformance configuration: requests and the engine settings both sides get."""

    name: str
    requests: list[Request]
    num_blocks: int  # vLLM's num_blocks (the simulator's num_gpu_blocks): null block included
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = False
    scheduler_reserve_full_isl: bool = True
    async_scheduling: bool = False  # vLLM's AsyncScheduler behind the engine core's batch queue
    max_model_len: int = 8192
    trace_block: int = BLOCK  # the simulator's hash blocks (> BLOCK: the partial one hashed too)
    output_hashes: bool = False  # the simulator gets the hashes of generated blocks
    what: str = ""  # one line for the docs
    sim_values: dict[str, Any] = field(default_factory=dict)  # simulator-only overrides
    speculative: dict[str, Any] | None = None  # the simulator's [speculative] table

    def scenario(self) -> Scenario:
        spec = {} if self.speculative is None else {"speculative": self.speculative}
        return build_scenario(
            self.sim_values
            | spec
            | {
                "policy": "vllm",
                "profile": PROFILE,
                "block_size": BLOCK,
                "num_gpu_blocks": self.num_blocks,
                "max_model_len": self.max_model_len,
                "enable_prefix_caching": self.enable_prefix_caching,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "enable_chunked_prefill": self.enable_chunked_prefill,
                "long_prefill_token_threshold": self.long_prefill_token_threshold,
                "watermark": self.watermark,
                "scheduling_policy": self.scheduling_policy,
                "scheduler_reserve_full_isl": self.scheduler_reserve_full_isl,
                "async_scheduling": self.async_scheduling,
            }
            | self.sim_values
        )


@dataclass
class Step:
    start: float
    duration: float
    scheduled: dict[int, int]  # request index -> tokens
    preempted: list[int]  # request indices, sorted
    blocks: int | None = None  # KV blocks in use once scheduled (speculative configurations)


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    first_token: np.ndarray = field(default_factory=lambda: np.zeros(0))
    finish: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cached: np.ndarray = field(default_factory=lambda: np.zeros(0))  # hits, first lookup
    # speculative decoding, vLLM's side: verifies, drafts, accepted, padded rows, verifies
    # of fewer than k drafts
    spec: dict[str, int] = field(default_factory=dict)

    @property
    def preemptions(self) -> int:
        return sum(len(s.preempted) for s in self.steps)


def cost_function(cost: np.ndarray, draft: tuple[float, int] | None = None) -> StepCost:
    """The simulator's ``step_time`` on a batch's features (P, A, [N,] D, C).

    A decode of t > 1 tokens verifies t - 1 drafts (speculative decoding): t decode
    rows over its context, its extra (query, key) pairs in A; ``draft`` = (draft_cost,
    k) adds the drafter's k passes, each ``draft_cost`` of a plain decode step of the
    verifying requests (``speculation.py``).
    """
    fn = getattr(step_time, "py_func", step_time)
    with_n = len(inspect.signature(fn).parameters) == 6  # cost model v2 counts sequences

    def batch_cost(batch: Batch) -> float:
        p = a = d = c = n = m = plain = 0
        for c0, t, decode in batch:
            if decode:
                d += t
                c += c0 + t
                a += (t - 1) * c0 + t * (t - 1) // 2
                n += t
                m += 1
                plain += c0 + 1
            else:
                p += t
                a += t * c0 + t * (t + 1) // 2
                n += 1
        if with_n:
            s = float(step_time(cost, p, a, n, d, c))  # type: ignore[call-arg]
            if draft is not None and draft[0] > 0 and m:
                s += draft[0] * draft[1] * float(step_time(cost, 0.0, 0.0, m, m, plain))  # type: ignore[call-arg]
            return s
        return float(step_time(cost, p, a, d, c))

    return batch_cost


def own_cost(cfg: Config) -> StepCost:
    """``cost_function`` of ``cfg``'s scenario, its drafter included."""
    sc = cfg.scenario()
    sp = sc.speculative
    return cost_function(sc.cost.as_array(), None if sp is None else (sp.draft_cost, sp.num_tokens))


# --- the simulator side ------------------------------------------------------------


class _Recording(ReferenceLoop):
    """The reference loop, noting what each call of the scheduler scheduled and preempted.

    With async scheduling a call can schedule nothing (the engine core then
    waits for the step in flight and calls again): what it preempted is noted
    with the next step, as ``run_vllm`` notes vLLM's empty outputs.
    """

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.log: list[tuple[dict[int, int], list[int]]] = []
        self.blocks: list[int] = []  # KV blocks in use once each step is scheduled
        self._pre: list[int] = []

    def preempt(self, rep: Replica, req: Req) -> None:
        self._pre.append(req.index)
        super().preempt(rep, req)

    def vllm_scheduler(self, rep: Replica) -> tuple[Scheduled, int, int]:
        out = super().vllm_scheduler(rep)
        if out[0] or not self.deferred_free:
            self.log.append(({req.index: t for req, t in out[0]}, sorted(self._pre)))
            self.blocks.append(self.num_blocks - rep.cache.free - rep.cache.evictable)
            self._pre = []
        return out


def trace_hashes(ids: list[int], block: int) -> np.ndarray:
    """Chained hashes of every ``block``-token block of ``ids``, the partial last one too
    (a Mooncake-style trace: its hash covers the tokens it has)."""
    full = block_digests(ids, block)
    rest = ids[len(full) * block :]
    if rest:
        parent = full[-1] if full else none_hash()
        full.append(hashlib.sha256(pickle.dumps((parent, tuple(rest), None), 5)).digest())
    return digests_to_uint64(full)


def _flat(keys: list[np.ndarray]) -> PrefixKeys:
    counts = np.array([len(k) for k in keys], dtype=np.int64)
    return PrefixKeys(
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        np.concatenate([*keys, np.zeros(0, np.uint64)]).astype(np.uint64),
        np.full(len(keys), BLOCK, dtype=np.int64),
    )


def sim_input(cfg: Config) -> SimInput:
    reqs = cfg.requests
    prefix = None
    if cfg.enable_prefix_caching and cfg.trace_block != BLOCK:
        hashes = pa.array([trace_hashes(r.prompt, cfg.trace_block) for r in reqs],
                          pa.list_(pa.uint64()))  # fmt: skip
        prompt = np.array([len(r.prompt) for r in reqs], dtype=np.int64)
        blocks = np.full(len(reqs), cfg.trace_block, dtype=np.int64)
        sc = cfg.scenario()
        prefix = build_keys(prompt, blocks, hashes, BLOCK, partial_blocks=sc.prefix_partial_blocks)
    elif cfg.enable_prefix_caching:
        keys = [prefix_hashes(r.prompt, BLOCK) for r in reqs]
        prefix = _flat(keys)
        if cfg.output_hashes:
            whole = [  # the generated blocks' hashes chain on from the prompt's
                prefix_hashes(r.prompt + r.output_ids, BLOCK)[len(k) :]
                if r.output_ids is not None
                else np.zeros(0, np.uint64)
                for r, k in zip(reqs, keys, strict=True)
            ]
            prefix = dataclasses.replace(prefix, output=_flat(whole))
    return SimInput(
        np.array([r.arrival_s for r in reqs], dtype=np.float64),
        np.array([len(r.prompt) for r in reqs], dtype=np.int64),
        np.array([r.output for r in reqs], dtype=np.int64),
        prefix=prefix,
        priority=np.array([r.priority for r in reqs], dtype=np.int64),
    )


def run_simulator(cfg: Config) -> tuple[Run, Run]:
    """(reference loop with per-step records, fast loop with per-request times)."""
    sc = cfg.scenario()
    inp = sim_input(cfg)
    ref_loop = _Recording(sc)
    ref = ref_loop.run(inp)
    cached = ref.rq[:, R_CACHED].astype(np.float64)
    spec = cfg.speculative is not None
    steps = [
        Step(float(ref.stf[k, 0]), float(ref.stf[k, 1]), sched, pre, used if spec else None)
        for k, ((sched, pre), used) in enumerate(zip(ref_loop.log, ref_loop.blocks, strict=True))
    ]
    fast = simulate(inp, sc.engine())
    fast_run = Run(first_token=fast.rqf[:, F_FIRST_TOKEN], finish=fast.rqf[:, F_FINISH])
    # the fast loop compresses decode runs: expand its step and preemption counts
    fast_run.steps = [
        Step(0.0, 0.0, {}, [-1] * int(row[S_PREEMPT]) if j == 0 else [])
        for row in fast.st
        for j in range(int(row[S_NUM_STEPS]))
    ]
    return Run(steps, ref.rqf[:, F_FIRST_TOKEN], ref.rqf[:, F_FINISH], cached), fast_run


# --- the vLLM side -----------------------------------------------------------------


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def _model_dir(max_model_len: int) -> str:
    d = tempfile.mkdtemp(prefix="conformance-model-")
    config = {  # a tiny Llama: the scheduler reads only lengths and the architecture
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "max_position_embeddings": max_model_len,
        "torch_dtype": "float32",
        "rms_norm_eps": 1e-5,
    }
    Path(d, "config.json").write_text(json.dumps(config))
    return d


def speculative_config(cfg: Config) -> Any:
    """vLLM's ``SpeculativeConfig`` of ``cfg``'s drafter, as n-grams (None without one)."""
    if cfg.speculative is None:
        return None
    from vllm.config import SpeculativeConfig

    return SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=int(cfg.speculative["num_tokens"]),
        prompt_lookup_max=4,
        prompt_lookup_min=1,
    )


def build_scheduler(cfg: Config, kv_transfer_config: Any = None) -> Any:
    """vLLM's own synchronous V1 scheduler for ``cfg``, on CPU, no model, no hub; with a
    KV connector when given its ``KVTransferConfig`` (test_vllm_disagg_conformance.py)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")  # vLLM's NONE_HASH seed, as our hashing
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(
        model=_model_dir(cfg.max_model_len),
        skip_tokenizer_init=True,
        max_model_len=cfg.max_model_len,
        dtype="float32",
        seed=0,
    )
    sched = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=cfg.max_model_len,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        watermark=cfg.watermark,
        policy=cfg.scheduling_policy,
        scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
        async_scheduling=cfg.async_scheduling,
        is_encoder_decoder=False,
        # a connector that does not declare hybrid-allocator support needs it off
        disable_hybrid_kv_cache_manager=True if kv_transfer_config is not None else None,
    )
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=cfg.enable_prefix_caching)
    vllm_config = VllmConfig(
        model_config=model,
        scheduler_config=sched,
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=kv_transfer_config,
        speculative_config=speculative_config(cfg),
    )
    if cfg.speculative is not None and cfg.speculative["method"] != "ngram":
        # an EAGLE head or a draft model needs its weights' config to be built: build the
        # n-gram one and name the method after, which is all the scheduler reads of it
        # (use_eagle, uses_draft_model: lookahead slots and drafting slots)
        spec_config = vllm_config.speculative_config
        object.__setattr__(spec_config, "method", cfg.speculative["method"])
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=cfg.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    cache.num_gpu_blocks = cfg.num_blocks
    cls = AsyncScheduler if cfg.async_scheduling else Scheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vllm_config),
        log_stats=True,
        block_size=BLOCK,
    )


class _VllmSide:
    """vLLM's scheduler for ``cfg``, its requests, a fake model runner and what happened."""

    def __init__(self, cfg: Config, step_cost: StepCost) -> None:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self.cfg = cfg
        self.step_cost = step_cost
        self.sched = build_scheduler(cfg)
        init_none_hash(sha256)
        # as the engine core builds it: an EAGLE drafter's hashes cover the token after
        # each block too (VllmConfig.num_hash_lookahead_tokens)
        self.hasher = get_request_block_hasher(BLOCK, sha256, self.sched.num_hash_lookahead_tokens)
        n = len(cfg.requests)
        self.reqs: dict[str, Any] = {}
        self.index: dict[str, int] = {}
        self.pf_end: dict[str, int] = {}  # num_tokens when last admitted: below it, a prefill
        self.run = Run(
            first_token=np.full(n, math.nan), finish=np.full(n, math.nan), cached=np.zeros(n)
        )
        self.looked: set[str] = set()  # scheduled once (a resumed one may come as new again)
        self.next = 0  # next request to arrive
        self.done = 0
        # the drafter: k drafts after every step that samples, accepted as the simulator
        # draws them for cfg.speculative (whatever sim_values tell the simulator)
        self.spec = None if cfg.speculative is None else check_table(cfg.speculative, cfg.name)
        self.seed = cfg.scenario().seed

    def add_arrived(self, clock: float) -> None:
        """Hand the scheduler every request that has arrived by ``clock``."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VRequest

        reqs = self.cfg.requests
        while self.next < len(reqs) and reqs[self.next].arrival_s <= clock:
            r = reqs[self.next]
            rid = f"{self.next:06d}"
            vr = VRequest(
                request_id=rid,
                prompt_token_ids=list(r.prompt),
                sampling_params=SamplingParams(max_tokens=r.output, ignore_eos=True),
                pooling_params=None,
                arrival_time=r.arrival_s,
                priority=r.priority,
                block_hasher=self.hasher if self.cfg.enable_prefix_caching else None,
            )
            self.reqs[rid] = vr
            self.index[rid] = self.next
            self.sched.add_request(vr)
            self.next += 1

    def next_arrival(self) -> float:
        return self.cfg.requests[self.next].arrival_s

    def schedule(self) -> tuple[Any, list[str], Batch, list[list[int]]]:
        """(output, scheduled ids, batch, the token each samples) of one ``schedule()``."""
        out = self.sched.schedule()
        new = {r.req_id for r in out.scheduled_new_reqs}
        admitted = new | set(out.scheduled_cached_reqs.resumed_req_ids)
        batch: Batch = []
        sampled: list[list[int]] = []
        ids = list(out.num_scheduled_tokens)
        for rid in ids:
            vr = self.reqs[rid]
            t = out.num_scheduled_tokens[rid]
            c0 = vr.num_computed_tokens - t  # schedule() already counted them
            if rid in admitted:
                self.pf_end[rid] = vr.num_tokens
            i = self.index[rid]
            if rid in new and rid not in self.looked:  # its first lookup's hits
                self.run.cached[i] = c0
                self.looked.add(rid)
            batch.append((c0, t, c0 >= self.pf_end[rid]))
            # a step samples unless it leaves the request in prefill (its placeholders count)
            if vr.is_prefill_chunk:
                sampled.append([])
                continue
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            accepted = 0  # the verified drafts accepted: the simulator's draws, none padded
            if self.spec is not None and drafts and -1 not in drafts:
                g = len(vr.output_token_ids)
                accepted = accepted_py(self.spec.acceptance, self.seed, i, g, len(drafts))
                self.count("verifies", 1)
                self.count("drafts", len(drafts))
                self.count("accepted", accepted)
                self.count("short", len(drafts) < self.spec.num_tokens)
            elif drafts:
                self.count("padded", 1)
            own = self.cfg.requests[i].output_ids
            toks = []
            for j in range(1 + accepted):  # (vLLM trims what passes max_tokens)
                token = 1 + i % (VOCAB - 1)
                if own is not None:  # its next token: after those delivered and in flight
                    at = len(vr.output_token_ids) + max(vr.num_output_placeholders - 1, 0) + j
                    token = own[min(at, len(own) - 1)]
                toks.append(token)
            sampled.append(toks)
        return out, ids, batch, sampled

    def record(self, out: Any, start: float, duration: float, preempted: list[str]) -> None:
        self.run.steps.append(
            Step(
                start,
                duration,
                {self.index[rid]: t for rid, t in out.num_scheduled_tokens.items()},
                sorted(self.index[rid] for rid in preempted),
                self.blocks_in_use() if self.spec is not None else None,
            )
        )

    def count(self, what: str, n: int) -> None:
        self.run.spec[what] = self.run.spec.get(what, 0) + int(n)

    def blocks_in_use(self) -> int:
        """KV blocks neither free nor cached-and-idle (the null block not counted)."""
        return int(
            self.cfg.num_blocks - 1 - self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
        )

    def processed(self, out: Any, ids: list[str], sampled: list[list[int]], clock: float) -> None:
        """``update_from_output`` of a step that ended at ``clock``, and its tokens' times."""
        from vllm.v1.outputs import ModelRunnerOutput

        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: k for k, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        self.sched.update_from_output(out, result)
        if self.spec is not None:  # the drafter's k drafts for every request it ran
            from vllm.v1.outputs import DraftTokenIds

            k = self.spec.num_tokens
            drafts = [[1 + self.index[rid] % (VOCAB - 1)] * k for rid in ids]
            self.sched.update_draft_token_ids(DraftTokenIds(ids, drafts))
        for rid, toks in zip(ids, sampled, strict=True):
            if not toks:
                continue
            i = self.index[rid]
            if math.isnan(self.run.first_token[i]):
                self.run.first_token[i] = clock
            if self.reqs[rid].is_finished():
                self.run.finish[i] = clock
                self.done += 1


def run_vllm(cfg: Config, step_cost: StepCost) -> Run:
    """Replay ``cfg`` through vLLM's scheduler, one step at a time on a simulated clock.

    Synchronous: schedule, run, process the output, repeat (``EngineCore.step``).
    With ``async_scheduling``, the engine core's batch queue of two
    (``EngineCore.step_with_batch_queue``): a step is scheduled and submitted,
    then, while the device runs it, the next one is scheduled and submitted
    before the first one's output is processed; new requests are taken from
    the input queue between calls, i.e. when the output of the step in flight
    has been processed. The device runs submitted steps back to back; an empty
    output takes no time. Its preemptions are noted with the next step.
    """
    side = _VllmSide(cfg, step_cost)
    if cfg.async_scheduling:
        _run_batch_queue(side)
        return side.run
    n = len(cfg.requests)
    clock = 0.0
    while side.done < n:
        side.add_arrived(clock)
        if side.sched.get_num_unfinished_requests() == 0:  # idle until the next arrival
            clock = max(clock, side.next_arrival())
            continue
        out, ids, batch, sampled = side.schedule()
        if out.total_num_scheduled_tokens == 0 and not out.preempted_req_ids:
            raise RuntimeError(f"{cfg.name}: vLLM scheduled nothing at {clock} s")
        duration = step_cost(batch)
        side.record(out, clock, duration, list(out.preempted_req_ids or ()))
        clock += duration
        side.processed(out, ids, sampled, clock)
    return side.run


def _run_batch_queue(side: _VllmSide) -> None:
    """The async engine core's loop (``run_busy_loop`` over ``step_with_batch_queue``)."""
    sched = side.sched
    n = len(side.cfg.requests)
    queue: deque[tuple[Any, list[str], list[list[int]], float]] = deque()
    clock = 0.0  # the engine core's time
    device_free = 0.0  # when the device is done with what was submitted
    carried: list[str] = []  # preempted by empty outputs, noted with the next step
    while side.done < n or queue:
        side.add_arrived(clock)  # _process_input_queue
        if not queue and not sched.has_requests():  # idle until the next arrival
            clock = max(clock, side.next_arrival())
            continue
        if sched.has_requests():
            out, ids, batch, sampled = side.schedule()
            carried += list(out.preempted_req_ids or ())
            executed = out.total_num_scheduled_tokens > 0
            end = max(clock, device_free)
            if executed:
                duration = side.step_cost(batch)
                side.record(out, end, duration, carried)
                carried = []
                end += duration
                device_free = end
            queue.appendleft((out, ids, sampled, end))
            if len(queue) < 2 and (executed or sched.has_requests()):
                continue  # do not wait while the queue has room
        out, ids, sampled, end = queue.pop()  # wait for the oldest step in flight
        clock = max(clock, end)
        side.processed(out, ids, sampled, clock)


# --- comparing ---------------------------------------------------------------------


@dataclass
class Comparison:
    name: str
    vllm_steps: int
    sim_steps: int
    vllm_preemptions: int
    sim_preemptions: int
    first_divergence: int | None  # first step whose schedule differs (None: none)
    ttft_max_s: float
    ttft_mean_s: float
    e2e_max_s: float
    e2e_mean_s: float
    fast_equals_reference: bool
    vllm_hit_tokens: int = 0  # prompt tokens found in the cache at first lookups
    sim_hit_tokens: int = 0
    prompt_tokens: int = 0
    note: str = ""

    @property
    def identical(self) -> bool:
        return (
            self.first_divergence is None
            and self.vllm_steps == self.sim_steps
            and self.ttft_max_s == 0.0
            and self.e2e_max_s == 0.0
            and self.fast_equals_reference
        )


def _rel_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b|, zeroed where within 1e-9 relative (the float sums may differ in rounding)."""
    d = np.abs(a - b)
    return np.where(d <= 1e-9 * np.maximum(np.abs(a), np.abs(b)), 0.0, d)


def compare(cfg: Config, step_cost: StepCost | None = None) -> Comparison:
    """Run both sides on ``cfg`` and measure how far apart they are."""
    if step_cost is None:
        step_cost = own_cost(cfg)
    ref, fast = run_simulator(cfg)
    v = run_vllm(cfg, step_cost)
    first = None
    for k, (a, b) in enumerate(zip(v.steps, ref.steps, strict=False)):
        late = _rel_diff(np.array([a.start, a.duration]), np.array([b.start, b.duration]))
        blocks = a.blocks is not None and b.blocks is not None and a.blocks != b.blocks
        if a.scheduled != b.scheduled or a.preempted != b.preempted or late.any() or blocks:
            first = k
            break
    if first is None and len(v.steps) != len(ref.steps):
        first = min(len(v.steps), len(ref.steps))
    arrival = np.array([r.arrival_s for r in cfg.requests])
    ttft = _rel_diff(v.first_token - arrival, ref.first_token - arrival)
    e2e = _rel_diff(v.finish - arrival, ref.finish - arrival)
    same_fast = (
        len(fast.steps) == len(ref.steps)
        and fast.preemptions == ref.preemptions
        and not _rel_diff(fast.first_token, ref.first_token).any()
        and not _rel_diff(fast.finish, ref.finish).any()
    )
    return Comparison(
        cfg.name,
        len(v.steps),
        len(ref.steps),
        v.preemptions,
        ref.preemptions,
        first,
        float(ttft.max()),
        float(ttft.mean()),
        float(e2e.max()),
        float(e2e.mean()),
        same_fast,
        int(v.cached.sum()),
        int(ref.cached.sum()),
        sum(len(r.prompt) for r in cfg.requests),
    )


# --- traces ------------------------------------------------------------------------


def azure_requests(
    n: int, *, time_scale: float = 4.0, path: Path = AZURE_SAMPLE, seed: int = 0
) -> list[Request]:
    """The first ``n`` requests of an Azure LLM trace CSV, ``time_scale`` times faster.

    Prompts get random token ids (no two share a block), so prefix caching cannot hit.
    """
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    t0: datetime | None = None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
            t0 = t0 or ts
            prompt = int(row["ContextTokens"])
            ids = rng.integers(1, VOCAB, prompt).tolist()
            out.append(
                Request(
                    (ts - t0).total_seconds() / time_scale, ids, max(int(row["GeneratedTokens"]), 1)
                )
            )
            if len(out) == n:
                break
    return out


def shared_prefix_requests(
    n: int, *, rate: float, seed: int = 0, prefixes: Sequence[int] = (1024, 512, 256, 96)
) -> list[Request]:
    """Token-id requests in conversations: each starts with one of a few system prompts,
    later turns repeat the whole previous turn (prompt and answer) and add a question.
    Poisson arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(1, VOCAB, k).tolist() for k in prefixes]
    history: list[list[int]] = []
    out: list[Request] = []
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(1.0 / rate))
        if history and rng.random() < 0.5:
            base = history[int(rng.integers(len(history)))]
        else:
            base = systems[int(rng.integers(len(systems)))]
        prompt = base + rng.integers(1, VOCAB, int(rng.integers(20, 400))).tolist()
        prompt = prompt[:3000]
        output = int(rng.integers(10, 300))
        history.append(prompt + rng.integers(1, VOCAB, output).tolist())
        out.append(Request(t, prompt, output))
    return out


def quoted_answer_requests(n: int, *, rate: float, seed: int = 3) -> list[Request]:
    """Conversations whose later turns quote an earlier turn whole, its answer included:
    each request starts with one of a few system prompts or with an earlier request's
    prompt and the tokens it generated (``output_ids``), then adds a question. Poisson
    arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(1, VOCAB, k).tolist() for k in (512, 256, 96)]
    out: list[Request] = []
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(1.0 / rate))
        if out and rng.random() < 0.6:
            turn = out[int(rng.integers(len(out)))]
            base = turn.prompt + (turn.output_ids or [])
        else:
            base = systems[int(rng.integers(len(systems)))]
        prompt = (base + rng.integers(1, VOCAB, int(rng.integers(20, 200))).tolist())[:3000]
        output = int(rng.integers(10, 200))
        out.append(Request(t, prompt, output, output_ids=rng.integers(1, VOCAB, output).tolist()))
    return out


def partial_block_requests(n: int, *, rate: float, seed: int = 4) -> list[Request]:
    """Prompts for 64-token trace blocks that share only whole ones, or all of themselves: a
    system prompt of whole blocks and a question of its own (no prompt a multiple of 64
    tokens long), or, for a third of them, an earlier prompt again (a retry: its partial
    last block too). Poisson arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(1, VOCAB, k).tolist() for k in (512, 256, 128)]
    out: list[Request] = []
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(1.0 / rate))
        if out and rng.random() < 0.35:
            prompt = list(out[int(rng.integers(len(out)))].prompt)
        else:
            length = int(rng.integers(1, 700))
            length += int(length % 64 == 0)
            system = systems[int(rng.integers(len(systems)))]
            prompt = system + rng.integers(1, VOCAB, length).tolist()
        out.append(Request(t, prompt, int(rng.integers(10, 200))))
    return out


# --- the configurations ------------------------------------------------------------

AZURE_RAW = (
    REPO.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
)


def configurations(full: bool = False) -> list[Config]:
    """The conformance configurations; ``full`` uses 2,000 requests of the real Azure
    conversation trace beside the project (the bundled 599-request sample otherwise)."""
    if full and not AZURE_RAW.exists():
        raise FileNotFoundError(
            f"the full set replays {AZURE_RAW}: the real public traces beside the project"
        )
    azure = azure_requests(2000, path=AZURE_RAW) if full else azure_requests(300)
    rng = np.random.default_rng(1)
    prio = [Request(r.arrival_s, r.prompt, r.output, int(rng.integers(0, 4))) for r in azure]
    burst = [Request(0.0, r.prompt, r.output) for r in azure[: 300 if full else 150]]
    lone = [Request(0.0, np.random.default_rng(2).integers(1, VOCAB, 3000).tolist(), 20)]
    longp = [
        Request(0.05 * k, np.random.default_rng(k).integers(1, VOCAB, 3000).tolist(), 30)
        for k in range(12)
    ]
    shared = shared_prefix_requests(400 if full else 150, rate=8.0)
    quoted = quoted_answer_requests(400 if full else 150, rate=6.0)
    partial = partial_block_requests(400 if full else 150, rate=6.0)
    tight = 1500 if full else 450
    sync = _sync_configurations(
        azure, prio, burst, lone, longp, shared, quoted, partial, tight, full
    )
    # vLLM's AsyncScheduler behind the engine core's batch queue, on the same workloads
    slow = azure_requests(
        2000 if full else 300, time_scale=1.0, path=AZURE_RAW if full else AZURE_SAMPLE
    )
    extra = [
        Config("azure_1x", slow, 20_000, what="Azure conversation at its own rate: mostly idle"),
        Config(
            "own_blocks_tight",
            azure,
            tight,
            enable_prefix_caching=True,
            max_num_batched_tokens=256,
            long_prefill_token_threshold=64,
            what="prefix caching on prompts that share nothing, tight KV, threshold 64: "
            "resumed requests hit their own prompt and generated blocks",
        ),
        Config(
            "tiny_kv",
            small_requests(43, 40, 0.02),
            24,
            max_num_batched_tokens=256,
            max_num_seqs=8,
            what="40 requests on 24 KV blocks: a finishing request preempted, a decision "
            "that schedules nothing but preempts",
        ),
    ]
    return sync + [
        dataclasses.replace(c, name=f"async_{c.name}", async_scheduling=True)
        for c in [*sync, *extra]
    ]


def small_requests(seed: int, n: int, gap_s: float) -> list[Request]:
    """``n`` requests of 20-200 random tokens and 2-60 outputs, Poisson arrivals ``gap_s`` apart."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(gap_s, n))
    return [
        Request(
            float(t[k]),
            rng.integers(1, VOCAB, int(rng.integers(20, 200))).tolist(),
            int(rng.integers(2, 60)),
        )
        for k in range(n)
    ]


def _sync_configurations(
    azure: list[Request],
    prio: list[Request],
    burst: list[Request],
    lone: list[Request],
    longp: list[Request],
    shared: list[Request],
    quoted: list[Request],
    partial: list[Request],
    tight: int,
    full: bool,
) -> list[Config]:
    """The configurations against vLLM's synchronous ``Scheduler``."""
    return [
        Config("azure_4x", azure, 20_000, what="Azure conversation at 4x, ample KV, defaults"),
        Config(
            "chunked_off",
            azure,
            20_000,
            enable_chunked_prefill=False,
            max_num_batched_tokens=8192,
            what="chunked prefill off (a prompt waits for a budget it fits whole)",
        ),
        Config("max_num_seqs_8", azure, 20_000, max_num_seqs=8, what="max_num_seqs = 8"),
        Config(
            "threshold_512_load",
            azure,
            20_000,
            long_prefill_token_threshold=512,
            max_num_batched_tokens=2048,
            what="long_prefill_token_threshold = 512 under load, budget 2048",
        ),
        Config(
            "threshold_512_lone",
            lone,
            2_000,
            long_prefill_token_threshold=512,
            what="one 3,000-token prompt alone with threshold 512 (not capped)",
        ),
        Config(
            "tight_kv",
            azure,
            tight,
            max_num_batched_tokens=512,
            what=f"{tight} KV blocks, budget 512: preemptions, full-sequence admission",
        ),
        Config(
            "tight_kv_chunk_admission",
            azure,
            tight,
            max_num_batched_tokens=512,
            scheduler_reserve_full_isl=False,
            what="the same with scheduler_reserve_full_isl = false (vLLM < 0.33 admission)",
        ),
        Config(
            "burst_tight_kv",
            burst,
            tight,
            what=f"{len(burst)} requests at once, tight KV",
        ),
        Config(
            "prefix_ample",
            shared,
            20_000,
            enable_prefix_caching=True,
            what="prefix caching, token ids with shared prefixes (vLLM's own hashes), ample KV",
        ),
        Config(
            "prefix_tight",
            shared,
            350,
            enable_prefix_caching=True,
            what="prefix caching, shared prefixes, tight KV (evictions, preemptions)",
        ),
        Config(
            "prefix_threshold_tight",
            shared,
            350 if full else 450,
            enable_prefix_caching=True,
            long_prefill_token_threshold=256,
            max_num_batched_tokens=2048,
            what="prefix caching, shared prefixes, threshold 256, tight KV: requests that "
            "compute the same blocks in the same steps each cache a copy",
        ),
        Config(
            "prefix_quoted_answers",
            quoted,
            20_000,
            enable_prefix_caching=True,
            output_hashes=True,
            what="prefix caching, later turns quoting an earlier turn and its answer; the "
            "simulator gets the hashes of the generated blocks",
        ),
        Config(
            "prefix_quoted_answers_tight",
            quoted,
            260,
            enable_prefix_caching=True,
            output_hashes=True,
            what="the same with tight KV (evictions, preemptions)",
        ),
        Config(
            "prefix_partial_blocks",
            partial,
            20_000,
            enable_prefix_caching=True,
            trace_block=64,
            what="prefix caching, the simulator on 64-token trace hashes with the partial last "
            "block hashed (Mooncake's way): retries hit the 16-token blocks inside it",
        ),
        Config(
            "priority",
            prio,
            tight,
            scheduling_policy="priority",
            what="priority scheduling (priorities 0-3), tight KV",
        ),
        Config("watermark", azure, tight, watermark=0.05, what="watermark 0.05, tight KV"),
        Config(
            "prompt_over_budget",
            longp,
            3_000,
            max_num_batched_tokens=512,
            what="3,000-token prompts, budget 512: every prompt in chunks",
        ),
    ]


def speculative_configurations() -> list[Config]:
    """Speculative decoding against vLLM's synchronous ``Scheduler`` with a
    ``SpeculativeConfig``: the fake runner returns 1 + accepted tokens per verify (the
    simulator's draws) and k drafts after every step; KV blocks in use are compared too."""
    tiny = small_requests(43, 40, 0.02)
    azure = azure_requests(120)
    shared = shared_prefix_requests(120, rate=8.0)
    rng = np.random.default_rng(45)
    once = [  # prompts of 16 m + 1 tokens, each sent again: a whole hit but the last token
        Request(0.03 * k, rng.integers(1, VOCAB, 16 * int(rng.integers(2, 12)) + 1).tolist(),
                int(rng.integers(5, 60)))
        for k in range(40)
    ]  # fmt: skip
    retried = sorted(
        once + [dataclasses.replace(r, arrival_s=r.arrival_s + 0.4) for r in once],
        key=lambda r: r.arrival_s,
    )
    edge = small_requests(44, 30, 0.01)
    edge_len = max(len(r.prompt) + r.output for r in edge)
    kw: dict[str, Any] = {"max_num_batched_tokens": 256, "max_num_seqs": 8}
    return [
        *(
            Config(
                f"spec_{m}_tiny_kv",
                tiny,
                60,
                speculative={"method": m, "num_tokens": 3, "acceptance": 0.7},
                what=f"{m}, k = 3, acceptance 0.7; 40 requests on 60 KV blocks, budget 256: "
                "preemptions"
                + (", lookahead slots" if m != "ngram" else "")
                + (", a drafting slot per request" if m == "draft_model" else ""),
                **kw,
            )
            for m in ("ngram", "eagle", "draft_model")
        ),
        Config(
            "spec_eagle_azure_tight",
            azure,
            400,
            max_num_batched_tokens=512,
            long_prefill_token_threshold=128,
            speculative={"method": "eagle", "num_tokens": 4, "acceptance": [0.9, 0.7, 0.5, 0.3]},
            what="eagle, k = 4, acceptance per position; Azure at 4x on 400 blocks, budget "
            "512, threshold 128: chunked prompts beside verifies, preemptions",
        ),
        Config(
            "spec_ngram_prefix_tight",
            shared,
            300,
            enable_prefix_caching=True,
            max_num_batched_tokens=1024,
            speculative={"method": "ngram", "num_tokens": 5, "acceptance": 0.6},
            what="ngram, k = 5, prefix caching with shared prefixes on 300 blocks",
        ),
        Config(
            "spec_eagle_prefix_retries",
            retried,
            20_000,
            enable_prefix_caching=True,
            speculative={"method": "eagle", "num_tokens": 3, "acceptance": 0.7},
            what="prompts sent twice, prefix caching: a retry that hits all but its last token "
            "is padded to 1 + k rows",
        ),
        Config(
            "spec_draft_model_max_model_len",
            edge,
            40,
            max_model_len=edge_len,
            speculative={"method": "draft_model", "num_tokens": 8, "acceptance": 0.8},
            what="draft_model, k = 8, max_model_len the longest request's length: drafts and "
            "lookahead capped at max_model_len, 40 blocks",
            **kw,
        ),
    ]
