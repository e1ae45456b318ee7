"""The reference loop: slow, plain Python, one step at a time, obviously correct.

It exists so that tests can hold the fast loop (``loop.py``) to it. It shares
nothing with the fast loop but the step-cost function and the scenario: each
policy is written again here, as close to the engine's own code as Python
lists allow (running list, waiting deque, block counts), without any skipping.
Use it on tens to hundreds of requests.

Definitions it shares with the fast loop (see ``loop.py``):
- a request arriving at ``a`` can be scheduled by a step starting at ``s >= a``;
- a scheduled request whose prompt (or recompute) is done is a decode of
  context ``computed + 1``; otherwise it is a prefill chunk of ``t`` tokens
  with attention work ``t * (computed + t)``;
- a step that brings ``computed`` up to ``prompt + generated`` samples a token;
- the router sees every step that starts before the arrival.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from pipeline.sim.cost_model import step_time
from pipeline.sim.policies import orca, sarathi, static, vllm
from pipeline.sim.scenario import Scenario
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    NRQ,
    NRQF,
    NST,
    NSTF,
    R_CHUNKS,
    R_COMPUTED,
    R_DISCARDED,
    R_GENERATED,
    R_HELD,
    R_OUTPUT,
    R_PF_END,
    R_PREEMPT,
    R_PROMPT,
    R_QDEPTH,
    R_REPLICA,
    R_STATUS,
    R_TOTAL,
    ST_FINISHED,
    SimInput,
    SimResult,
)


class Req:
    """One request and everything that happens to it."""

    def __init__(self, index: int, arrival_s: float, prompt: int, output: int) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.prompt = prompt
        self.output = output
        self.replica = -1
        self.computed = 0  # num_computed_tokens
        self.generated = 0  # output tokens sampled
        self.blocks = 0  # KV blocks held
        self.prefill_end = 0  # num_tokens at its last admission
        self.first_scheduled_s = math.nan
        self.first_token_s = math.nan
        self.finished_s = math.nan
        self.preemptions = 0
        self.chunks = 0
        self.queue_depth = 0
        self.total_computed = 0
        self.discarded = 0  # computed tokens thrown away by preemptions

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prefill_end


class Replica:
    def __init__(self, index: int, num_blocks: int) -> None:
        self.index = index
        self.clock = 0.0
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.assigned: list[Req] = []
        self.free = num_blocks
        self.steps = 0
        self.rows: list[tuple[list[int], list[float]]] = []


Scheduled = list[tuple[Req, int]]


class ReferenceLoop:
    """Replays one scenario step by step."""

    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.p = scenario.params
        self.bs = scenario.memory.block_size
        self.num_blocks = scenario.num_kv_blocks
        self.cost = scenario.cost.as_array()
        self.reserve = -(-scenario.memory.max_model_len // self.bs)

    # --- KV blocks -------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def grow(self, rep: Replica, req: Req, tokens: int, keep_free: int = 0) -> bool:
        need = max(0, self.blocks_for(tokens) - req.blocks)
        if need + keep_free > rep.free:
            return False
        rep.free -= need
        req.blocks += need
        return True

    def release(self, rep: Replica, req: Req) -> None:
        rep.free += req.blocks
        req.blocks = 0

    def preempt(self, rep: Replica, req: Req) -> None:
        self.release(rep, req)
        req.discarded += req.computed
        req.computed = 0
        req.preemptions += 1
        rep.waiting.appendleft(req)

    def start(self, rep: Replica) -> Req:
        req = rep.waiting.popleft()
        req.prefill_end = req.num_tokens
        return req

    # --- policies ----------------------------------------------------------
    def schedule_vllm(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: vllm.Params = self.p
        budget = p.max_num_batched_tokens
        threshold = p.long_prefill_token_threshold
        scheduled: Scheduled = []
        preempted = 0
        i = 0
        while i < len(rep.running) and budget > 0:
            req = rep.running[i]
            new = req.num_tokens - req.computed
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget)
            ok = True
            while not self.grow(rep, req, req.computed + new):
                victim = rep.running.pop()
                self.preempt(rep, victim)
                preempted += 1
                if victim is req:
                    ok = False
                    break
            if not ok:
                break
            scheduled.append((req, new))
            budget -= new
            i += 1
        if preempted:
            return scheduled, preempted, 0
        admitted = 0
        watermark = int(p.watermark * self.sc.memory.num_gpu_blocks)
        while rep.waiting and budget > 0:
            if len(rep.running) == p.max_num_seqs:
                break
            req = rep.waiting[0]
            new = req.num_tokens - req.computed
            if 0 < threshold < new:
                new = threshold
            if not p.enable_chunked_prefill and new > budget:
                break
            new = min(new, budget)
            if not self.grow(rep, req, req.computed + new, watermark if scheduled else 0):
                break
            rep.running.append(self.start(rep))
            scheduled.append((req, new))
            budget -= new
            admitted += 1
        return scheduled, 0, admitted

    def schedule_sarathi(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: sarathi.Params = self.p
        watermark = int(p.watermark * self.sc.memory.num_gpu_blocks)
        remaining = sorted(rep.running, key=lambda r: r.index)
        running: list[Req] = []
        prefills: list[Req] = []
        scheduled: Scheduled = []
        preempted = 0
        batched = 0
        while remaining:
            req = remaining.pop(0)
            if req.in_prefill:
                prefills.append(req)
                continue
            preempted_self = False
            while rep.free <= 0:
                if remaining:
                    self.preempt(rep, remaining.pop())
                else:
                    self.preempt(rep, req)
                    preempted_self = True
                preempted += 1
                if preempted_self:
                    break
            if preempted_self:
                continue
            assert self.grow(rep, req, req.computed + 1)
            running.append(req)
            scheduled.append((req, 1))
            batched += 1
        for req in prefills:
            running.append(req)
            chunk = min(req.num_tokens - req.computed, p.chunk_size - batched)
            if chunk > 0:
                scheduled.append((req, chunk))
                batched += chunk
        admitted = 0
        while rep.waiting:
            req = rep.waiting[0]
            if rep.free - self.blocks_for(req.num_tokens) < watermark:
                break
            if len(running) >= p.max_num_seqs:
                break
            chunk = min(req.num_tokens - req.computed, p.chunk_size - batched)
            if chunk <= 0:
                break
            self.start(rep)
            assert self.grow(rep, req, req.num_tokens)
            running.append(req)
            scheduled.append((req, chunk))
            batched += chunk
            admitted += 1
        rep.running = running
        return scheduled, preempted, admitted

    def schedule_orca(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: orca.Params = self.p
        rep.running.sort(key=lambda r: r.index)
        scheduled: Scheduled = [(req, 1) for req in rep.running]
        admitted = 0
        while rep.waiting:
            if self.reserve > rep.free or len(rep.running) + 1 > p.max_num_seqs:
                break
            req = self.start(rep)
            rep.free -= self.reserve
            req.blocks = self.reserve
            rep.running.append(req)
            scheduled.append((req, req.num_tokens))
            admitted += 1
        return scheduled, 0, admitted

    def schedule_static(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: static.Params = self.p
        if rep.running:
            return [(req, 1) for req in rep.running], 0, 0
        scheduled: Scheduled = []
        while rep.waiting and len(rep.running) < p.max_batch_size and self.reserve <= rep.free:
            req = self.start(rep)
            rep.free -= self.reserve
            req.blocks = self.reserve
            rep.running.append(req)
            scheduled.append((req, req.num_tokens))
        return scheduled, 0, len(scheduled)

    # --- the loop ------------------------------------------------------------
    def next_start(self, rep: Replica) -> float:
        if not rep.running and not rep.waiting:
            return math.inf
        if self.sc.policy == "static" and not rep.running:
            if len(rep.waiting) >= self.p.max_batch_size:
                return rep.clock
            return max(rep.clock, rep.waiting[0].arrival_s + self.p.max_wait_s)
        return rep.clock

    def step(self, rep: Replica) -> None:
        start = rep.clock
        num_waiting = len(rep.waiting)
        schedule = getattr(self, f"schedule_{self.sc.policy}")
        scheduled, preempted, _ = schedule(rep)
        assert scheduled or preempted, "a step that does nothing"
        p_tok = p_attn = d = ctx = 0
        for req, t in scheduled:
            if req.in_prefill:
                p_tok += t
                p_attn += t * req.computed + t * (t + 1) // 2
            else:
                assert t == 1
                d += 1
                ctx += req.computed + 1
        duration = float(step_time(self.cost, p_tok, p_attn, d, ctx))
        end = start + duration
        for req, t in scheduled:
            if math.isnan(req.first_scheduled_s):
                req.first_scheduled_s = start
            if req.computed < req.prompt:
                req.chunks += 1
            req.computed += t
            req.total_computed += t
            if req.computed == req.num_tokens:
                req.generated += 1
                if req.generated == 1:
                    req.first_token_s = end
                if req.generated == req.output:
                    req.finished_s = end
                    self.release(rep, req)
                    rep.running.remove(req)
        rep.rows.append(
            (
                [
                    rep.index,
                    rep.steps,
                    1,
                    len(scheduled),
                    num_waiting,
                    p_tok,
                    d,
                    self.num_blocks - rep.free,
                    preempted,
                ],
                [start, duration],
            )
        )
        rep.steps += 1
        rep.clock = end

    def advance(self, rep: Replica, until: float) -> None:
        while True:
            s = self.next_start(rep)
            if not s < until:
                return
            rep.clock = s
            self.step(rep)

    def run(self, inp: SimInput) -> SimResult:
        reqs = [
            Req(k, float(inp.arrival_s[k]), int(inp.prompt_tokens[k]), int(inp.output_tokens[k]))
            for k in range(len(inp))
        ]
        reps = [Replica(r, self.num_blocks) for r in range(self.sc.replicas)]
        for k, req in enumerate(reqs):
            t = req.arrival_s
            for rep in reps:
                self.advance(rep, t)
            if self.sc.router == "round_robin":
                rep = reps[k % len(reps)]
            else:
                rep = min(reps, key=lambda x: (self.outstanding(x, t), x.index))
            req.replica = rep.index
            req.queue_depth = len(rep.waiting)
            rep.waiting.append(req)
            rep.assigned.append(req)
            if not rep.running and rep.clock < t:
                rep.clock = t
        for rep in reps:
            self.advance(rep, math.inf)
        return self.result(reqs, reps)

    @staticmethod
    def outstanding(rep: Replica, t: float) -> int:
        return sum(1 for q in rep.assigned if not q.finished_s <= t)

    def result(self, reqs: list[Req], reps: list[Replica]) -> SimResult:
        rq = np.zeros((len(reqs), NRQ), dtype=np.int64)
        rqf = np.full((len(reqs), NRQF), np.nan)
        for k, q in enumerate(reqs):
            rq[k, R_PROMPT] = q.prompt
            rq[k, R_OUTPUT] = q.output
            rq[k, R_REPLICA] = q.replica
            rq[k, R_STATUS] = ST_FINISHED if not math.isnan(q.finished_s) else 0
            rq[k, R_COMPUTED] = q.computed
            rq[k, R_GENERATED] = q.generated
            rq[k, R_HELD] = q.blocks
            rq[k, R_PF_END] = q.prefill_end
            rq[k, R_PREEMPT] = q.preemptions
            rq[k, R_CHUNKS] = q.chunks
            rq[k, R_QDEPTH] = q.queue_depth
            rq[k, R_TOTAL] = q.total_computed
            rq[k, R_DISCARDED] = q.discarded
            rqf[k, F_ARRIVAL] = q.arrival_s
            rqf[k, F_FIRST_SCHED] = q.first_scheduled_s
            rqf[k, F_FIRST_TOKEN] = q.first_token_s
            rqf[k, F_FINISH] = q.finished_s
        rows = [row for rep in reps for row in rep.rows]
        rows.sort(key=lambda x: (x[1][0], x[0][0]))
        st = np.array([r[0] for r in rows], dtype=np.int64).reshape(-1, NST)
        stf = np.array([r[1] for r in rows], dtype=np.float64).reshape(-1, NSTF)
        return SimResult(rq=rq, rqf=rqf, st=st, stf=stf, num_kv_blocks=self.num_blocks)


def simulate_reference(inp: SimInput, scenario: Scenario) -> SimResult:
    """Replay ``inp`` through ``scenario`` one step at a time (tests only)."""
    return ReferenceLoop(scenario).run(inp)
