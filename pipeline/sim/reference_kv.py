"""The reference loop's requests, replicas, KV blocks and prefix cache, in plain Python.

Same model as ``kv.py`` and ``cache.py`` (see their docstrings), written
plainly: a unit is cached under its key with a reference count and a size in
blocks, and a key may have several cached copies (vLLM), oldest first, of
which a lookup gets the oldest; units nobody references sit in an
``OrderedDict``, oldest first, and count as free capacity; an allocation
takes free blocks first, then evicts from the front, one copy at a time. A
request holds blocks privately and through the cache units it references;
releasing it frees the former and unreferences the latter, deepest unit
first.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import accumulate

from pipeline.sim.kv_tiers import LoopTier
from pipeline.sim.scenario import Scenario


@dataclass(eq=False)
class Unit:
    """One cached unit."""

    key: int
    blocks: int
    ref: int = 0


class PrefixCache:
    """One replica's KV blocks and prefix cache."""

    def __init__(self, num_blocks: int) -> None:
        self.free = num_blocks  # blocks holding nothing
        self.units: dict[int, list[Unit]] = {}  # key -> its cached copies, oldest first
        self.lru: OrderedDict[Unit, None] = OrderedDict()  # unreferenced units, oldest first
        self.evictable = 0  # blocks in lru
        self.evicted = 0  # blocks evicted so far

    @property
    def capacity(self) -> int:
        return self.free + self.evictable

    def lookup(self, keys: list[int], max_units: int) -> tuple[list[Unit], int]:
        """The cached leading units of ``keys`` (at most ``max_units``), and their idle blocks."""
        hits: list[Unit] = []
        for key in keys[: max(max_units, 0)]:
            copies = self.units.get(key)
            if not copies:
                break
            hits.append(copies[0])  # vLLM's get_one_block: the oldest copy
        return hits, sum(u.blocks for u in hits if u.ref == 0)

    def get(self, key: int) -> Unit | None:
        """The unit a lookup of ``key`` gets: its oldest cached copy."""
        copies = self.units.get(key)
        return copies[0] if copies else None

    def ref(self, unit: Unit) -> None:
        if unit.ref == 0:
            del self.lru[unit]
            self.evictable -= unit.blocks
        unit.ref += 1

    def unref(self, unit: Unit) -> None:
        unit.ref -= 1
        if unit.ref == 0:
            self.lru[unit] = None
            self.evictable += unit.blocks

    def make_free(self, need: int) -> bool:
        """Evict least recently released units until ``need`` blocks are free."""
        while self.free < need and self.lru:
            unit, _ = self.lru.popitem(last=False)
            copies = self.units[unit.key]
            copies.remove(unit)  # the other copies of its key stay cached
            if not copies:
                del self.units[unit.key]
            self.evictable -= unit.blocks
            self.free += unit.blocks
            self.evicted += unit.blocks
        return self.free >= need

    def take(self, need: int) -> None:
        assert need <= self.capacity
        self.make_free(need)
        self.free -= need

    def insert(self, key: int, blocks: int) -> Unit:
        """Cache a new unit, referenced once (its blocks come from the caller's): the
        key's only copy, or its newest when it is cached already (vLLM)."""
        unit = Unit(key, blocks, 1)
        self.units.setdefault(key, []).append(unit)
        return unit

    def warm(self, keys: list[int], blocks: list[int]) -> None:
        """Serve one warm-up prompt (its units' keys and blocks): use its cached units,
        cache the rest, release them."""
        held: list[Unit] = []
        for key, size in zip(keys, blocks, strict=True):
            unit = self.get(key)
            if unit is not None:
                self.ref(unit)
            else:
                if self.capacity < size:
                    break
                self.take(size)
                unit = self.insert(key, size)
            held.append(unit)
        for unit in reversed(held):
            self.unref(unit)


class Req:
    """One request and everything that happens to it."""

    def __init__(self, index: int, arrival_s: float, prompt: int, output: int) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.prompt = prompt
        self.output = output
        self.priority = 0
        self.replica = -1
        self.computed = 0  # num_computed_tokens
        self.generated = 0  # output tokens sampled
        self.private = 0  # KV blocks held privately
        self.shared = 0  # KV blocks held through referenced cache units
        self.settled: list[Unit] = []  # leading units, as cache entries it references
        self.keys: list[int] = []  # cache-unit keys of its prompt (and, vLLM, its output)
        self.unit_tokens = 0  # tokens per unit (0: never looked up)
        self.unit_blocks = 0
        self.tail = 0  # tokens of its prompt's tail unit (0: none)
        self.ends: list[int] = []  # where each of its units ends, in tokens
        self.sizes: list[int] = []  # ... and its blocks
        self.prefill_end = 0  # num_tokens at its last admission
        self.first_scheduled_s = math.nan
        self.first_token_s = math.nan
        self.finished_s = math.nan
        self.preemptions = 0
        self.chunks = 0
        self.queue_depth = 0
        self.total_computed = 0
        self.discarded = 0  # computed tokens thrown away by preemptions
        self.lookups = 0
        self.cached = 0  # hit tokens at its first lookup
        self.hits = 0  # hit tokens over all lookups
        self.cpu_hits = 0  # ... of which loaded from the CPU tier (KV offloading)
        self.disk_hits = 0  # ... from the disk tier

    def set_units(self, keys: list[int], unit_tokens: int, block_size: int, tail: int) -> None:
        """Its cache units: whole ones of ``unit_tokens``, except its tail (``tail`` > 0)
        after its prompt's whole units, and the rest of the tail's unit after it."""
        self.keys = keys
        self.unit_tokens = unit_tokens
        self.unit_blocks = unit_tokens // block_size
        self.tail = tail
        tokens = [unit_tokens] * len(keys)
        if tail:  # its tail comes right after its prompt's whole units
            whole = self.prompt // unit_tokens
            tokens[whole] = tail
            if whole + 1 < len(tokens):
                tokens[whole + 1] = unit_tokens - tail
        self.ends = list(accumulate(tokens))
        self.sizes = [t // block_size for t in tokens]

    def units_within(self, tokens: int) -> int:
        """How many of its units end within its first ``tokens`` tokens."""
        return sum(1 for e in self.ends if e <= tokens)

    def hit_tokens(self, units: int) -> int:
        return self.ends[units - 1] if units else 0

    def hit_blocks(self, units: int) -> int:
        return sum(self.sizes[:units])

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prefill_end


class Replica:
    def __init__(self, index: int, num_blocks: int, by_priority: bool) -> None:
        self.index = index
        self.clock = 0.0
        self.running: list[Req] = []
        self.fifo: deque[Req] = deque()
        self.heap: list[tuple[int, float, int, Req]] = []  # vLLM's priority queue
        self.by_priority = by_priority
        self.assigned: list[Req] = []
        self.cache = PrefixCache(num_blocks)
        self.steps = 0
        self.rows: list[tuple[list[int], list[float]]] = []
        # vllm async scheduling: the engine core's input queue and the step in flight
        self.inbox: list[Req] = []  # routed here, not yet handed to the scheduler
        self.last_start = 0.0  # start of the latest step
        self.last_end = 0.0  # its end
        self.pipelined = False  # a step is being decided while the previous one runs
        self.queued = 0  # waiting requests when the scheduler was called
        self.step_query = 0  # first-lookup tokens of the step being decided
        self.step_hit = 0
        # KV offloading tiers (kv_tiers.py): [CPU, disk] (None: off), and the step's loads
        self.tiers: list[LoopTier] | None = None
        self.step_tier = [0, 0, 0, 0]  # tokens from CPU, from disk; blocks from CPU, disk
        # sglang
        self.chunked: Req | None = None
        self.full = False
        self.pending = 0
        self.ratio = 0.0
        self.rng = 0
        # tgi
        self.phase = 0
        self.wait_tokens = 0
        # transformers
        self.block_new = False  # block_new_requests
        self.finished_seen = 0  # requests seen finished (a new one lifts block_new)

    # --- the waiting queue: a deque (FCFS) or a heap on (priority, arrival, index) ---
    @property
    def num_waiting(self) -> int:
        return len(self.heap) if self.by_priority else len(self.fifo)

    def head(self) -> Req:
        return self.heap[0][3] if self.by_priority else self.fifo[0]

    def pop(self) -> Req:
        return heapq.heappop(self.heap)[3] if self.by_priority else self.fifo.popleft()

    def push(self, req: Req, *, front: bool = False) -> None:
        if self.by_priority:
            heapq.heappush(self.heap, (req.priority, req.arrival_s, req.index, req))
        elif front:
            self.fifo.appendleft(req)
        else:
            self.fifo.append(req)


Scheduled = list[tuple[Req, int]]


class ReferenceKV:
    """KV blocks and prefix-cache operations on requests, shared by the reference policies."""

    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.p = scenario.params
        self.bs = scenario.memory.block_size
        self.caching = scenario.prefix_caching

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def need(self, req: Req, tokens: int) -> int:
        """Blocks ``req`` must add to cover ``tokens`` tokens."""
        return max(0, self.blocks_for(tokens) - req.private - req.shared)

    def grow(self, rep: Replica, req: Req, tokens: int, keep_free: int = 0) -> bool:
        need = self.need(req, tokens)
        if need == 0:
            return True
        if need + keep_free > rep.cache.capacity:
            return False
        rep.cache.take(need)
        req.private += need
        return True

    def release(self, rep: Replica, req: Req) -> None:
        rep.cache.free += req.private
        req.private = 0
        for unit in reversed(req.settled):
            rep.cache.unref(unit)
        req.settled = []
        req.shared = 0

    def lookup(self, rep: Replica, req: Req) -> tuple[list[Unit], int]:
        """Cached leading units (at most num_tokens - 1 tokens) of a request computing from 0."""
        if not self.caching or req.unit_tokens == 0:
            return [], 0
        return rep.cache.lookup(req.keys, req.units_within(req.num_tokens - 1))

    def use_hits(self, rep: Replica, req: Req, hits: list[Unit]) -> None:
        for unit in hits:
            rep.cache.ref(unit)
        req.settled = list(hits)
        req.shared = req.hit_blocks(len(hits))

    def count_lookup(self, rep: Replica, req: Req, num_hits: int) -> None:
        if req.unit_tokens == 0:
            return
        hit = req.hit_tokens(num_hits)
        if req.lookups == 0:
            req.cached = hit
            rep.step_query += req.num_tokens
            rep.step_hit += hit
        req.lookups += 1
        req.hits += hit

    def commit(self, rep: Replica, req: Req, tokens: int, dedupe: bool) -> None:
        """Cache the units within ``req``'s first ``tokens`` tokens (see ``cache.commit``)."""
        if req.unit_tokens == 0:
            return
        for k in range(len(req.settled), req.units_within(tokens)):
            m = req.sizes[k]
            unit = rep.cache.get(req.keys[k])
            if unit is not None and dedupe:  # share it, free the request's copy
                rep.cache.ref(unit)
                req.settled.append(unit)
                rep.cache.free += m
            else:  # new, or (vLLM) a newer copy of a cached key
                req.settled.append(rep.cache.insert(req.keys[k], m))
            req.private -= m
            req.shared += m
            if rep.tiers is not None:  # the offloading connector stores it as computed
                cpu, disk = rep.tiers
                for key, blocks in cpu.put(req.keys[k], m):
                    if disk.cap:
                        disk.put(key, blocks)

    def tier_lookup(self, rep: Replica, req: Req, gpu_units: int) -> tuple[int, int]:
        """(units the CPU tier holds after the GPU hits, then units the disk tier holds)."""
        if rep.tiers is None or req.unit_tokens == 0:
            return 0, 0
        cpu, disk = rep.tiers
        n = req.units_within(req.num_tokens - 1)
        c = cpu.run(req.keys[gpu_units:n])
        d = disk.run(req.keys[gpu_units + c : n]) if disk.cap else 0
        return c, d

    def tier_load(self, rep: Replica, req: Req, h: int, c: int, d: int) -> None:
        """Load the units found: the most recently used of their tier; the step's counts."""
        assert rep.tiers is not None
        cpu, disk = rep.tiers
        cpu.touch(req.keys[h : h + c])
        disk.touch(req.keys[h + c : h + c + d])
        st = rep.step_tier
        cpu_tokens = req.hit_tokens(h + c) - req.hit_tokens(h)
        disk_tokens = req.hit_tokens(h + c + d) - req.hit_tokens(h + c)
        st[0] += cpu_tokens
        st[1] += disk_tokens
        req.cpu_hits += cpu_tokens
        req.disk_hits += disk_tokens
        st[2] += req.hit_blocks(h + c) - req.hit_blocks(h)
        st[3] += req.hit_blocks(h + c + d) - req.hit_blocks(h + c)

    def drop(self, rep: Replica, req: Req) -> None:
        """Recompute preemption: drop its KV and forget its progress."""
        self.release(rep, req)
        req.discarded += req.computed
        req.computed = 0
        req.preemptions += 1

    def preempt(self, rep: Replica, req: Req) -> None:
        self.drop(rep, req)
        rep.push(req, front=True)

    def start(self, rep: Replica) -> Req:
        req = rep.pop()
        req.prefill_end = req.num_tokens
        return req
