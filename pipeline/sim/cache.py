"""The prefix cache of each replica, compiled: a hash map of cache units and an LRU queue.

A **cache unit** is a run of ``unit_tokens`` prompt tokens that starts at a
multiple of ``unit_tokens``; ``unit_blocks = unit_tokens / block_size`` KV
blocks hold it. Its key is the chained prefix hash of the trace at the unit's
last block (see ``prefix.py``): two requests have the same key at unit k
exactly when their first ``(k + 1) * unit_tokens`` tokens are equal. When the
trace's hash blocks are the engine's KV blocks, a unit is one block (vLLM's
own model); when the trace's blocks are coarser, a unit is one trace block,
and what is left of a prompt after its whole units can make a shorter
**tail** unit (``unit_end`` below gives where each unit ends).

State per replica r (``kc``, a ``PrefixCaches`` record of ``ck, cs, ht, ukey, uslot,
gk, gb, gn``):

- slots: ``ck[r, s]`` the key of cached unit s, ``cs[r, s, CS_REF]`` how many
  running requests reference it, ``cs[r, s, CS_BLK]`` its blocks, and
  ``CS_PREV`` / ``CS_NEXT`` links: the LRU queue of unreferenced units
  (``rp[r, P_LRU_HEAD]`` is evicted first), or the free-slot list (there a
  link is relative: slot s's next free slot is ``s + 1 + cs[r, s, CS_NEXT]``,
  so a never-used slot, all zeros, links to the next one and the arrays are
  touched only as slots are used); ``CS_DNEXT`` / ``CS_DPREV`` link the
  copies of one key (below);
- ``ht[r, j] = (key, slot + 1)`` (slot + 1 = 0: an empty entry): open
  addressing with linear probing, deletion by backward shift, so no
  tombstones. Each entry carries its key, so a probe reads one cache line and
  never the slot's (the table is touched at random: every eviction and every
  new unit probes it). The slot is the key's oldest cached copy;
- per request: ``ukey[hoff:hoff + nunits]`` its unit keys and ``uslot`` the
  slot each settled unit references (-1: held privately);
- over all replicas, ``(gk, gb, gn)``: which replicas cache each key
  (``prefix_index.py``; kept only for the ``prefix_aware`` router).

**Copies** (vLLM, ``dedupe`` off). vLLM does not de-duplicate: a full block
that a request computes while an identical one is cached already (two
requests computing the same prompt blocks in the same steps, or a resumed
request recomputing a block it had cached before) is cached too, under the
same hash (``BlockHashToBlockMap`` keeps every block id of a hash), so that
block tables stay append-only. Here such a unit becomes a second cached
**copy** of its key, referenced by the request that computed it: it is cached
from the moment it is committed, it joins the LRU queue like any unit once
nobody references it (so it is free capacity then, in its place in the
eviction order), eviction takes whichever copy reaches the LRU head and
leaves the others cached, and a lookup gets the oldest copy still cached
(``get_one_block``: the first block id of the hash's dict, in insertion
order), referenced or not. The copies of a key are a list, oldest first:
``CS_DNEXT`` the next newer copy (-1: none), ``CS_DPREV`` the next older one,
and for the oldest (the table's) the newest (itself when alone). SGLang and
TGI (``dedupe`` on) share the cached unit instead and free the request's
blocks.

Free capacity is ``rp[r, P_FREE]`` (blocks holding nothing) plus
``rp[r, P_EVICTABLE]`` (blocks of cached units nobody references, vLLM's
"free blocks with a hash"): an allocation takes free blocks first and evicts
from the head of the LRU queue only when they run out (vLLM since PR #42656
keeps hashed blocks at the back of its free queue; SGLang and TGI evict cached
leaves only when the free pool is short). A request releases its units tail
first, so the deeper units of a prefix are evicted before the shallower ones.

Speed: a replay with a cache smaller than its traffic evicts and inserts about
one unit per prompt unit (Mooncake: ~240k of each for 12k requests), so the
per-unit loops (``_evict``, ``_put``, ``lookup``, ``_unref``) are written out
with no call of a helper that takes arrays inside them: each such call costs
argument copies and numba reference counts per unit. Measured with
``bench/prefix_cache.py``.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.sim.kv_tiers import (
    count_load,
    tier_init,
    tier_run,
    tier_store,
    tier_touch,
    tier_words,
)
from pipeline.sim.prefetch import prefetch
from pipeline.sim.prefix_index import index_add, index_remove, new_index
from pipeline.sim.state import (
    NEVER,
    P_EVICTABLE,
    P_EVICTED,
    P_FREE,
    P_LRU_HEAD,
    P_LRU_TAIL,
    P_NCACHED,
    P_SLOT_FREE,
    P_TIER_CAP,
    R_COMPUTED,
    R_GENERATED,
    R_HELD,
    R_NEXT,
    R_NUNITS,
    R_PROMPT,
    R_SETTLED,
    R_SHARED,
    R_TAIL,
    R_UNIT_BLK,
    R_UNIT_TOK,
    W_CPU_HITS,
    W_DISK_HITS,
    W_HOFF,
    PrefixKeys,
    wide,
)

CS_REF = 0
CS_BLK = 1
CS_PREV = 2
CS_NEXT = 3
CS_DNEXT = 4
CS_DPREV = 5
NCS = 6

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
assert sys.byteorder == "little"  # _keys_at
# slot + 1 of an empty table entry; the table is uint64 (keys), and numba compares an
# uint64 with an int64 as two floats: compare its slots with uint64s only
_EMPTY = np.uint64(0)


class PrefixCaches(NamedTuple):
    """The prefix caches of all replicas and the requests' unit keys (the module doc), ``kc``."""

    ck: npt.NDArray[np.uint64]  # [replica, slot] the key of cached unit s
    cs: npt.NDArray[np.int64]  # [replica, slot, CS_*] its references, blocks and links
    ht: npt.NDArray[np.uint64]  # [replica, entry, (key, slot + 1)] the hash table
    ukey: npt.NDArray[np.uint64]  # every request's unit keys (from wide(rq)[i, W_HOFF])
    # ... the slot each settled unit references (-1: private); after them (from
    # len(ukey) on) the KV offloading tiers' entries, when they are on (kv_tiers.py)
    uslot: npt.NDArray[np.int64]
    gk: npt.NDArray[np.uint64]  # which replicas cache each key (prefix_index.py): keys,
    gb: npt.NDArray[np.uint64]  # ... their replica bitsets,
    gn: npt.NDArray[np.int64]  # ... and how many replicas hold them (0: an empty entry)


def cache_sizes(
    num_blocks: int,
    keys: list[PrefixKeys],
    block_size: int,
    *,
    copies: bool,
    blocks_needed: int,
) -> tuple[int, int]:
    """(slots, distinct keys) one replica's cache can hold at once, for ``empty_caches``.

    Every cached unit holds blocks of its own, so at most ``num_blocks //
    smallest unit`` are cached at once; distinct keys are fewer than the
    requests and warm-up prompts have (``keys``), and than the whole units
    the blocks hold plus the tail units (a tail and the rest of its unit, see
    ``unit_end``). Without ``copies`` a key is cached once, so that bounds the
    units too. With them (vLLM) a request caches a unit again only when it
    recomputes it after a preemption; with ``blocks_needed`` (every request's
    whole KV, plus the warm-up's units) or fewer blocks nothing is preempted
    or evicted, so every unit is cached at most once then as well. Slots cost
    memory only as they are used.
    """
    total = 0
    whole = 0  # blocks of the smallest whole unit
    smallest = 0  # ... of the smallest unit, tails included
    small = 0  # tail units and the rests of their units
    for pk in keys:
        units = np.diff(pk.offsets)
        used = units > 0
        total += int(units.sum())
        if not used.any():
            continue
        m = pk.unit_tokens[used] // block_size
        whole = int(m.min()) if whole == 0 else min(whole, int(m.min()))
        smallest = whole if smallest == 0 else min(smallest, whole)
        tails = used & (pk.tails > 0)
        if tails.any():
            t = pk.tails[tails] // block_size
            rest = pk.unit_tokens[tails] // block_size - t
            smallest = min(smallest, int(t.min()), int(rest.min()))
            small += 2 * int(tails.sum())
    if total == 0:
        return 0, 0
    room = num_blocks // max(smallest, 1)
    distinct = min(total, room, num_blocks // max(whole, 1) + small)
    if not copies:
        return distinct, distinct
    if num_blocks >= blocks_needed:
        return min(total, room), distinct
    return room, distinct


def empty_caches(
    num_replicas: int,
    num_slots: int,
    keys: npt.NDArray[np.uint64],
    *,
    index: int = 0,
    num_keys: int = 0,
    tier_slots: int = 0,
) -> PrefixCaches:
    """``kc`` for ``num_replicas`` empty caches of ``num_slots`` units (copies) each.

    ``num_keys``: most distinct keys one replica caches at once, which sizes
    its hash table (0: ``num_slots``). ``index``: most distinct keys cached at
    once over all replicas, for the index of which replicas hold each key (0:
    no index). ``tier_slots``: entries of each KV offloading tier per replica
    (``kv_tiers.tier_slots``; 0: none), kept in ``uslot`` after the units' slots.
    The caller sets the replica fields (``P_SLOT_FREE`` 0: every slot free, see
    the module docstring; ``P_TIER_CAP``).
    """
    s = max(num_slots, 1)
    e = max(min(num_keys, s) if num_keys > 0 else s, 1)
    size = 1 << max(4, (2 * e - 1).bit_length())  # load <= 1/2
    ck = np.zeros((num_replicas, s), dtype=np.uint64)
    cs = np.zeros((num_replicas, s, NCS), dtype=np.int64)  # zeros: a free-slot list (above)
    ht = np.zeros((num_replicas, size, 2), dtype=np.uint64)
    uslot = np.full(len(keys) + tier_words(num_replicas, tier_slots), -1, dtype=np.int64)
    uslot[len(keys) :] = 0  # the tiers' entries: all empty
    tier_init(uslot, len(keys), tier_slots)
    # writable: numba compiles a loop of its own for read-only arrays (Ray's object store)
    gk, gb, gn = new_index(num_replicas, index)
    return PrefixCaches(ck, cs, ht, np.require(keys, np.uint64, ["C", "W"]), uslot, gk, gb, gn)


@njit(cache=True, error_model="numpy", inline="always")
def _keys_at(rq: npt.NDArray[np.int32], i: int) -> int:
    """``wide(rq)[i, W_HOFF]``, read from its two int32 halves (little-endian).

    ``wide`` makes a view of another dtype, a call that checks the layout each
    time; every commit, lookup and release needs this one number.
    """
    lo = np.int64(rq[i, 2 * W_HOFF]) & 0xFFFFFFFF
    return int((np.int64(rq[i, 2 * W_HOFF + 1]) << 32) | lo)


# --- where a request's units end (prefix.py): every unit is R_UNIT_TOK tokens, except, when
# the request has a tail (R_TAIL > 0), unit kp = prompt // R_UNIT_TOK, its tail, of R_TAIL
# tokens, and (vLLM's generated units) unit kp + 1, the rest up to the next multiple of
# R_UNIT_TOK; later units are whole again. Unit k is at or past the tail exactly when
# (k + 1) * R_UNIT_TOK > prompt.


@njit(cache=True, error_model="numpy", inline="always")
def unit_end(rq: npt.NDArray[np.int32], i: int, k: int) -> int:
    """Tokens up to the end of request i's unit k."""
    u = rq[i, R_UNIT_TOK]
    e = (k + 1) * u
    t = rq[i, R_TAIL]
    if t != 0 and e > rq[i, R_PROMPT]:  # the tail (k * u <= prompt) or a unit after it
        e = k * u + (t if k * u <= rq[i, R_PROMPT] else 0)
    return e


@njit(cache=True, error_model="numpy", inline="always")
def hit_tokens(rq: npt.NDArray[np.int32], i: int, h: int) -> int:
    """Tokens of request i's first ``h`` units."""
    return 0 if h == 0 else unit_end(rq, i, h - 1)


@njit(cache=True, error_model="numpy", inline="always")
def hit_blocks(rq: npt.NDArray[np.int32], i: int, h: int) -> int:
    """KV blocks of request i's first ``h`` units."""
    u = rq[i, R_UNIT_TOK]
    m = rq[i, R_UNIT_BLK]
    t = rq[i, R_TAIL]
    if t == 0 or h * u <= rq[i, R_PROMPT]:  # none of them is the tail
        return h * m
    if (h - 1) * u <= rq[i, R_PROMPT]:  # the last of them is the tail
        return (h - 1) * m + t * m // u
    return (h - 1) * m  # the tail and the rest of its unit make one whole unit


@njit(cache=True, error_model="numpy", inline="always")
def _next_settles(rq: npt.NDArray[np.int32], i: int) -> None:
    """``R_NEXT`` after ``R_SETTLED`` changed: where the next unit to settle ends."""
    k = rq[i, R_SETTLED]
    rq[i, R_NEXT] = unit_end(rq, i, k) if k < rq[i, R_NUNITS] else NEVER


@njit(cache=True, error_model="numpy", inline="always")
def units_within(rq: npt.NDArray[np.int32], i: int, num_tokens: int) -> int:
    """How many of request i's units end within its first ``num_tokens`` tokens
    (its units as if they went on for ever: callers cap it at R_NUNITS)."""
    u = rq[i, R_UNIT_TOK]
    q = num_tokens // u
    t = rq[i, R_TAIL]
    if t != 0 and num_tokens >= rq[i, R_PROMPT] - rq[i, R_PROMPT] % u + t:
        q += 1  # the tail counts as one more
    return q


@njit(cache=True, error_model="numpy", inline="always")
def _home(key: np.uint64, mask: int) -> int:
    return np.int64(((key * _GOLDEN) >> np.uint64(29)) & np.uint64(mask))  # type: ignore[return-value]


@njit(cache=True, error_model="numpy", inline="always")
def _probe(ht: npt.NDArray[np.uint64], r: int, key: np.uint64) -> int:
    """Entry of ``key`` in replica r's table, or the empty entry where it would go."""
    mask = ht.shape[1] - 1
    j = _home(key, mask)
    while ht[r, j, 1] != _EMPTY and ht[r, j, 0] != key:
        j = (j + 1) & mask
    return j


@njit(cache=True, error_model="numpy", inline="always")
def find(ht: npt.NDArray[np.uint64], r: int, key: np.uint64) -> int:
    """Slot of the cached unit with this key on replica r, or -1."""
    return int(ht[r, _probe(ht, r, key), 1]) - 1


@njit(cache=True, error_model="numpy")
def _lru_remove(cs: npt.NDArray[np.int64], rp: npt.NDArray[np.int64], r: int, s: int) -> None:
    prev = cs[r, s, CS_PREV]
    nxt = cs[r, s, CS_NEXT]
    if prev >= 0:
        cs[r, prev, CS_NEXT] = nxt
    else:
        rp[r, P_LRU_HEAD] = nxt
    if nxt >= 0:
        cs[r, nxt, CS_PREV] = prev
    else:
        rp[r, P_LRU_TAIL] = prev
    rp[r, P_EVICTABLE] -= cs[r, s, CS_BLK]


@njit(cache=True, error_model="numpy")
def _evict(kc: PrefixCaches, rp: npt.NDArray[np.int64], r: int, need: int) -> None:
    """Evict units from the LRU head until ``need`` blocks are free or none is left.

    One call per allocation that evicts, its loop written out: helpers that
    take arrays cost reference counts and argument copies per unit, and the
    big caches evict about one unit per request block (``bench/prefix_cache.py``).
    Each unit leaves the LRU queue (it is its head) and its key's list of
    copies; the key's table entry then names the next copy, or is deleted by
    backward shift when none is left; the slot goes to the free-slot list.
    """
    ck, cs, ht, gk, gb, gn = kc.ck, kc.cs, kc.ht, kc.gk, kc.gb, kc.gn
    mask = ht.shape[1] - 1
    row = r * ht.shape[1]  # replica r's first table entry, over all replicas
    srow = r * cs.shape[1]  # ... first slot
    indexed = gk.shape[0] != 0
    free = rp[r, P_FREE]
    freed = 0
    s = rp[r, P_LRU_HEAD]
    slot_free = rp[r, P_SLOT_FREE]
    n = 0
    while free < need and s >= 0:
        key = ck[r, s]
        b = cs[r, s, CS_BLK]
        nxt = cs[r, s, CS_NEXT]
        free += b
        freed += b
        if free < need and nxt >= 0:  # it goes next: fetch its table entry, and the slot after it
            prefetch(ht, (row + _home(ck[r, nxt], mask)) * 2)
            after = cs[r, nxt, CS_NEXT]
            if after >= 0:
                prefetch(ck, srow + after)
                prefetch(cs, (srow + after) * NCS)
        i = _home(key, mask)  # the key's table entry (no empty entry lies before it)
        while ht[r, i, 1] == _EMPTY or ht[r, i, 0] != key:
            i = (i + 1) & mask
        oldest = int(ht[r, i, 1]) - 1
        newer = cs[r, s, CS_DNEXT]
        if oldest != s:  # a newer copy leaves: unlink it, the key stays cached
            older = cs[r, s, CS_DPREV]
            cs[r, older, CS_DNEXT] = newer
            if newer >= 0:
                cs[r, newer, CS_DPREV] = older
            else:
                cs[r, oldest, CS_DPREV] = older
        elif newer >= 0:  # the oldest copy leaves: the next one is what a lookup gets
            cs[r, newer, CS_DPREV] = cs[r, s, CS_DPREV]
            ht[r, i, 1] = newer + 1
        else:  # the only copy: delete the entry, shifting later entries of its run back
            j = i
            while True:
                j = (j + 1) & mask
                if ht[r, j, 1] == _EMPTY:
                    break
                k = _home(ht[r, j, 0], mask)
                # leave entry j where it is if its home lies cyclically in (i, j]
                if (i < j and i < k <= j) or (i > j and (k > i or k <= j)):
                    continue
                ht[r, i, 0] = ht[r, j, 0]
                ht[r, i, 1] = ht[r, j, 1]
                i = j
            ht[r, i, 1] = 0
            if indexed:
                index_remove(gk, gb, gn, r, key)
        cs[r, s, CS_NEXT] = slot_free - s - 1  # relative link (module docstring)
        slot_free = s
        n += 1
        s = nxt
    rp[r, P_LRU_HEAD] = s
    if s >= 0:
        cs[r, s, CS_PREV] = -1
    else:
        rp[r, P_LRU_TAIL] = -1
    rp[r, P_SLOT_FREE] = slot_free
    rp[r, P_NCACHED] -= n
    rp[r, P_FREE] = free
    rp[r, P_EVICTABLE] -= freed
    rp[r, P_EVICTED] += freed


@njit(cache=True, error_model="numpy")
def flush(kc: PrefixCaches, rp: npt.NDArray[np.int64], r: int) -> None:
    """Evict every unreferenced unit of replica r: a replica the autoscaler starts
    (again) comes up with an empty cache, as a new engine does (autoscale.py)."""
    if rp[r, P_LRU_HEAD] >= 0:
        _evict(kc, rp, r, rp[r, P_FREE] + rp[r, P_EVICTABLE] + 1)


@njit(cache=True, error_model="numpy", inline="always")
def capacity(rp: npt.NDArray[np.int64], r: int) -> int:
    """Blocks an allocation can get: free ones plus unreferenced cached ones."""
    return int(rp[r, P_FREE] + rp[r, P_EVICTABLE])


@njit(cache=True, error_model="numpy", inline="always")
def make_free(rp: npt.NDArray[np.int64], r: int, need: int, kc: PrefixCaches) -> bool:
    """Evict from the LRU head until ``need`` blocks are free (or nothing is left)."""
    if rp[r, P_FREE] < need and rp[r, P_LRU_HEAD] >= 0:
        _evict(kc, rp, r, need)
    return bool(rp[r, P_FREE] >= need)


@njit(cache=True, error_model="numpy", inline="always")
def take(rp: npt.NDArray[np.int64], r: int, need: int, kc: PrefixCaches) -> None:
    """Allocate ``need`` blocks (the caller checked ``capacity``), evicting as needed."""
    make_free(rp, r, need, kc)
    rp[r, P_FREE] -= need


@njit(cache=True, error_model="numpy")
def lookup(
    rq: npt.NDArray[np.int32],
    i: int,
    r: int,
    max_units: int,
    kc: PrefixCaches,
) -> tuple[int, int]:
    """(leading units of request i cached on replica r, blocks of those nobody references).

    Walks the units left to right and stops at the first miss: the keys are
    chained, so nothing after a miss can be a hit. Changes nothing.
    """
    cs, ht, ukey, uslot = kc.cs, kc.ht, kc.ukey, kc.uslot
    mask = ht.shape[1] - 1
    row = r * ht.shape[1]  # replica r's first table entry, over all replicas
    base = _keys_at(rq, i)
    n = min(max_units, rq[i, R_NUNITS])
    h = 0
    idle = 0
    while h < n:
        key = ukey[base + h]
        if h + 1 < n:  # fetch the next key's table entry meanwhile
            prefetch(ht, (row + _home(ukey[base + h + 1], mask)) * 2)
        j = _home(key, mask)
        while ht[r, j, 1] != _EMPTY and ht[r, j, 0] != key:
            j = (j + 1) & mask
        if ht[r, j, 1] == _EMPTY:
            break
        s = int(ht[r, j, 1]) - 1
        if h >= rq[i, R_SETTLED]:
            uslot[base + h] = s  # scratch until settled: use_hits reads it
        if cs[r, s, CS_REF] == 0:
            idle += cs[r, s, CS_BLK]
        h += 1
    return h, idle


@njit(cache=True, error_model="numpy")
def _ref(cs: npt.NDArray[np.int64], rp: npt.NDArray[np.int64], r: int, s: int) -> None:
    if cs[r, s, CS_REF] == 0:
        _lru_remove(cs, rp, r, s)
    cs[r, s, CS_REF] += 1


@njit(cache=True, error_model="numpy")
def use_hits(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    i: int,
    r: int,
    h: int,
    kc: PrefixCaches,
) -> None:
    """Request i (holding nothing) references its first ``h`` units, just found by ``lookup``."""
    cs, uslot = kc.cs, kc.uslot
    base = _keys_at(rq, i)
    for k in range(h):
        _ref(cs, rp, r, uslot[base + k])
    rq[i, R_SETTLED] = h
    rq[i, R_SHARED] = hit_blocks(rq, i, h)
    _next_settles(rq, i)


@njit(cache=True, error_model="numpy", inline="always")
def settles(rq: npt.NDArray[np.int32], i: int, num_tokens: int) -> bool:
    """Whether ``commit`` up to ``num_tokens`` tokens would settle a new unit of request i.

    Callers that commit every scheduled request every step test this first:
    it is inlined, ``commit`` is a call, and most steps complete no unit. One
    load and a compare: where the next unit ends is kept in ``R_NEXT`` (the
    decode loop tests every decode, and a longer test costs it registers).
    """
    return bool(rq[i, R_NEXT] <= num_tokens)


@njit(cache=True, error_model="numpy", inline="always")
def _put(
    kc: PrefixCaches,
    rp: npt.NDArray[np.int64],
    r: int,
    at: int,
    n: int,
    blocks: int,
    dedupe: bool,
    tail_at: int,
    tail_blocks: int,
) -> int:
    """Cache the units of keys ``ukey[at:at + n]``, of ``blocks`` blocks each, except
    the one of key ``ukey[tail_at]``, a tail of ``tail_blocks``, and the next one,
    the rest of the tail's unit (``unit_end``).

    ``uslot[at + k]`` gets the slot unit k now uses. A key not cached gets a
    new unit, referenced once. A cached one is referenced if ``dedupe``, and
    the request's blocks of it go back to the free pool; otherwise (vLLM) the
    unit is cached as a newer copy of the key, referenced once (module
    docstring). Returns the blocks of the units now shared (all of them).

    Inlined, its loop written out (probe, insert): calls and helpers that
    take arrays cost reference counts and argument copies (see ``_evict``).
    """
    ck, cs, ht, ukey, uslot, gk, gb, gn = kc
    indexed = gk.shape[0] != 0
    mask = ht.shape[1] - 1
    row = r * ht.shape[1]  # replica r's first table entry, over all replicas
    slot_free = rp[r, P_SLOT_FREE]
    inserted = 0
    shared = 0
    for q in range(at, at + n):
        key = ukey[q]
        if q + 1 < at + n:  # fetch the next key's table entry meanwhile
            prefetch(ht, (row + _home(ukey[q + 1], mask)) * 2)
        b = blocks
        if q == tail_at:
            b = tail_blocks
        elif q == tail_at + 1:
            b = blocks - tail_blocks
        shared += b
        j = _home(key, mask)
        while ht[r, j, 1] != _EMPTY and ht[r, j, 0] != key:
            j = (j + 1) & mask
        new = ht[r, j, 1] == _EMPTY
        if not new and dedupe:  # share the cached unit, free the request's copy
            s = int(ht[r, j, 1]) - 1
            _ref(cs, rp, r, s)
            uslot[q] = s
            rp[r, P_FREE] += b
            continue
        s = slot_free  # a new cached unit (or copy) in a free slot
        assert s < ck.shape[1]  # sized for every unit that can be cached at once
        slot_free = s + 1 + cs[r, s, CS_NEXT]
        ck[r, s] = key
        cs[r, s, CS_REF] = 1
        cs[r, s, CS_BLK] = b
        cs[r, s, CS_PREV] = -1
        cs[r, s, CS_NEXT] = -1
        cs[r, s, CS_DNEXT] = -1
        if new:  # the key's only copy, in this empty entry
            cs[r, s, CS_DPREV] = s
            ht[r, j, 0] = key
            ht[r, j, 1] = s + 1
            if indexed:
                index_add(gk, gb, gn, r, key)
        else:  # the newest copy: after the oldest's newest
            oldest = int(ht[r, j, 1]) - 1
            last = cs[r, oldest, CS_DPREV]
            cs[r, last, CS_DNEXT] = s
            cs[r, s, CS_DPREV] = last
            cs[r, oldest, CS_DPREV] = s
        uslot[q] = s
        inserted += 1
    rp[r, P_SLOT_FREE] = slot_free
    rp[r, P_NCACHED] += inserted
    return shared


@njit(cache=True, error_model="numpy")
def commit(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    i: int,
    r: int,
    num_tokens: int,
    dedupe: bool,
    kc: PrefixCaches,
) -> None:
    """Put request i's units within its first ``num_tokens`` tokens into the cache.

    Its private blocks of such a unit become the cache entry. If another copy
    is cached already, ``dedupe`` (SGLang, TGI) makes the request use that one
    and frees its own blocks; without it (vLLM) the request's blocks are
    cached as a newer copy of the key (module docstring).
    """
    u = rq[i, R_UNIT_TOK]
    if u == 0:
        return
    upto = min(units_within(rq, i, num_tokens), rq[i, R_NUNITS])
    k = rq[i, R_SETTLED]
    if k >= upto:
        return
    m = rq[i, R_UNIT_BLK]
    base = _keys_at(rq, i)
    tail_at = -2  # no unit is a tail
    if rq[i, R_TAIL] != 0:
        tail_at = base + rq[i, R_PROMPT] // u
    shared = _put(kc, rp, r, base + k, upto - k, m, dedupe, tail_at, rq[i, R_TAIL] * m // u)
    rq[i, R_HELD] -= shared
    rq[i, R_SHARED] += shared
    rq[i, R_SETTLED] = upto
    _next_settles(rq, i)


# --- KV offloading tiers (kv_tiers.py): their entries are uslot[len(ukey):] ---------------


@njit(cache=True, error_model="numpy")
def tier_commit(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    i: int,
    r: int,
    lo: int,
    kc: PrefixCaches,
) -> None:
    """Store request i's units from lo to those just committed (``R_SETTLED``) to the CPU
    tier: vLLM's offloading connector stores blocks as they are computed."""
    base = _keys_at(rq, i)
    n0 = kc.ukey.shape[0]
    for k in range(lo, rq[i, R_SETTLED]):
        b = hit_blocks(rq, i, k + 1) - hit_blocks(rq, i, k)
        tier_store(kc.uslot, n0, rp, r, np.int64(kc.ukey[base + k]), b)


@njit(cache=True, error_model="numpy")
def tier_commit_run(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    r: int,
    sched_q: npt.NDArray[np.int64],
    n: int,
    steps: int,
    lag: int,
    kc: PrefixCaches,
) -> None:
    """Commit what steps 2..k of a decode run (``steps`` = k - 1) settle, once its blocks
    are taken (as ``loop._finish`` does without tiers), and store those units to the CPU
    tier in the order the steps one at a time would: by step, then by the requests' order
    in it (the tier's LRU order is its stores'). A decode settles at most one unit a step,
    the one ending at the step's commit point (``lag`` tokens short of its computed ones)."""
    settled0 = np.empty(n, dtype=np.int64)  # R_SETTLED before the run's commits
    total = 0
    for j in range(n):
        i = sched_q[j]
        settled0[j] = rq[i, R_SETTLED]
        if settles(rq, i, rq[i, R_COMPUTED] - lag):
            commit(rq, rp, i, r, rq[i, R_COMPUTED] - lag, False, kc)
        total += rq[i, R_SETTLED] - settled0[j]
    if total == 0:
        return
    order = np.empty(total, dtype=np.int64)  # step * n + j: one unit each
    unit = np.empty(total, dtype=np.int64)
    e = 0
    for j in range(n):
        i = sched_q[j]
        first = rq[i, R_COMPUTED] - steps - lag  # step 1's commit point; step 1 + s's is + s
        for k in range(settled0[j], rq[i, R_SETTLED]):
            order[e] = (unit_end(rq, i, k) - first) * n + j
            unit[e] = k
            e += 1
    n0 = kc.ukey.shape[0]
    for q in np.argsort(order):
        i = sched_q[order[q] % n]
        k = unit[q]
        b = hit_blocks(rq, i, k + 1) - hit_blocks(rq, i, k)
        tier_store(kc.uslot, n0, rp, r, np.int64(kc.ukey[_keys_at(rq, i) + k]), b)


@njit(cache=True, error_model="numpy")
def tier_lookup(
    rq: npt.NDArray[np.int32], rp: npt.NDArray[np.int64], i: int, r: int, h: int, kc: PrefixCaches
) -> tuple[int, int]:
    """(units the CPU tier holds after request i's h GPU hits, then units the disk tier
    holds after those), within the lookup's bound (``num_tokens - 1`` tokens). Changes
    nothing."""
    n = min(units_within(rq, i, rq[i, R_PROMPT] + rq[i, R_GENERATED] - 1), rq[i, R_NUNITS])
    base = _keys_at(rq, i)
    n0 = kc.ukey.shape[0]
    nrep = rp.shape[0]
    c = tier_run(kc.uslot, n0, nrep, 0, r, kc.ukey, base + h, base + n)
    d = 0
    if rp[r, P_TIER_CAP + 1] > 0:
        d = tier_run(kc.uslot, n0, nrep, 1, r, kc.ukey, base + h + c, base + n)
    return c, d


@njit(cache=True, error_model="numpy")
def tier_load(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    i: int,
    r: int,
    h: int,
    c: int,
    d: int,
    kc: PrefixCaches,
) -> None:
    """Request i, admitted, loads the c + d units ``tier_lookup`` found: they become the
    most recently used of their tier, and count as loads of the step being decided."""
    base = _keys_at(rq, i)
    n0 = kc.ukey.shape[0]
    tier_touch(kc.uslot, n0, rp, 0, r, kc.ukey, base + h, base + h + c)
    tier_touch(kc.uslot, n0, rp, 1, r, kc.ukey, base + h + c, base + h + c + d)
    g = hit_tokens(rq, i, h)
    gc = hit_tokens(rq, i, h + c)
    bg = hit_blocks(rq, i, h)
    bc = hit_blocks(rq, i, h + c)
    gcd = hit_tokens(rq, i, h + c + d)
    count_load(rp, r, 0, gc - g, bc - bg)
    count_load(rp, r, 1, gcd - gc, hit_blocks(rq, i, h + c + d) - bc)
    rqw = wide(rq)
    rqw[i, W_CPU_HITS] += gc - g
    rqw[i, W_DISK_HITS] += gcd - gc


@njit(cache=True, error_model="numpy", inline="always")
def _unref(
    cs: npt.NDArray[np.int64],
    rp: npt.NDArray[np.int64],
    r: int,
    slots: npt.NDArray[np.int64],
    lo: int,
    hi: int,
) -> None:
    """Drop a reference to the units ``slots[lo:hi]`` (-1: none), the last first; slots -1 after.

    A unit nobody references any more joins the LRU queue's tail. Inlined,
    its loop written out (see ``_evict``).
    """
    tail = rp[r, P_LRU_TAIL]
    added = 0  # blocks of the units that join the LRU queue
    for q in range(hi - 1, lo - 1, -1):
        s = slots[q]
        if s >= 0:
            c = cs[r, s, CS_REF] - 1
            cs[r, s, CS_REF] = c
            if c == 0:
                cs[r, s, CS_PREV] = tail
                cs[r, s, CS_NEXT] = -1
                if tail >= 0:
                    cs[r, tail, CS_NEXT] = s
                else:
                    rp[r, P_LRU_HEAD] = s
                tail = s
                added += cs[r, s, CS_BLK]
            slots[q] = -1
    rp[r, P_LRU_TAIL] = tail
    rp[r, P_EVICTABLE] += added


@njit(cache=True, error_model="numpy", inline="always")
def release_units(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    i: int,
    r: int,
    kc: PrefixCaches,
) -> None:
    """Drop request i's references, deepest unit first (so it is evicted first).

    Inline, so that a request holding no unit (every request without caching) costs
    its caller no call: the call passes every cache array.
    """
    if rq[i, R_SETTLED] > 0:
        _release_units(rq, rp, i, r, kc)


@njit(cache=True, error_model="numpy")
def _release_units(
    rq: npt.NDArray[np.int32],
    rp: npt.NDArray[np.int64],
    i: int,
    r: int,
    kc: PrefixCaches,
) -> None:
    k = rq[i, R_SETTLED]
    base = _keys_at(rq, i)
    _unref(kc.cs, rp, r, kc.uslot, base, base + k)
    rq[i, R_SETTLED] = 0
    rq[i, R_SHARED] = 0
    _next_settles(rq, i)


@njit(cache=True, error_model="numpy")
def warm(
    rp: npt.NDArray[np.int64],
    r: int,
    keys: npt.NDArray[np.uint64],
    unit_blocks: int,
    tail_blocks: int,
    slots: npt.NDArray[np.int64],
    kc: PrefixCaches,
) -> None:
    """Serve one warm-up prompt: reference its cached units, cache the rest, release.

    ``tail_blocks`` > 0: its last unit is a tail of that many blocks. Stops at
    the first unit that finds no room (the cache is smaller than the prompt).
    """
    cs, ht = kc.cs, kc.ht
    mine = PrefixCaches(kc.ck, cs, ht, keys, slots, kc.gk, kc.gb, kc.gn)  # its keys and slots
    n = 0
    last = len(keys) - 1 if tail_blocks > 0 else -2
    for k in range(len(keys)):
        s = find(ht, r, keys[k])
        if s >= 0:
            _ref(cs, rp, r, s)
            slots[k] = s
        else:
            b = tail_blocks if k == last else unit_blocks
            if capacity(rp, r) < b:
                break
            take(rp, r, b, kc)
            _put(mine, rp, r, k, 1, unit_blocks, False, last, tail_blocks)
        n += 1
    _unref(cs, rp, r, slots, 0, n)


@njit(cache=True, error_model="numpy")
def warm_all(
    rp: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    keys: npt.NDArray[np.uint64],
    unit_blocks: npt.NDArray[np.int64],
    tail_blocks: npt.NDArray[np.int64],
    kc: PrefixCaches,
) -> None:
    """Serve every warm-up prompt on every replica, in order, before the replay."""
    slots = np.zeros(max(len(keys), 1), dtype=np.int64)
    for r in range(rp.shape[0]):
        for j in range(len(unit_blocks)):
            if unit_blocks[j] > 0 and offsets[j + 1] > offsets[j]:
                prompt = keys[offsets[j] : offsets[j + 1]]
                warm(rp, r, prompt, unit_blocks[j], tail_blocks[j], slots, kc)
        rp[r, P_EVICTED] = 0
