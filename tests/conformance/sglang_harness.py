"""SGLang's own admission code on batch states recorded from the ``sglang`` policy.

SGLang's ``Scheduler`` cannot be built without a model (its constructor builds a
``TpModelWorker``, see docs/conformance.md), so the loop is not driven whole.
What is driven is the code that decides a prefill batch, SGLang's own and
unmodified: ``SchedulePolicy.calc_priority`` (the waiting order), ``PrefillAdder``
(``add_chunked_req``, ``add_one_req``, ``budget_state``: the token budgets, the
``new_token_ratio`` reservation, chunking) over a real ``RadixCache`` and a real
``TokenToKVPoolAllocator`` on CPU.

1. The simulator's reference loop runs the ``sglang`` policy; at every prefill
   decision (``sglang_prefill``) the state is recorded before it acts: the
   waiting queue in its order, the running batch (generated and wanted tokens
   of each), the request in chunked prefill, ``new_token_ratio``,
   ``batch_is_full``, the free tokens, every cached unit with its reference
   count. After it acts: the requests it admitted with their extend lengths,
   the sorted queue and ``batch_is_full``.
2. Each state is rebuilt in SGLang's objects: a ``TokenToKVPoolAllocator`` of
   the free tokens, a ``RadixCache`` holding exactly the cached units (each
   unit's tokens under its prefix path; units some request references are
   locked with ``inc_lock_ref``, so ``evictable_size`` is the simulator's
   evictable tokens), ``Req`` objects with ``SamplingParams(max_new_tokens =
   output, ignore_eos=False)`` and their generated tokens as ``output_ids``, a
   ``ScheduleBatch`` of the running requests.
3. The loop of ``Scheduler._get_new_batch_prefill_raw`` (the few lines around
   the adder, written out here as the scheduler has them) runs SGLang's
   ``calc_priority``, ``PrefillAdder`` and ``add_one_req``; the admitted
   requests, their extend lengths (``extend_end - prefix_len``), the queue
   order and ``batch_is_full`` must equal the simulator's.

Token ids: a cached unit of the simulator is a key (a chained prefix hash); its
tokens are the key repeated ``unit_tokens`` times, so that two units differ at
their first token and the radix tree matches whole units as the simulator does.
The tail of a prompt past its last full unit, and generated tokens, are unique
to the request.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import types
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.sim.reference import ReferenceLoop
from pipeline.sim.reference_kv import Replica, Scheduled
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.state import PrefixKeys, SimInput

REPO = Path(__file__).resolve().parents[2]
TRACES_RAW = REPO.parent / "shared" / "traces_raw"
MOONCAKE_RAW = TRACES_RAW / "mooncake" / "conversation_trace.jsonl"
AZURE_RAW = TRACES_RAW / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_SAMPLE = REPO / "traces" / "azure_conv.csv"
MOONCAKE_SAMPLE = REPO / "traces" / "mooncake.jsonl.zst"
PROFILE = "llama-3-8b_h100-80gb_tp1"
TAIL = 1 << 62  # token ids of prompt tails and generated tokens: unique per request
OUT = 1 << 61


# --- importing SGLang on CPU --------------------------------------------------------


class _Absent(types.ModuleType):
    """A stand-in for a package that cannot load on CPU: any attribute is a placeholder."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        raise RuntimeError(f"{self._name} is not available on CPU (a conformance import shim)")


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == self.root or name.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Absent(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _torchvision_loads() -> bool:
    try:
        importlib.import_module("torchvision")
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def load_sglang() -> types.SimpleNamespace:
    """SGLang's scheduling classes, imported on CPU.

    ``sglang.srt.managers.schedule_policy`` imports ``sglang.srt.configs``, whose
    multi-modal model configs import ``torchvision`` at module level (image
    transforms; nothing the scheduler calls). PyPI's torchvision wheels are CUDA
    builds pinned to one torch and do not load next to the CPU torch, so when
    torchvision cannot be imported a stand-in package is put under that name
    (any use of it raises); transformers is asked first, so it still sees no
    torchvision. Nothing of SGLang is replaced.
    """
    if not _torchvision_loads() and not any(isinstance(f, _StandIn) for f in sys.meta_path):
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()  # cached as False before the stand-in
        sys.modules.pop("torchvision", None)
        sys.meta_path.insert(0, _StandIn("torchvision"))
    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    return types.SimpleNamespace(
        torch=torch,
        Req=Req,
        ScheduleBatch=ScheduleBatch,
        AddReqResult=AddReqResult,
        PrefillAdder=PrefillAdder,
        SchedulePolicy=SchedulePolicy,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        InsertParams=InsertParams,
        MatchPrefixParams=MatchPrefixParams,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
        SpawnRanks=SpawnRanks,
        publish=publish,
        reset_context=reset_context,
        SamplingParams=SamplingParams,
        ServerArgs=ServerArgs,
    )


def sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


# --- workloads ----------------------------------------------------------------------


@dataclass
class Workload:
    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    keys: list[list[int]]  # chained prefix keys of each prompt's full units
    unit_tokens: int

    def sim_input(self) -> SimInput:
        counts = np.array([len(k) for k in self.keys], dtype=np.int64)
        flat = [x for k in self.keys for x in k]
        prefix = PrefixKeys(
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            np.array(flat, dtype=np.uint64),
            np.full(len(self.keys), self.unit_tokens, dtype=np.int64),
        )
        return SimInput(
            self.arrival_s.astype(np.float64),
            self.prompt.astype(np.int64),
            self.output.astype(np.int64),
            prefix=prefix,
        )


def mooncake(
    n: int, *, start: int = 0, time_scale: float = 1.0, path: Path = MOONCAKE_RAW
) -> Workload:
    """``n`` requests of a Mooncake trace (JSONL, plain or zstd) from row ``start``: its
    chained 512-token block hashes are the prefix keys (full blocks only)."""
    from pipeline.ingest.reader import open_source, read_all

    opened = open_source(path)
    try:
        lines = read_all(path, opened).decode().splitlines()
    finally:
        opened.stream.close()
    rows = [json.loads(line) for line in lines[start : start + n]]
    t0 = rows[0]["timestamp"]
    prompt = np.array([r["input_length"] for r in rows])
    return Workload(
        np.array([(r["timestamp"] - t0) / 1000.0 / time_scale for r in rows]),
        prompt,
        np.array([max(int(r["output_length"]), 1) for r in rows]),
        [
            [int(h) + 1 for h in r["hash_ids"][: p // 512]]
            for r, p in zip(rows, prompt, strict=True)
        ],
        512,
    )


def azure(n: int, *, time_scale: float = 4.0, path: Path = AZURE_SAMPLE) -> Workload:
    """``n`` requests of an Azure LLM trace CSV: no prefix keys (nothing to share)."""
    import csv
    from datetime import datetime

    arr, prompt, output = [], [], []
    t0 = None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
            t0 = t0 or ts
            arr.append((ts - t0).total_seconds() / time_scale)
            prompt.append(int(row["ContextTokens"]))
            output.append(max(int(row["GeneratedTokens"]), 1))
            if len(arr) == n:
                break
    return Workload(np.array(arr), np.array(prompt), np.array(output), [[] for _ in arr], 512)


def shared_prefixes(n: int, *, rate: float, unit: int = 64, seed: int = 0) -> Workload:
    """Conversations with shared prefixes, as chained keys of ``unit``-token units: each
    request starts with one of four system prompts or a whole earlier turn (prompt and
    answer), then its own question. Poisson arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    next_key = [1]

    def fresh(k: int) -> list[int]:
        out = list(range(next_key[0], next_key[0] + k))
        next_key[0] += k
        return out

    systems = [(fresh(m // unit), m) for m in (1024, 512, 256, 128)]
    history: list[tuple[list[int], int]] = []
    arr, prompt, output, keys = [], [], [], []
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(1.0 / rate))
        base_keys, base_len = (
            history[int(rng.integers(len(history)))]
            if history and rng.random() < 0.5
            else systems[int(rng.integers(len(systems)))]
        )
        own = int(rng.integers(20, 400))
        length = min(base_len + own, 6000)
        full = length // unit
        k = base_keys[: min(full, len(base_keys))]
        k = k + fresh(full - len(k))
        out = int(rng.integers(10, 300))
        arr.append(t)
        prompt.append(length)
        output.append(out)
        keys.append(k)
        # the next turn quotes this one whole: prompt and answer, new keys past the prompt
        history.append((k + fresh((length + out) // unit - len(k)), length + out))
    return Workload(np.array(arr), np.array(prompt), np.array(output), keys, unit)


# --- recording the simulator's decisions -------------------------------------------


@dataclass
class ReqState:
    index: int
    prompt: int
    generated: int
    output: int
    computed: int


@dataclass
class Decision:
    """One call of the reference loop's ``sglang_prefill``: the state before, the result."""

    step: int
    waiting: list[ReqState]
    running: list[ReqState]  # the running batch less the request in chunked prefill
    pending: int  # finished requests not yet filtered out of the running batch
    chunked: ReqState | None
    ratio: float
    full: bool
    free: int
    units: list[tuple[int, int, int]]  # (key, tokens, references) of every cached unit
    # the simulator's result
    admitted: list[tuple[int, int]] = field(default_factory=list)  # (request, extend tokens)
    order: list[int] = field(default_factory=list)  # waiting queue after sorting
    full_after: bool = False


def _state(r: Any) -> ReqState:
    return ReqState(r.index, r.prompt, r.generated, r.output, r.computed)


@dataclass
class RatioStep:
    """One decode step of the simulator: ``new_token_ratio`` before and after, and the
    running requests (generated, wanted tokens) left after any retraction."""

    ratio: float
    retracted: int
    left: list[tuple[int, int]]
    after: float


class _Recording(ReferenceLoop):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.decisions: list[Decision] = []
        self.ratio_steps: list[RatioStep] = []

    def sglang_decode(self, rep: Replica) -> tuple[Scheduled, int]:
        before = rep.ratio
        out = super().sglang_decode(rep)
        left = [(r.generated, r.output) for r in rep.running]
        self.ratio_steps.append(RatioStep(before, out[1], left, rep.ratio))
        return out

    def sglang_sort(self, rep: Replica) -> None:
        super().sglang_sort(rep)
        if self.decisions and not self.decisions[-1].order:
            self.decisions[-1].order = [r.index for r in rep.fifo]

    def sglang_prefill(self, rep: Replica) -> tuple[Scheduled, int] | None:
        c = rep.cache
        d = Decision(
            rep.steps,
            [_state(r) for r in rep.fifo],
            [_state(r) for r in rep.running if r is not rep.chunked],
            rep.pending,
            _state(rep.chunked) if rep.chunked is not None else None,
            rep.ratio,
            rep.full,
            c.free,
            [(u.key, u.blocks * self.bs, u.ref) for copies in c.units.values() for u in copies],
        )
        self.decisions.append(d)
        out = super().sglang_prefill(rep)
        d.admitted = [(r.index, t) for r, t in out[0]] if out is not None else []
        if not d.order:
            d.order = [r.index for r in rep.fifo] if out is None else d.order
        d.full_after = rep.full
        return out


@dataclass
class Config:
    name: str
    workload: Workload
    kv_tokens: int
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 0
    schedule_policy: str = "fcfs"
    enable_prefix_caching: bool = True
    schedule_conservativeness: float = 1.0
    what: str = ""

    def scenario(self) -> Scenario:
        return build_scenario(
            {
                "policy": "sglang",
                "profile": PROFILE,
                "num_gpu_blocks": self.kv_tokens,
                "max_model_len": 131072,
                "enable_prefix_caching": self.enable_prefix_caching,
                "chunked_prefill_size": self.chunked_prefill_size,
                "max_prefill_tokens": self.max_prefill_tokens,
                "max_running_requests": self.max_running_requests,
                "schedule_policy": self.schedule_policy,
                "schedule_conservativeness": self.schedule_conservativeness,
            }
        )


def ratio_mismatches(loop: _Recording) -> tuple[int, int, int]:
    """(decode steps, retractions, steps whose new ``new_token_ratio`` differs from
    SGLang's ``NewTokenRatioTracker``: ``decay_step``, or after a retraction
    ``estimate_new_token_ratio_after_retract`` over the requests left)."""
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (
        NewTokenRatioTracker,
    )

    sg = load_sglang()
    init, low, decay = loop.ratio_init, loop.ratio_min, loop.ratio_decay
    bad = 0
    for st in loop.ratio_steps:
        t = NewTokenRatioTracker(init=init, min=low, decay=decay, current=st.ratio)
        if st.retracted:
            reqs = []
            for j, (gen, want) in enumerate(st.left):
                r = sg.Req(str(j), "", array("q", [1]), sg.SamplingParams(max_new_tokens=want))
                r.output_ids = array("q", [0] * gen)
                reqs.append(r)
            t.current = NewTokenRatioTracker.estimate_new_token_ratio_after_retract(reqs)
        else:
            t.decay_step()
        bad += t.current != st.after
    return len(loop.ratio_steps), sum(1 for st in loop.ratio_steps if st.retracted), bad


def record(cfg: Config) -> tuple[list[Decision], _Recording]:
    loop = _Recording(cfg.scenario())
    loop.run(cfg.workload.sim_input())
    return loop.decisions, loop


# --- SGLang's side ------------------------------------------------------------------


@dataclass
class Verdict:
    admitted: list[tuple[int, int]]
    order: list[int]
    full_after: bool


class SglangSide:
    """Rebuilds recorded states in SGLang's objects and runs its admission on them."""

    def __init__(self, cfg: Config, max_running: int) -> None:
        self.sg = load_sglang()
        self.cfg = cfg
        self.max_running = max_running
        sg = self.sg
        sg.reset_context()
        sg.publish(
            sg.ServerArgs(model_path="dummy", device="cpu", schedule_policy=cfg.schedule_policy),
            role="test",
            ranks=sg.SpawnRanks(world_rank=0, dp_rank=None),
        )
        w = cfg.workload
        self.unit = w.unit_tokens
        self._prompts: dict[int, array] = {}
        self._tree: tuple[Any, Any] | None = None
        self._paths: dict[int, array] = {}
        self.parent: dict[int, int | None] = {}
        for keys in w.keys:
            for j, k in enumerate(keys):
                self.parent.setdefault(k, keys[j - 1] if j else None)

    # token ids (memoised: a state is rebuilt at every decision)
    def prompt_ids(self, index: int, prompt: int) -> array:
        ids = self._prompts.get(index)
        if ids is None:
            keys = self.cfg.workload.keys[index]
            full = self.path_ids(keys[-1])[:prompt] if keys else array("q")
            ids = full + array("q", [TAIL + index]) * (prompt - len(full))
            self._prompts[index] = ids
        return ids

    def path_ids(self, key: int) -> array:
        """Tokens of the path of units ending with unit ``key``: each unit is its key,
        ``unit_tokens`` times."""
        ids = self._paths.get(key)
        if ids is None:
            up = self.parent[key]
            ids = (self.path_ids(up) if up is not None else array("q")) + array(
                "q", [key]
            ) * self.unit
            self._paths[key] = ids
        return ids

    def make_req(self, s: ReqState) -> Any:
        sg = self.sg
        req = sg.Req(
            str(s.index),
            "",
            self.prompt_ids(s.index, s.prompt),
            sg.SamplingParams(max_new_tokens=s.output, ignore_eos=False),
        )
        req.output_ids = array("q", [OUT + s.index] * s.generated)
        return req

    def build(self, d: Decision) -> tuple[Any, Any, int]:
        """(allocator, tree cache, tokens of cached units unreachable from the root)."""
        sg = self.sg
        cached = {k: (tokens, ref) for k, tokens, ref in d.units}
        reachable: dict[int, bool] = {}

        def reaches(k: int) -> bool:  # every unit up to the root is cached
            ok = reachable.get(k)
            if ok is None:
                up = self.parent[k]
                ok = up is None or (up in cached and reaches(up))
                reachable[k] = ok
            return ok

        reach = [k for k in cached if reaches(k)]
        # a unit whose ancestor was evicted: the simulator cannot reach it, so it is
        # free capacity in effect
        orphan = sum(cached[k][0] for k in cached if not reachable[k])
        alloc = sg.TokenToKVPoolAllocator(d.free + orphan, sg.torch.int8, "cpu", None, False)
        # the same units and locks as the last decision: its tree serves again (the
        # locks a decision's admissions took are released after it)
        sig = (frozenset(reach), frozenset(k for k in reach if cached[k][1] > 0))
        if self._tree is not None and self._tree[0] == sig:
            return alloc, self._tree[1], orphan
        tc = sg.RadixCache.create_simulated(
            disable=not self.cfg.enable_prefix_caching, mock_allocator=alloc
        )
        self._tree = (sig, tc)
        # insert the leaves' paths (their prefixes come along); lock the deepest
        # referenced units (locking a node locks its ancestors, as a request's
        # references in the simulator cover all of its leading units)
        reach_set = set(reach)
        has_child = {self.parent[k] for k in reach_set} - {None}
        has_ref_child = {self.parent[k] for k in reach_set if cached[k][1] > 0} - {None}
        for k in reach:
            if k in has_child:
                continue
            ids = self.path_ids(k)
            tc.insert(  # values as SGLang's own simulated trees have them
                sg.InsertParams(
                    key=sg.RadixKey(token_ids=ids),
                    value=sg.torch.empty(len(ids), dtype=sg.torch.bool),
                )
            )
        for k in reach:
            if cached[k][1] == 0 or k in has_ref_child:
                continue
            ids = self.path_ids(k)
            m = tc.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(token_ids=ids)))
            tc.inc_lock_ref(m.last_device_node)
        return alloc, tc, orphan

    def decide(self, d: Decision) -> tuple[Verdict, dict[str, int]]:
        sg = self.sg
        cfg = self.cfg
        if (d.full and (d.running or d.pending) or not d.waiting) and d.chunked is None:
            # returns before SGLang's code is reached (the first lines of the loop below)
            return Verdict([], [s.index for s in d.waiting], d.full), {}
        alloc, tc, orphan = self.build(d)
        sim_evictable = sum(t for _, t, ref in d.units if ref == 0) - orphan
        check = {"evictable_sglang": int(tc.evictable_size()), "evictable_sim": sim_evictable}
        running = [self.make_req(s) for s in d.running]
        for j in range(d.pending):  # finished, not yet filtered: nothing left to reserve
            done = sg.Req(f"done{j}", "", array("q", [0]), sg.SamplingParams(max_new_tokens=1))
            done.output_ids = array("q", [0])
            running.append(done)
        batch = sg.ScheduleBatch(reqs=running)
        waiting = [self.make_req(s) for s in d.waiting]
        chunked = None
        if d.chunked is not None:
            chunked = self.make_req(d.chunked)
        policy = sg.SchedulePolicy(cfg.schedule_policy, tc, False, False, False)
        full = d.full
        # Scheduler._get_new_batch_prefill_raw, SGLang 0.5.x, without the features off here
        if not batch.reqs:
            full = False
        if (full or not waiting) and chunked is None:
            return Verdict([], [int(r.rid) for r in waiting], full), check
        running_bs = len(batch.reqs)
        if self.max_running - running_bs <= 0 and chunked is None:
            return Verdict([], [int(r.rid) for r in waiting], True), check
        policy.calc_priority(waiting, batch)
        order = [int(r.rid) for r in waiting]
        chunk = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else None
        adder = sg.PrefillAdder(1, tc, alloc, batch, d.ratio, cfg.max_prefill_tokens, chunk, 0)
        if chunked is not None:
            chunked.init_next_round_input()
            chunked.prefix_len = d.chunked.computed  # type: ignore[union-attr]
            chunked = adder.add_chunked_req(chunked)
        for req in waiting:
            if adder.budget_state() == sg.AddReqResult.OTHER:
                break
            if len(adder.can_run_list) >= self.max_running - len(batch.reqs):
                full = True
            if full:
                break
            req.init_next_round_input(tc)
            res = adder.add_one_req(
                req, has_chunked_req=chunked is not None, truncation_align_size=None
            )
            if res != sg.AddReqResult.CONTINUE:
                if res == sg.AddReqResult.NO_TOKEN:
                    full = len(adder.can_run_list) > 0 or bool(batch.reqs)
                break
        admitted = [(int(r.rid), int(r.extend_end - r.prefix_len)) for r in adder.can_run_list]
        for r in adder.can_run_list:  # the batch would now run: release what admission locked
            if getattr(r, "lock", None) is not None:
                tc.unlock(r.lock)
        return Verdict(admitted, order, full), check


@dataclass
class Outcome:
    name: str
    decisions: int  # prefill decisions (calls of sglang_prefill)
    admissions: int  # decisions that formed a batch
    same: int  # decisions where SGLang's code did the same
    state_mismatch: int  # rebuilt states whose evictable tokens differ (a harness error)
    decode_steps: int
    retractions: int
    ratio_diffs: int  # decode steps whose new_token_ratio differs from SGLang's
    ratio_diffs_decay: int  # ... of them, steps without a retraction
    seconds: float
    diffs: list[tuple[Decision, Verdict]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.same == self.decisions and self.state_mismatch == 0


def compare(cfg: Config, *, limit: int | None = None) -> Outcome:
    import time

    t0 = time.perf_counter()
    decisions, loop = record(cfg)
    decisions = decisions[:limit]
    side = SglangSide(cfg, loop.max_running)
    same = 0
    mism = 0
    diffs: list[tuple[Decision, Verdict]] = []
    for d in decisions:
        v, check = side.decide(d)
        if check and check["evictable_sglang"] != check["evictable_sim"]:
            mism += 1
        ok = v.admitted == d.admitted and v.full_after == d.full_after
        ok = ok and (not d.admitted or v.order == d.order)
        if ok:
            same += 1
        else:
            diffs.append((d, v))
    steps, retractions, bad = ratio_mismatches(loop)
    decay_only = _Recording.__new__(_Recording)
    decay_only.ratio_steps = [st for st in loop.ratio_steps if not st.retracted]
    decay_only.ratio_init, decay_only.ratio_min, decay_only.ratio_decay = (
        loop.ratio_init,
        loop.ratio_min,
        loop.ratio_decay,
    )
    return Outcome(
        cfg.name,
        len(decisions),
        sum(1 for d in decisions if d.admitted),
        same,
        mism,
        steps,
        retractions,
        bad,
        ratio_mismatches(decay_only)[2],
        time.perf_counter() - t0,
        diffs,
    )


def configurations(n: int = 300) -> list[Config]:
    """The configurations on ``n`` requests of the real Mooncake and Azure conversation
    traces beside the project, and of the shared-prefix generator."""
    return _configurations(
        mooncake(n, path=MOONCAKE_RAW), azure(n, path=AZURE_RAW), shared_prefixes(n, rate=6.0)
    )


def fast_configurations() -> list[Config]:
    """The test suite's set: 100 requests each (Mooncake's long prompts: 50), from the real
    traces where they are beside the project, else from the bundled synthetic samples of
    the same layouts."""
    real = MOONCAKE_RAW.exists() and AZURE_RAW.exists()
    moon = mooncake(50, path=MOONCAKE_RAW if real else MOONCAKE_SAMPLE)
    az = azure(100, path=AZURE_RAW if real else AZURE_SAMPLE)
    return _configurations(moon, az, shared_prefixes(100, rate=6.0))


def _configurations(moon: Workload, az: Workload, shared: Workload) -> list[Config]:
    return [
        Config("mooncake_fcfs", moon, 400_000, what="Mooncake conversation, fcfs, ample KV"),
        Config(
            "mooncake_lpm", moon, 400_000, schedule_policy="lpm", what="Mooncake, lpm, ample KV"
        ),
        Config(
            "mooncake_tight",
            moon,
            160_000,
            what="Mooncake, tight KV (160k tokens): NO_TOKEN refusals",
        ),
        Config(
            "mooncake_chunk_2048",
            moon,
            400_000,
            chunked_prefill_size=2048,
            max_prefill_tokens=4096,
            what="chunked_prefill_size 2048, max_prefill_tokens 4096",
        ),
        Config(
            "mooncake_no_chunking",
            moon,
            400_000,
            chunked_prefill_size=-1,
            what="chunked prefill off: max_prefill_tokens caps the batch",
        ),
        Config(
            "shared_lpm",
            shared,
            60_000,
            schedule_policy="lpm",
            what="shared prefixes (64-token units), lpm",
        ),
        Config(
            "shared_fcfs_tight",
            shared,
            20_000,
            what="shared prefixes, fcfs, tight KV (20k tokens)",
        ),
        Config(
            "shared_retract",
            shared,
            8_000,
            schedule_conservativeness=0.1,
            what="shared prefixes, 8k tokens, schedule_conservativeness 0.1: a retraction",
        ),
        Config(
            "azure_tight",
            az,
            30_000,
            enable_prefix_caching=False,
            what="Azure conversation at 4x, no radix cache, tight KV (30k tokens)",
        ),
        Config(
            "azure_max_running_8",
            az,
            200_000,
            max_running_requests=8,
            enable_prefix_caching=False,
            what="Azure conversation at 4x, max_running_requests 8",
        ),
    ]


def summary(o: Outcome) -> str:
    s = (
        f"{o.name}: {o.same}/{o.decisions} decisions the same ({o.admissions} batches), "
        f"state mismatches {o.state_mismatch}; decode steps {o.decode_steps}, retractions "
        f"{o.retractions}, new_token_ratio differs in {o.ratio_diffs} "
        f"({o.ratio_diffs_decay} without retraction); {o.seconds:.0f} s"
    )
    for d, v in o.diffs[:3]:
        s += (
            f"\n  step {d.step}: simulator {d.admitted[:4]} full={d.full_after}; SGLang "
            f"{v.admitted[:4]} full={v.full_after} (ratio {d.ratio:.4f}, free {d.free}, "
            f"{len(d.waiting)} waiting, {len(d.running)} running)"
        )
    return s


def _main(argv: Sequence[str] = ()) -> None:  # pragma: no cover - a manual entry point
    for cfg in configurations() if "--full" in argv else fast_configurations():
        print(summary(compare(cfg)), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
