"""The reference loop's SGLang, TGI and transformers schedulers, one step at a time, in Python.

Written again from the engines' code paths (``get_new_batch_prefill``,
``PrefillAdder``, ``update_running_batch``, ``retract_decode``;
``batching_task``, ``Queue::next_batch``; ``prepare_next_batch``,
``_process_candidates``, ``offload_requests``), not from the compiled kernels; the
rules are stated in ``policies/sglang.py``, ``policies/tgi.py`` and
``policies/transformers.py``.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.sim.policies import sglang, tgi, transformers
from pipeline.sim.reference_kv import ReferenceKV, Replica, Req, Scheduled

MASK64 = (1 << 64) - 1


def splitmix64(rep: Replica) -> int:
    """The replica's next random number (same generator as the compiled loop)."""
    rep.rng = (rep.rng + 0x9E3779B97F4A7C15) & MASK64
    x = rep.rng
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class EngineSchedulers(ReferenceKV):
    """``schedule_sglang``, ``schedule_tgi`` and ``schedule_transformers``."""

    # --- transformers ----------------------------------------------------------
    def schedule_transformers(self, rep: Replica) -> tuple[Scheduled, int, int]:
        """prepare_next_batch: schedule, soft-reset starved requests, schedule again if empty."""
        finished = sum(1 for q in rep.assigned if not math.isnan(q.finished_s))
        if finished != rep.finished_seen:  # update_batch of the last step finished one
            rep.finished_seen = finished
            rep.block_new = False
        admitted = 0
        reset = 0
        while True:
            batch, starved, failed, adm = self.transformers_candidates(rep)
            admitted += adm
            if batch or not failed:
                break
            k = self.transformers_offload(rep, starved)
            assert k > 0, "No requests can be scheduled and no requests can be offloaded."
            reset += k
        if starved:
            reset += self.transformers_offload(rep, starved)
        return batch, reset, admitted

    def transformers_candidates(
        self, rep: Replica
    ) -> tuple[Scheduled, list[tuple[Req, int]], bool, int]:
        """FIFOScheduler / PrefillFirstScheduler.schedule_batch and _process_candidates."""
        p: transformers.Params = self.p
        decoding = [q for q in rep.running if not q.in_prefill]
        prefilling = [q for q in rep.running if q.in_prefill]
        if p.scheduler_type == "fifo":
            candidates = decoding + prefilling
        else:
            candidates = prefilling + decoding
        if not rep.block_new:
            candidates += list(rep.fifo)
        margin = p.safety_margin
        if margin < 0:
            margin = transformers.DEFAULT_MARGIN[p.scheduler_type]
        in_margin = rep.cache.free / self.sc.num_kv_blocks >= margin
        token_budget = p.max_batch_tokens
        request_budget = p.max_requests_per_batch
        batch: Scheduled = []
        starved: list[tuple[Req, int]] = []
        failed = False
        admitted = 0
        for req in candidates:
            active = any(q is req for q in rep.running)
            if not in_margin and batch and not (active and not req.in_prefill):
                break
            tokens = min(req.num_tokens - req.computed, token_budget)
            if self.need(req, req.computed + tokens) > rep.cache.free:
                failed = True
                if active:
                    starved.append((req, tokens))
                continue
            if not active:
                rep.fifo.remove(req)
                req.prefill_end = req.num_tokens
                rep.running.append(req)
                admitted += 1
            assert self.grow(rep, req, req.computed + tokens)
            batch.append((req, tokens))
            token_budget -= tokens
            request_budget -= 1
            if token_budget == 0 or request_budget <= 0:
                break
        return batch, starved, failed, admitted

    def transformers_offload(self, rep: Replica, starved: list[tuple[Req, int]]) -> int:
        """offload_requests without a CPU pool: every victim is soft reset."""
        victims: list[Req] = []
        num_active = len(rep.running)
        while starved and num_active - len(victims) > 1:
            free = rep.cache.free
            storable = 0
            for req, tokens in starved:
                need = self.need(req, req.computed + tokens)
                if need > free:
                    break
                free -= need
                storable += 1
            if storable == len(starved):
                break
            req, _ = starved.pop()
            victims.append(req)
            rep.running.remove(req)
            self.drop(rep, req)
        for req in reversed(victims):
            rep.push(req)
        if victims:
            rep.block_new = True
        return len(victims)

    # --- SGLang --------------------------------------------------------------
    def sglang_max_units(self, req: Req) -> int:
        return 0 if req.unit_tokens == 0 else req.units_within(req.num_tokens - 1)

    def sglang_sort(self, rep: Replica) -> None:
        """calc_priority: sort the waiting queue in place."""
        p: sglang.Params = self.p
        policy = p.schedule_policy
        queue = list(rep.fifo)
        if policy == "fcfs" or len(queue) < 2:
            return
        if policy in ("lpm", "dfs-weight") and not self.caching:
            return
        if policy == "lpm" and len(queue) > sglang.LPM_FALLBACK_QUEUE:
            return
        if policy == "random":
            for j in range(len(queue) - 1, 0, -1):
                x = splitmix64(rep) % (j + 1)
                queue[j], queue[x] = queue[x], queue[j]
        elif policy == "lof":
            queue.sort(key=lambda r: -r.output)
        elif policy == "lpm":
            queue.sort(
                key=lambda r: (
                    -r.hit_tokens(len(rep.cache.lookup(r.keys, self.sglang_max_units(r))[0]))
                )
            )
        else:  # dfs-weight: post-order DFS over the waiting requests' prefix tree
            paths = [rep.cache.lookup(r.keys, self.sglang_max_units(r))[0] for r in queue]
            weight: dict[int, int] = {}
            first: dict[int, int] = {}
            for j, path in enumerate(paths):
                for unit in path:
                    weight[id(unit)] = weight.get(id(unit), 0) + 1
                    first.setdefault(id(unit), j)

            def key(j: int) -> tuple[list[tuple[int, int]], int]:
                nodes = [(-weight[id(u)], first[id(u)]) for u in paths[j]]
                return [*nodes, (0, 0)], j  # a node's subtrees before its own requests

            queue = [queue[j] for j in sorted(range(len(queue)), key=key)]
        rep.fifo.clear()
        rep.fifo.extend(queue)

    def sglang_prefill(self, rep: Replica) -> tuple[Scheduled, int] | None:
        p: sglang.Params = self.p
        chunked = rep.chunked
        if (rep.full or not rep.fifo) and chunked is None:
            return None
        bs = self.bs
        running_bs = len(rep.running) + rep.pending - (1 if chunked is not None else 0)
        allocatable = self.max_running - running_bs
        if allocatable <= 0 and chunked is None:
            rep.full = True
            return None
        self.sglang_sort(rep)
        chunking = p.chunked_prefill_size > 0
        clip = sglang.CLIP_MAX_NEW_TOKENS
        offset_total = sum(
            min(r.output - r.generated, clip) * rep.ratio for r in rep.running if r is not chunked
        )
        offset_cur = 0
        rem_input = p.max_prefill_tokens
        rem_chunk = max(p.chunked_prefill_size, 0)
        batch: Scheduled = []
        admitted: list[Req] = []
        new_chunked = None
        if chunked is not None:
            ext = chunked.num_tokens - chunked.computed
            limit = rem_chunk  # available_chunk_tokens: capped by the memory left, if any
            left = rep.cache.capacity * bs - offset_total
            if left >= 1:
                limit = min(limit, int(left))
            truncated = chunking and ext > limit
            if truncated:
                ext = limit
                new_chunked = chunked
            batch.append((chunked, ext))
            paged = self.blocks_for(ext) * bs
            offset_total += paged + bs + (0 if truncated else min(chunked.output, clip))
            offset_cur += paged + bs  # reserve(): one page more per request
            rem_input -= paged
            rem_chunk -= paged
        for req in list(rep.fifo):
            cap = rep.cache.capacity * bs
            room = cap - offset_total > 0 and cap - offset_cur > 0
            if room and (rem_input <= 0 or (chunking and rem_chunk <= 0)):
                break  # budget_state() == OTHER: the chunked request spent the budget
            if len(batch) >= allocatable:
                rep.full = True
                break
            hits, idle = self.lookup(rep, req) if req.computed == 0 else ([], 0)
            prefix = req.hit_tokens(len(hits))
            ext = req.num_tokens - prefix
            total = ext + min(req.output - req.generated, clip) + bs  # + per_req_token_overhead
            if total >= rep.cache.capacity * bs - offset_total:
                rep.full = True
                break
            paged = self.blocks_for(ext) * bs
            if not chunking and paged >= rem_input and batch:  # input cap: unchunked only
                break
            if total >= (rep.cache.capacity - idle) * bs - offset_total:
                rep.full = True
                break
            reserve = min(req.output - req.generated, clip)
            if chunking and paged > rem_chunk:
                trunc = rem_chunk // bs * bs
                if trunc <= 0:
                    break
                ext = paged = trunc
                reserve = 0
                new_chunked = req
            self.use_hits(rep, req, hits)
            req.computed = prefix
            if self.caching:
                self.count_lookup(rep, req, len(hits))
            batch.append((req, ext))
            admitted.append(req)
            offset_total += paged + bs + reserve
            offset_cur += paged + bs
            rem_input -= paged
            rem_chunk -= paged
            cap = rep.cache.capacity * bs
            if cap - offset_total <= 0 or cap - offset_cur <= 0:
                rep.full = True
                break
            if rem_input <= 0 or (chunking and rem_chunk <= 0):
                break
        if not batch:
            return None
        for req in admitted:
            assert self.start(rep) is req
            rep.running.append(req)
        for req, t in batch:
            assert self.grow(rep, req, req.computed + t)
        if self.caching:
            for req, t in batch:
                self.commit(rep, req, req.computed + t, True)
        rep.chunked = new_chunked
        return batch, len(admitted)

    def sglang_room(self, rep: Replica, reqs: list[Req], per_request: int) -> bool:
        """check_decode_mem: room for ``per_request`` new blocks of each request needing one."""
        count = sum(1 for r in reqs if self.need(r, r.computed + 1) > 0)
        return rep.cache.make_free(count * per_request)

    def sglang_decode(self, rep: Replica) -> tuple[Scheduled, int]:
        retracted = 0
        need = sum(self.need(r, r.computed + 1) for r in rep.running)
        if not rep.cache.make_free(need):
            order = sorted(
                range(len(rep.running)),
                key=lambda k: (rep.running[k].generated, -rep.running[k].prompt),
                reverse=True,
            )
            gone: set[int] = set()
            first = True
            while first or not self.sglang_room(
                rep, [rep.running[k] for k in order], sglang.RETRACT_DECODE_STEPS
            ):
                if len(order) == 1:
                    break
                first = False
                k = order.pop()
                gone.add(k)
                victim = rep.running[k]
                self.drop(rep, victim)
                rep.push(victim)  # to the back of the queue
                retracted += 1
            rep.running = [r for k, r in enumerate(rep.running) if k not in gone]
            decoded = sum(r.generated for r in rep.running)
            wanted = sum(r.output for r in rep.running)
            rep.ratio = min(
                1.0, (decoded + sglang.RETRACT_DECODE_STEPS * len(rep.running)) / wanted
            )
        elif rep.ratio > self.ratio_min:
            rep.ratio = max(rep.ratio - self.ratio_decay, self.ratio_min)
        scheduled: Scheduled = []
        for req in rep.running:
            assert self.grow(rep, req, req.computed + 1)
            scheduled.append((req, 1))
        return scheduled, retracted

    def schedule_sglang(self, rep: Replica) -> tuple[Scheduled, int, int]:
        if not rep.running and rep.pending == 0:
            rep.full = False  # an empty running batch is a fresh one
        for _ in range(2):
            prefill = self.sglang_prefill(rep)
            if prefill is not None:
                return prefill[0], 0, prefill[1]
            initial = len(rep.running) + rep.pending
            if initial == 0:
                return [], 0, 0
            rep.pending = 0  # filter_batch
            if not rep.running:
                rep.full = False
                continue
            scheduled, retracted = self.sglang_decode(rep)
            if len(rep.running) < initial:
                rep.full = False
            return scheduled, retracted, 0
        return [], 0, 0

    # --- TGI -----------------------------------------------------------------
    def tgi_next_batch(
        self, rep: Replica, min_size: int | None, max_size: int | None, budget: int
    ) -> tuple[Scheduled, int]:
        p: tgi.Params = self.p
        if not rep.fifo:
            return [], tgi.EMPTY
        if min_size is not None and len(rep.fifo) < min_size:
            return [], tgi.SMALL
        if max_size == 0:
            return [], tgi.FULL
        budget = self.blocks_for(max(budget, 0)) * self.bs
        prefill = 0
        batch: Scheduled = []
        why = tgi.GOT
        for req in list(rep.fifo):
            hits, idle = self.lookup(rep, req)
            own = self.blocks_for(req.prompt + req.output - 1) - req.hit_blocks(len(hits))
            if own + idle > rep.cache.capacity:
                why = tgi.NO_MEMORY
                break
            prefix = req.hit_tokens(len(hits))
            self.use_hits(rep, req, hits)
            req.computed = prefix
            rep.cache.take(own)
            req.private += own
            postfix = req.num_tokens - prefix
            if prefill + postfix > budget:
                chunk = budget - prefill
                if p.prefill_chunking and chunk > 0:
                    batch.append((req, chunk))
                else:
                    self.release(rep, req)
                    req.computed = 0
                    why = tgi.NO_BUDGET
                break
            prefill += postfix
            batch.append((req, postfix))
            if len(batch) == max_size:
                break
        if not batch:
            return [], why
        if min_size is not None and len(batch) < min_size:
            for req, _ in batch:
                self.release(rep, req)
                req.computed = 0
            return [], tgi.SMALL
        for req, _ in batch:
            assert self.start(rep) is req
            if self.caching:
                self.count_lookup(rep, req, len(req.settled))  # its hits, before it computes
            rep.running.append(req)
        return batch, tgi.GOT

    def tgi_running(self, rep: Replica) -> tuple[Scheduled, int]:
        """Every decode, then chunks of unfinished prompts within the prefill budget."""
        p: tgi.Params = self.p
        work: Scheduled = [(r, 1) for r in rep.running if not r.in_prefill]
        left = p.max_batch_prefill_tokens - len(work)
        tokens = len(work)
        for req in rep.running:
            if req.in_prefill:
                chunk = min(req.num_tokens - req.computed, left)
                if chunk > 0:
                    work.append((req, chunk))
                    left -= chunk
                    tokens += chunk
        return work, tokens

    def schedule_tgi(self, rep: Replica) -> tuple[Scheduled, int, int]:
        p: tgi.Params = self.p
        max_batch = p.max_batch_size or None
        if not rep.running:
            batch, _ = self.tgi_next_batch(rep, None, max_batch, p.max_batch_prefill_tokens)
            rep.phase = tgi.TRY_ADD
            rep.wait_tokens = 1
            return batch, 0, len(batch)
        if rep.phase == tgi.TRY_ADD:
            if p.prefill_chunking:
                work, current = self.tgi_running(rep)
                new, why = self.tgi_next_batch(
                    rep, None, None, p.max_batch_prefill_tokens - current
                )
                step = work + new
            else:
                min_size: int | None = None
                if rep.wait_tokens < p.max_waiting_tokens:
                    ratio = np.float32(len(rep.running)) * np.float32(p.waiting_served_ratio)
                    min_size = int(math.floor(ratio))
                max_size = None if max_batch is None else max_batch - len(rep.running)
                new, why = self.tgi_next_batch(rep, min_size, max_size, p.max_batch_prefill_tokens)
                step = new
            if new:
                if not p.prefill_chunking:
                    rep.wait_tokens = 1
                rep.phase = tgi.DECODE
                return step, 0, len(new)
        else:
            rep.phase = tgi.TRY_ADD
        work, _ = self.tgi_running(rep)
        rep.wait_tokens += 1
        return work, 0, 0

    # set by the loop from the scenario
    max_running: int = 0
    ratio_min: float = 0.0
    ratio_decay: float = 0.0
