"""The reference loop: slow, plain Python, one step at a time, obviously correct.

It exists so that tests can hold the fast loop (``loop.py``) to it. It shares
nothing with the fast loop but the step-cost function and the scenario: each
policy is written again here, as close to the engine's own code as Python
lists allow (running list, waiting deque or heap, block counts, a dict and an
``OrderedDict`` for the prefix cache), without any skipping. SGLang and TGI
are in ``reference_engines.py``, blocks and the cache in ``reference_kv.py``.
Use it on tens to hundreds of requests.

Definitions it shares with the fast loop (see ``loop.py``):
- a request arriving at ``a`` can be scheduled by a step starting at ``s >= a``;
- a scheduled request whose prompt (or recompute) is done is a decode of
  context ``computed + 1``; otherwise it is a prefill chunk of ``t`` tokens
  with attention work ``t * (computed + t)``;
- a step that brings ``computed`` up to ``prompt + generated`` samples a token;
- the router sees every step that starts before the arrival;
- with autoscaling, the control ticks up to an arrival run before it, each on
  every replica advanced to the tick, and the router sees only the routable
  replicas (``Scaler`` below, written again from ``autoscale.py``'s docstring).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.sim import autoscale, sched_cpu
from pipeline.sim.cost_model import step_time
from pipeline.sim.kv_tiers import LoopTier
from pipeline.sim.policies import orca, sarathi, sglang, static, vllm
from pipeline.sim.prefix import extend_keys
from pipeline.sim.reference_engines import EngineSchedulers
from pipeline.sim.reference_kv import PrefixCache, Replica, Req, Scheduled
from pipeline.sim.scenario import Scenario
from pipeline.sim.speculation import accepted_py
from pipeline.sim.state import (
    F_ARRIVAL,
    F_FINISH,
    F_FIRST_SCHED,
    F_FIRST_TOKEN,
    NEVER,
    NRQ,
    NRQF,
    NST,
    NSTF,
    R_CACHED,
    R_CHUNKS,
    R_COMPUTED,
    R_GENERATED,
    R_HELD,
    R_LOOKUPS,
    R_NEXT,
    R_NUNITS,
    R_OUTPUT,
    R_PF_END,
    R_PREEMPT,
    R_PRIORITY,
    R_PROMPT,
    R_QDEPTH,
    R_REPLICA,
    R_SETTLED,
    R_SHARED,
    R_SPEC_ACC,
    R_SPEC_DRAFT,
    R_STATUS,
    R_SWAPS,
    R_TAIL,
    R_UNIT_BLK,
    R_UNIT_TOK,
    ST_FINISHED,
    W_CPU_HITS,
    W_DISCARDED,
    W_DISK_HITS,
    W_HITS,
    W_HOFF,
    W_TOTAL,
    PrefixKeys,
    SimInput,
    SimResult,
    priority_column,
    wide,
)


class Scaler:
    """The autoscaler of ``autoscale.py``, one replica state per list entry."""

    def __init__(self, auto: autoscale.Autoscale) -> None:
        self.a = auto
        self.state = ["active"] * auto.initial_replicas
        self.state += ["off"] * (auto.max_replicas - auto.initial_replicas)
        self.up = [math.inf] * auto.max_replicas  # when a starting replica is routable
        self.tick = 1  # the next tick's number: at tick * interval_s
        self.last_up = 0.0  # the initial replicas count as a scale-up at 0
        self.last_down = -math.inf
        self.last_routed = -1  # round robin over the routable replicas
        self.changes: list[tuple[float, int, int]] = []  # (time, replica, START or STOP)

    def next_tick(self) -> float:
        return self.tick * self.a.interval_s

    def promote(self, t: float) -> None:
        for r, st in enumerate(self.state):
            if st == "starting" and self.up[r] <= t:
                self.state[r] = "active"

    def control(self, t: float, loads: list[int]) -> None:
        """One tick at t; ``loads``: every replica's outstanding requests at t."""
        self.promote(t)
        for r, st in enumerate(self.state):
            if st == "draining" and loads[r] == 0:
                self.state[r] = "off"
        active = self.state.count("active")
        starting = self.state.count("starting")
        desired = math.ceil(sum(loads) / self.a.target)
        desired = max(min(desired, self.a.max_replicas), self.a.min_replicas)
        if desired > active + starting:
            off = [r for r, st in enumerate(self.state) if st == "off"]
            for r in off[: desired - active - starting]:
                self.state[r] = "starting"
                self.up[r] = t + self.a.startup_s
                self.changes.append((t, r, autoscale.START))
                self.last_up = t
        elif (
            desired < active
            and t - self.last_up >= self.a.cooldown_s
            and t - self.last_down >= self.a.cooldown_s
        ):
            live = [r for r, st in enumerate(self.state) if st == "active"]
            for r in reversed(live[desired:]):
                self.state[r] = "draining"
                self.changes.append((t, r, autoscale.STOP))
            self.last_down = t
        self.promote(t)
        self.tick += 1

    def routable(self) -> list[int]:
        return [r for r, st in enumerate(self.state) if st == "active"]


class ReferenceLoop(EngineSchedulers):
    """Replays one scenario step by step."""

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.num_blocks = scenario.num_kv_blocks
        self.cost = scenario.cost.as_array(scenario.sched_overlap)
        self.frontend = scenario.frontend.as_array()
        self.reserve = -(-scenario.memory.max_model_len // self.bs)
        self.ratio_init = 0.0
        self.prefix = PrefixKeys.empty(0)
        self.scaler: Scaler | None = None  # the autoscaler, during a run with one
        # vLLM's async scheduling: arrivals wait in an input queue, finished requests are
        # freed once the next step is decided
        self.deferred_free = scenario.policy == "vllm" and scenario.params.async_scheduling
        # swap preemption (swap.py): host blocks per replica, the link's seconds per block
        sw = scenario.swap
        self.swap_blocks = sw.host_blocks if sw is not None else 0
        self.swap_block_s = sw.block_s if sw is not None else 0.0
        self.swap_block_bytes = sw.block_bytes if sw is not None else 0
        self.host_free: dict[int, int] = {}  # replica -> free host blocks (once it swapped)
        self.swapped: dict[int, int] = {}  # request -> its host blocks, while swapped out
        self.swaps: dict[int, int] = {}  # request -> times swapped out
        self.spec: dict[int, list[int]] = {}  # request -> [drafts accepted, drafts verified]
        self.step_swap: dict[int, list[int]] = {}  # replica -> [out, in] blocks of its step
        if scenario.policy == "sglang":
            self.max_running = sglang.max_running(self.p, scenario.memory)
            init = min(sglang.INIT_NEW_TOKEN_RATIO * self.p.schedule_conservativeness, 1.0)
            self.ratio_init = init
            self.ratio_min = init * sglang.MIN_NEW_TOKEN_RATIO_FACTOR
            self.ratio_decay = (init - self.ratio_min) / sglang.NEW_TOKEN_RATIO_DECAY_STEPS

    # --- policies ----------------------------------------------------------
    def schedule_vllm(self, rep: Replica) -> tuple[Scheduled, int, int]:
        """One step as vLLM's engine core decides it (synchronous, or async scheduling)."""
        self.step_swap[rep.index] = [0, 0]
        rep.step_tier = [0, 0, 0, 0]
        if not self.p.async_scheduling:
            return self.vllm_scheduler(rep)
        start = rep.clock
        first = 0
        if rep.steps and rep.last_end == start:  # decided while the previous step ran
            self.take_inbox(rep, rep.last_start)  # the requests added when it started
            rep.pipelined = True
            scheduled, preempted, admitted = self.vllm_scheduler(rep)
            rep.pipelined = False
            self.processed(rep, scheduled)
            if scheduled:
                return scheduled, preempted, admitted
            first = preempted  # nothing to run: wait for it, then decide again
        self.take_inbox(rep, start)
        scheduled, preempted, admitted = self.vllm_scheduler(rep)
        self.processed(rep, scheduled)
        return scheduled, preempted + first, admitted

    @staticmethod
    def take_inbox(rep: Replica, upto: float) -> None:
        """Hand the requests that arrived by ``upto`` to the scheduler (arrival order)."""
        k = 0
        while k < len(rep.inbox) and rep.inbox[k].arrival_s <= upto:
            rep.push(rep.inbox[k])
            k += 1
        del rep.inbox[:k]

    def processed(self, rep: Replica, scheduled: Scheduled) -> None:
        """The previous step's output, processed once this step is decided (async): the
        requests it finished are cached up to their last token and freed."""
        now = {id(req) for req, _ in scheduled}
        keep: list[Req] = []
        for req in rep.running:
            if math.isnan(req.finished_s):
                # every other running request is scheduled (vLLM's RUNNING loop never runs
                # out of budget before one): its decode's input token was in flight
                assert id(req) in now or not scheduled
                keep.append(req)
                continue
            if self.caching:
                self.commit(rep, req, req.computed, False)
            self.release(rep, req)
        rep.running = keep

    def preempt(self, rep: Replica, req: Req) -> None:
        if not math.isnan(req.finished_s):  # async: its last token is in flight
            self.release(rep, req)  # preempted, and still finishes with that step
            req.preemptions += 1
            return
        free = self.host_free.get(rep.index, self.swap_blocks)
        if self.swap_blocks and req.private <= free:  # swapped out: keeps what it computed
            self.host_free[rep.index] = free - req.private
            self.step_swap[rep.index][0] += req.private
            self.swapped[req.index] = req.private
            self.swaps[req.index] = self.swaps.get(req.index, 0) + 1
            self.release(rep, req)
            req.preemptions += 1
            rep.push(req, front=True)
            return
        super().preempt(rep, req)  # recompute (and the fallback when host memory is full)

    def vllm_scheduler(self, rep: Replica) -> tuple[Scheduled, int, int]:
        """One call of vLLM's ``Scheduler.schedule``."""
        rep.queued = rep.num_waiting  # (async: the step's queue depth, after the input queue)
        p: vllm.Params = self.p
        by_priority = p.scheduling_policy == "priority"
        budget = p.max_num_batched_tokens
        threshold = p.long_prefill_token_threshold
        if len(rep.running) + rep.num_waiting <= 1:  # vLLM: a lone request is not capped
            threshold = 0
        scheduled: Scheduled = []
        preempted = 0
        sp = self.sc.speculative  # speculative decoding (speculation.py)
        k = sp.num_tokens if sp is not None else 0
        slots = sp.draft_slots if sp is not None else 0
        look = sp.lookahead if sp is not None else 0
        max_len = self.sc.memory.max_model_len
        i = 0
        while i < len(rep.running) and budget > 0:
            req = rep.running[i]
            if budget - slots * len(scheduled) <= slots:  # input_budget <= draft_slots
                break
            if not math.isnan(req.finished_s):  # async: its last token is in flight
                i += 1
                continue
            new = req.num_tokens - req.computed
            if k and not req.in_prefill:  # num_tokens_with_spec: its drafts
                new += k
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget, budget - slots * (len(scheduled) + 1))
            if k:
                new = min(new, max_len - req.computed - 1)
            end = req.computed + new
            if k:  # allocate_slots(num_lookahead_tokens)
                end = min(end + look, max_len)
            ok = True
            while not self.grow(rep, req, end):
                if by_priority:
                    victim = max(rep.running, key=lambda r: (r.priority, r.arrival_s))
                    pos = rep.running.index(victim)
                    rep.running.remove(victim)
                    if pos < i:  # before it in the list: scheduled already, its tokens go back
                        entry = next((e for e in scheduled if e[0] is victim), None)
                        if entry is not None:  # (async: a finishing one was not)
                            budget += entry[1]
                            scheduled.remove(entry)
                        i -= 1
                else:
                    victim = rep.running.pop()
                self.preempt(rep, victim)
                preempted += 1
                if victim is req:
                    ok = False
                    break
            if not ok:
                if by_priority:  # vLLM goes on with the (higher-priority) requests after it
                    continue
                break
            known = req.computed + new  # blocks are cached up to the tokens known
            if rep.pipelined and not req.in_prefill:
                known -= 1  # its input token is what the step in flight samples
            known = min(known, req.num_tokens)  # never the drafts
            if self.caching:
                self.commit(rep, req, known, False)
            scheduled.append((req, new))
            budget -= new
            i += 1
        if preempted:
            return scheduled, preempted, 0
        admitted = 0
        watermark = int(p.watermark * self.sc.memory.num_gpu_blocks)
        prefill_scheduled = any(req.in_prefill for req, _ in scheduled)
        running_scheduled = len(scheduled)
        while rep.num_waiting and budget > 0:
            if len(rep.running) == p.max_num_seqs:
                break
            room = budget - slots * (len(scheduled) + 1)  # request_token_budget
            if room <= 0:
                break
            req = rep.head()
            looked = self.caching and req.computed == 0
            hits, idle = self.lookup(rep, req) if looked else ([], 0)
            hit = req.hit_tokens(len(hits))
            c, d = self.tier_lookup(rep, req, len(hits)) if looked else (0, 0)
            loaded = req.hit_tokens(len(hits) + c + d) - hit  # from the offloading tiers
            new = req.num_tokens - req.computed - hit - loaded
            if (
                k
                and new == 1
                and not prefill_scheduled
                and (running_scheduled or req.computed + hit > 0)
                and req.computed + hit + 1 + k + 1 <= max_len
            ):  # vLLM pads it to a uniform spec-decode row with placeholder drafts
                if 1 + k > room:
                    break
                new = 1 + k
            if 0 < threshold < new:
                new = threshold
            if not p.enable_chunked_prefill and new > room:
                break
            new = min(new, room)
            keep_free = watermark if rep.running else 0
            end = req.computed + hit + loaded + new
            if k:
                end = min(end + look, max_len)
            chunk = self.blocks_for(end) - req.hit_blocks(len(hits))
            need = chunk
            if p.scheduler_reserve_full_isl:  # allocate_slots(full_sequence_must_fit=True)
                need = self.blocks_for(req.num_tokens) - req.hit_blocks(len(hits))
                if k:  # and then the chunk's slots with the lookahead
                    need = max(need, chunk)
            if need + idle + keep_free > rep.cache.capacity:
                break
            self.use_hits(rep, req, hits)
            req.computed += hit  # (a remote prefill's KV came with it: computed > 0, no hits)
            if loaded:  # loaded into blocks of its own, then committed as computed
                self.tier_load(rep, req, len(hits), c, d)
                req.computed += loaded
            assert self.grow(rep, req, end)
            if looked:
                self.count_lookup(rep, req, len(hits))
                req.hits += loaded
            if self.caching:
                self.commit(rep, req, min(req.computed + new, req.num_tokens), False)
            if req.index in self.swapped:  # swapped back in: resumes where it stopped
                prefill_end = req.prefill_end
                rep.running.append(self.start(rep))
                req.prefill_end = prefill_end
                blocks = self.swapped.pop(req.index)
                self.host_free[rep.index] += blocks
                self.step_swap[rep.index][1] += blocks
            else:
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
            while rep.cache.free <= 0:
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
        while rep.num_waiting:
            req = rep.head()
            if rep.cache.free - self.blocks_for(req.num_tokens) < watermark:
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

    def take_reserved(self, rep: Replica) -> Req:
        """Admit the head with a whole max_model_len of blocks (Orca, static)."""
        req = self.start(rep)
        rep.cache.free -= self.reserve
        req.private = self.reserve
        rep.running.append(req)
        return req

    def schedule_orca(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: orca.Params = self.p
        rep.running.sort(key=lambda r: r.index)
        scheduled: Scheduled = [(req, 1) for req in rep.running]
        admitted = 0
        while rep.num_waiting:
            if self.reserve > rep.cache.free or len(rep.running) + 1 > p.max_num_seqs:
                break
            req = self.take_reserved(rep)
            scheduled.append((req, req.num_tokens))
            admitted += 1
        return scheduled, 0, admitted

    def schedule_static(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: static.Params = self.p
        if rep.running:
            return [(req, 1) for req in rep.running], 0, 0
        scheduled: Scheduled = []
        while (
            rep.num_waiting
            and len(rep.running) < p.max_batch_size
            and self.reserve <= rep.cache.free
        ):
            req = self.take_reserved(rep)
            scheduled.append((req, req.num_tokens))
        return scheduled, 0, len(scheduled)

    # --- the loop ------------------------------------------------------------
    def next_start(self, rep: Replica) -> float:
        if not rep.running and not rep.num_waiting and not rep.inbox:
            return math.inf
        if self.sc.policy == "static" and not rep.running:
            if rep.num_waiting >= self.p.max_batch_size:
                return rep.clock
            return max(rep.clock, rep.head().arrival_s + self.p.max_wait_s)
        return rep.clock

    def step(self, rep: Replica) -> None:
        start = rep.clock
        num_waiting = rep.num_waiting
        evicted0 = rep.cache.evicted
        rep.step_query = rep.step_hit = 0
        schedule = getattr(self, f"schedule_{self.sc.policy}")
        scheduled, preempted, _ = schedule(rep)
        if not scheduled and not preempted:  # vllm async: it had only finished requests
            assert self.deferred_free and not rep.running and not rep.num_waiting
            return
        if self.deferred_free:  # the queue once the engine core took its new requests
            num_waiting = rep.queued
        p_tok = p_attn = n_pf = d = ctx = 0
        sp = self.sc.speculative
        drafted = acc = m = plain = 0
        for req, t in scheduled:
            if req.in_prefill:
                n_pf += 1
                p_tok += t
                p_attn += t * req.computed + t * (t + 1) // 2
            elif sp is not None:  # a verify step: t query rows over its context
                d += t
                ctx += req.computed + t
                p_attn += (t - 1) * req.computed + t * (t - 1) // 2
                m += 1
                plain += req.computed + 1
            else:
                assert t == 1
                d += 1
                ctx += req.computed + 1
        if self.sc.policy == "transformers":  # every query against every key of the batch
            keys = sum(req.computed + t for req, t in scheduled)
            p_attn = (p_tok + d) * keys - ctx
        duration = float(step_time(self.cost, p_tok, p_attn, n_pf + d, d, ctx))
        swap_out, swap_in = self.step_swap.get(rep.index, [0, 0])
        if self.swap_blocks:  # the step waits for its copies over the host link
            duration += (swap_out + swap_in) * self.swap_block_s
        tiers = self.sc.kv_tiers
        load_s = 0.0
        if tiers is not None:  # the step waits for its loads from the offloading tiers
            cpu_s = tiers.block_bytes / tiers.cpu_bytes_per_s
            disk_s = tiers.block_bytes / tiers.disk_bytes_per_s
            load_s = rep.step_tier[2] * cpu_s + rep.step_tier[3] * disk_s
            duration += load_s
        if sp is not None and sp.draft_cost > 0 and m:  # k draft passes (speculation.py)
            plain_s = float(step_time(self.cost, 0.0, 0.0, m, m, plain))
            duration += sp.draft_cost * sp.num_tokens * plain_s
        # (a load from the offloading tiers is no scheduler time the GPU failed to hide)
        cpu = sched_cpu.row(self.cost, 1, duration - load_s, p_tok, p_attn, n_pf + d, d, ctx)
        end = start + duration
        for req, t in scheduled:
            if math.isnan(req.first_scheduled_s):
                req.first_scheduled_s = start
            if req.computed < req.prompt:
                req.chunks += 1
            decoding = not req.in_prefill
            sampled = False
            if sp is not None and decoding:  # the drafts accepted (the counter-based draws)
                a = accepted_py(sp.acceptance, self.sc.seed, req.index, req.generated, t - 1)
                drafted += t - 1
                acc += a
                mine = self.spec.setdefault(req.index, [0, 0])
                mine[0] += a
                mine[1] += t - 1
                req.generated = min(req.generated + 1 + a, req.output)  # + the bonus token
                verified = req.num_tokens - 1 - req.computed  # the rejected drafts roll back
                req.computed += verified
                req.total_computed += verified
                sampled = True
                if self.caching:  # update_from_output caches up to the verified tokens
                    self.commit(rep, req, req.computed, False)
            else:
                req.computed += t
                req.total_computed += t
                if sp is not None and req.computed > req.num_tokens:  # padded drafts: rejected
                    drafted += req.computed - req.num_tokens
                    self.spec.setdefault(req.index, [0, 0])[1] += req.computed - req.num_tokens
                    req.total_computed -= req.computed - req.num_tokens
                    req.computed = req.num_tokens
                if req.computed == req.num_tokens:
                    req.generated += 1
                    sampled = True
            if sampled:
                if req.generated == 1:
                    req.first_token_s = end
                if req.generated == req.output:
                    req.finished_s = end
                    if self.caching and self.sc.policy == "tgi":
                        self.commit(rep, req, req.prompt, True)  # TGI caches at the end
                    if self.deferred_free:  # freed once the next step is decided
                        continue
                    self.release(rep, req)
                    rep.running.remove(req)
                    if self.sc.policy == "sglang" and decoding:
                        rep.pending += 1  # leaves the running batch at the next decode
        tb = tiers.block_bytes if tiers is not None else 0
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
                    self.num_blocks - rep.cache.free - rep.cache.evictable,
                    preempted,
                    rep.step_query,
                    rep.step_hit,
                    rep.cache.evicted - evicted0,
                    swap_out * self.swap_block_bytes,
                    swap_in * self.swap_block_bytes,
                    drafted,
                    acc,
                    rep.step_tier[0],
                    rep.step_tier[1],
                    (rep.step_tier[2] + rep.step_tier[3]) * tb,
                ],
                [start, duration, float(p_attn), float(ctx), *cpu],
            )
        )
        rep.steps += 1
        rep.last_start = start
        rep.clock = rep.last_end = end

    def advance(self, rep: Replica, until: float) -> None:
        while True:
            s = self.next_start(rep)
            if not s < until:
                return
            rep.clock = s
            self.step(rep)

    def route(self, reps: list[Replica], k: int, req: Req, t: float) -> Replica:
        """The replica for request k among ``reps`` (the routable ones)."""
        if self.sc.router == "round_robin" and self.scaler is not None:
            s = self.scaler  # the first routable replica after the latest one used
            after = [rep for rep in reps if rep.index > s.last_routed]
            rep = after[0] if after else reps[0]
            s.last_routed = rep.index
            return rep
        if self.sc.router == "round_robin" or len(reps) == 1:
            return reps[k % len(reps)]
        loads = {rep.index: self.outstanding(rep, t) for rep in reps}
        least = min(reps, key=lambda x: (loads[x.index], x.index))
        if self.sc.router == "least_outstanding":
            return least
        rp = self.sc.router_params or {}
        lo, hi = loads[least.index], max(loads.values())
        if hi - lo > rp["balance_abs_threshold"] and hi > rp["balance_rel_threshold"] * lo:
            return least
        if req.unit_tokens == 0:
            return least
        best: Replica | None = None
        best_units = 0
        for rep in reps:
            h = len(rep.cache.lookup(req.keys, len(req.keys))[0])
            if h > best_units or (
                h == best_units and best is not None and loads[rep.index] < loads[best.index]
            ):
                best, best_units = rep, h
        if best is not None and req.hit_tokens(best_units) > rp["cache_threshold"] * req.prompt:
            return best
        return least

    def run(self, inp: SimInput) -> SimResult:
        reqs = [
            Req(k, float(inp.arrival_s[k]), int(inp.prompt_tokens[k]), int(inp.output_tokens[k]))
            for k in range(len(inp))
        ]
        prefix = inp.prefix if self.caching and inp.prefix is not None else None
        self.prefix = prefix if prefix is not None else PrefixKeys.empty(len(inp))
        if self.caching and self.sc.policy == "vllm":  # generated blocks are cached too
            self.prefix = extend_keys(self.prefix, inp.prompt_tokens, inp.output_tokens)
        off = self.prefix.offsets
        for k, req in enumerate(reqs):
            if inp.priority is not None:
                req.priority = int(inp.priority[k])
            if inp.remote_tokens is not None:  # their KV arrives with them (remote prefill)
                req.computed = int(inp.remote_tokens[k])
            keys = [int(x) for x in self.prefix.keys[off[k] : off[k + 1]]]
            unit = int(self.prefix.unit_tokens[k])
            if unit:
                req.set_units(keys, unit, self.bs, int(self.prefix.tails[k]))
        auto = self.sc.autoscale
        self.scaler = Scaler(auto) if auto is not None else None
        count = auto.max_replicas if auto is not None else self.sc.replicas
        reps = [Replica(r, self.num_blocks, self.sc.by_priority) for r in range(count)]
        tiers = self.sc.kv_tiers
        for rep in reps:
            if tiers is not None:  # KV offloading (kv_tiers.py): empty tiers, warm-up or not
                rep.tiers = [LoopTier(tiers.cpu_blocks), LoopTier(tiers.disk_blocks)]
            rep.ratio = self.ratio_init
            rep.rng = (self.sc.seed * 1_000_003 + rep.index) & ((1 << 64) - 1)
            if self.caching and inp.warmup is not None:
                w = inp.warmup
                for j in range(len(w)):
                    blocks = int(w.unit_tokens[j]) // self.bs
                    keys = [int(x) for x in w.keys[w.offsets[j] : w.offsets[j + 1]]]
                    if blocks > 0 and keys:
                        sizes = [blocks] * len(keys)
                        if w.tails[j]:  # its last unit is its tail
                            sizes[-1] = int(w.tails[j]) // self.bs
                        rep.cache.warm(keys, sizes)
                rep.cache.evicted = 0
        for k, req in enumerate(reqs):
            t = req.arrival_s
            live = reps
            if self.scaler is not None:
                while self.scaler.next_tick() <= t:
                    tick = self.scaler.next_tick()
                    for rep in reps:
                        self.advance(rep, tick)
                    started = len(self.scaler.changes)
                    self.scaler.control(tick, [self.outstanding(rep, tick) for rep in reps])
                    for _, r, kind in self.scaler.changes[started:]:
                        if kind == autoscale.START and self.caching:  # it comes up cold
                            reps[r].cache = PrefixCache(self.num_blocks)
                self.scaler.promote(t)
                live = [reps[r] for r in self.scaler.routable()]
            for rep in reps:
                self.advance(rep, t)
            rep = self.route(live, k, req, t)
            req.replica = rep.index
            req.queue_depth = rep.num_waiting + len(rep.inbox)
            if self.deferred_free:  # vllm async: into the engine's input queue first
                rep.inbox.append(req)
            else:
                rep.push(req)
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
        rq = np.zeros((len(reqs), NRQ), dtype=np.int32)
        rqw = wide(rq)
        rqf = np.full((len(reqs), NRQF), np.nan)
        off = self.prefix.offsets
        for k, q in enumerate(reqs):
            rq[k, R_PROMPT] = q.prompt
            rq[k, R_OUTPUT] = q.output
            rq[k, R_REPLICA] = q.replica
            rq[k, R_STATUS] = ST_FINISHED if not math.isnan(q.finished_s) else 0
            rq[k, R_COMPUTED] = q.computed
            rq[k, R_GENERATED] = q.generated
            rq[k, R_HELD] = q.private
            rq[k, R_SHARED] = q.shared
            rq[k, R_PF_END] = q.prefill_end
            rq[k, R_PREEMPT] = q.preemptions
            rq[k, R_CHUNKS] = q.chunks
            rq[k, R_QDEPTH] = q.queue_depth
            rq[k, R_SWAPS] = self.swaps.get(k, 0)
            rq[k, R_SPEC_ACC], rq[k, R_SPEC_DRAFT] = self.spec.get(k, (0, 0))
            rqw[k, W_TOTAL] = q.total_computed
            rqw[k, W_DISCARDED] = q.discarded
            rqw[k, W_HOFF] = off[k]
            rq[k, R_NUNITS] = len(q.keys)
            rq[k, R_UNIT_TOK] = q.unit_tokens
            rq[k, R_UNIT_BLK] = q.unit_blocks
            rq[k, R_TAIL] = q.tail
            left = len(q.settled) < len(q.keys)  # where its next unit would settle
            rq[k, R_NEXT] = q.ends[len(q.settled)] if left else NEVER
            rq[k, R_SETTLED] = len(q.settled)
            rq[k, R_CACHED] = q.cached
            rq[k, R_LOOKUPS] = q.lookups
            rqw[k, W_HITS] = q.hits
            rqw[k, W_CPU_HITS] = q.cpu_hits
            rqw[k, W_DISK_HITS] = q.disk_hits
            rqf[k, F_ARRIVAL] = q.arrival_s
            rqf[k, F_FIRST_SCHED] = q.first_scheduled_s
            rqf[k, F_FIRST_TOKEN] = q.first_token_s
            rqf[k, F_FINISH] = q.finished_s
        rq[:, R_PRIORITY] = priority_column(np.array([q.priority for q in reqs], dtype=np.int64))
        rows = [row for rep in reps for row in rep.rows]
        rows.sort(key=lambda x: (x[1][0], x[0][0]))
        st = np.array([r[0] for r in rows], dtype=np.int64).reshape(-1, NST)
        stf = np.array([r[1] for r in rows], dtype=np.float64).reshape(-1, NSTF)
        changes = self.scaler.changes if self.scaler is not None else []
        auto = self.sc.autoscale.as_array() if self.sc.autoscale is not None else np.zeros(0)
        return SimResult(
            rq=rq,
            rqf=rqf,
            st=st,
            stf=stf,
            num_kv_blocks=self.num_blocks,
            frontend=self.frontend,
            scale_events=autoscale.scale_events(auto, changes, rq, rqf),
        )


def simulate_reference(inp: SimInput, scenario: Scenario) -> SimResult:
    """Replay ``inp`` through ``scenario`` one step at a time (tests only)."""
    return ReferenceLoop(scenario).run(inp)
