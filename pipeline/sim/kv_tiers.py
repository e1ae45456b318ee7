"""KV offloading tiers below the GPU prefix cache: a CPU tier and a disk tier.

The model follows vLLM's offloading connector (``--kv-offloading-size``), as
its scheduler side reads in vLLM 0.33 (``vllm/v1/kv_offload/cpu/manager.py``,
``CPUOffloadingManager``, with ``cpu/policies/lru.py``, ``LRUCachePolicy``):

- the CPU tier holds ``num_chunks`` chunks (one per ``offloaded_block_size``
  tokens); a chunk is *pending* from ``prepare_store`` until
  ``complete_store`` (a lookup sees ``HIT_PENDING`` and cannot load it), then
  *ready*; a load pins it (a reference count) until ``complete_load``;
- ``prepare_store(keys)`` stores the keys not cached yet, after evicting as
  many idle chunks as the free pool lacks; keys of the offer itself are never
  evicted, and when not enough idle chunks can be evicted nothing is stored
  and nothing evicted (vLLM returns ``None``);
- eviction order is ``LRUCachePolicy``'s: every chunk has a rank, and the idle
  chunk of lowest rank goes first. A request gets one rank the first time it
  touches the tier, and a chunk it stores or first accesses at token position
  p gets ``(request rank, -p)`` (never lowered), so within a request the
  deeper chunks are evicted before the shallower ones; ``touch(keys)`` gives
  the keys fresh ranks, ``keys[0]`` the newest.

Below the CPU tier, when configured, a disk tier receives the chunks the CPU
tier evicts (LMCache-style write-back of evictions; vLLM's ``tiering/``
package chains tiers the same way) and evicts plain LRU itself.

A hit below the GPU costs a load of ``bytes / bandwidth`` seconds
(``load_seconds``), which the request waits for: vLLM loads asynchronously
and parks the request in ``WAITING_FOR_REMOTE_KVS`` while other requests'
steps run.

Default bandwidths, one direction, host to GPU:

- ``PCIE5_X16_BYTES_PER_S``: PCIe 5.0 x16, 32 GT/s per lane with 128b/130b
  encoding, 63 GB/s (PCI-SIG, PCI Express Base Specification 5.0; one figure
  with swap preemption's, ``swap.PCIE5_X16``); the
  H100 SXM5's host interface (NVIDIA H100 Tensor Core GPU datasheet: "PCIe
  Gen5: 128GB/s", both directions);
- ``NVME_READ_BYTES_PER_S``: 13 GB/s sequential read of a PCIe 5.0 data-centre
  NVMe drive (Samsung PM1743 datasheet: 13,000 MB/s sequential read).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline.errors import ScenarioError
from pipeline.sim.prefix_index import _home
from pipeline.sim.state import (
    C_TIER_BLOCK_BYTES,
    C_TIER_BLOCKS,
    CF_TIER_BLOCK_S,
    P_STEP_TIER_BLK,
    P_STEP_TIER_TOK,
    P_TIER_CAP,
    P_TIER_USED,
)
from pipeline.sim.swap import HOST_LINK_BYTES_PER_S, PCIE5_X16, _profile_gpu

PCIE5_X16_BYTES_PER_S = PCIE5_X16  # the host link swap preemption crosses too (swap.py)
NVME_READ_BYTES_PER_S = 13e9


class Hit(Enum):
    """What a lookup of one chunk finds (vLLM's ``LookupResult``, less RETRY)."""

    MISS = 0
    HIT = 1
    PENDING = 2


@dataclass
class _Chunk:
    ref: int = -1  # -1: store in flight; 0: idle (evictable); >0: loads in flight


@dataclass
class Request:
    """One request's view of the tier: its rank and the keys it has seen."""

    rid: str
    positions: dict[bytes, int] = field(default_factory=dict)  # key -> end token
    rank: int | None = None
    seen: set[bytes] = field(default_factory=set)


class HostTier:
    """The CPU tier of one replica: ``CPUOffloadingManager`` with LRU eviction."""

    def __init__(self, num_chunks: int) -> None:
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        self.num_chunks = num_chunks
        self.chunks: dict[bytes, _Chunk] = {}
        self.ranks: dict[bytes, tuple[int, int]] = {}
        self.next_rank = 0
        self.stored = 0  # chunks stored so far
        self.evicted = 0  # chunks evicted so far

    def _request_rank(self, req: Request) -> int:
        if req.rank is None:
            self.next_rank += 1
            req.rank = self.next_rank
        return req.rank

    def _access(self, keys: Sequence[bytes], req: Request) -> None:
        """First accesses by ``req`` raise the keys' ranks (``on_request_access``)."""
        new = [k for k in keys if k not in req.seen]
        req.seen.update(new)
        if not new:
            return
        rank = self._request_rank(req)
        for k in new:
            pos = req.positions.get(k)
            if pos is None or k not in self.chunks:
                continue
            self.ranks[k] = max(self.ranks[k], (rank, -pos))

    def lookup(self, key: bytes) -> Hit:
        c = self.chunks.get(key)
        if c is None:
            return Hit.MISS
        return Hit.PENDING if c.ref < 0 else Hit.HIT

    def hits(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are ready to load (a pending one ends the run)."""
        n = 0
        for k in keys:
            if self.lookup(k) is not Hit.HIT:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[bytes]) -> None:
        for k in reversed(keys):
            if k in self.chunks:
                self.next_rank += 1
                self.ranks[k] = (self.next_rank, 0)

    def idle(self) -> int:
        return sum(1 for c in self.chunks.values() if c.ref == 0)

    def prepare_store(
        self, keys: Sequence[bytes], req: Request
    ) -> tuple[list[bytes], list[bytes]] | None:
        """(keys stored, keys evicted), or None when the tier cannot make room."""
        to_store = [k for k in keys if k not in self.chunks]
        ready = [k for k in keys if k in self.chunks and self.chunks[k].ref >= 0]
        recorded = set(to_store) | set(ready)
        self._access([k for k in keys if k in recorded], req)
        if not to_store:
            return [], []
        need = len(to_store) - (self.num_chunks - len(self.chunks))
        evicted: list[bytes] = []
        if need > 0:
            protected = set(keys)
            cands = sorted(
                (self.ranks[k], k)
                for k, c in self.chunks.items()
                if c.ref == 0 and k not in protected
            )
            if len(cands) < need:
                return None
            evicted = [k for _, k in cands[:need]]
            for k in evicted:
                del self.chunks[k]
                del self.ranks[k]
            self.evicted += len(evicted)
        for k in to_store:
            self.chunks[k] = _Chunk()
            pos = req.positions.get(k)
            if pos is None:
                self.next_rank += 1
                self.ranks[k] = (self.next_rank, 0)
            else:
                self.ranks[k] = (self._request_rank(req), -pos)
        self.stored += len(to_store)
        return to_store, evicted

    def complete_store(self, keys: Sequence[bytes], success: bool = True) -> None:
        for k in keys:
            c = self.chunks.get(k)
            if c is None or c.ref >= 0:
                continue
            if success:
                c.ref = 0
            else:
                del self.chunks[k]
                del self.ranks[k]

    def prepare_load(self, keys: Sequence[bytes], req: Request) -> None:
        for k in keys:
            c = self.chunks[k]
            if c.ref < 0:
                raise ValueError(f"chunk {k!r} is not ready for reading")
            c.ref += 1
        self._access(keys, req)

    def complete_load(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            self.chunks[k].ref -= 1


class DiskTier:
    """The disk tier: takes the CPU tier's evictions, evicts least recently used."""

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self.lru: OrderedDict[bytes, None] = OrderedDict()  # oldest first
        self.evicted = 0

    def put(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            self.lru[k] = None
            self.lru.move_to_end(k)
        while len(self.lru) > self.num_chunks:
            self.lru.popitem(last=False)
            self.evicted += 1

    def hits(self, keys: Sequence[bytes]) -> int:
        n = 0
        for k in keys:
            if k not in self.lru:
                break
            self.lru.move_to_end(k)
            n += 1
        return n


def num_chunks(
    size_gb: float, bytes_per_block: int, blocks_per_chunk: int, align: int = 4096
) -> int:
    """Chunks a tier of ``size_gb`` GiB holds.

    As vLLM sizes ``--kv-offloading-size`` (``CPUOffloadingSpec``,
    ``cpu/spec.py``): GiB over all workers, each chunk's bytes (all workers'
    copies of ``blocks_per_chunk`` blocks) rounded up to ``align``, the
    shared region's page size (``mmap.PAGESIZE``, 4 KiB on x86-64 Linux).
    """
    if not math.isfinite(size_gb) or size_gb < 0:
        raise ValueError(f"tier size must be a finite number of GiB >= 0, got {size_gb}")
    chunk = -(-bytes_per_block * blocks_per_chunk // align) * align
    return int(size_gb * 2**30) // chunk


def load_seconds(blocks: int, bytes_per_block: int, bytes_per_s: float) -> float:
    """Seconds to load ``blocks`` KV blocks from a tier of ``bytes_per_s``."""
    return blocks * bytes_per_block / bytes_per_s if blocks else 0.0


@dataclass
class TierStats:
    """Prefix hits per tier, in tokens, and what loading the lower ones cost."""

    gpu_tokens: int = 0
    cpu_tokens: int = 0
    disk_tokens: int = 0
    cpu_blocks: int = 0
    disk_blocks: int = 0
    load_bytes: int = 0
    load_s: float = 0.0


def replay_hits(
    prompts: Sequence[tuple[Sequence[bytes], int]],
    gpu_blocks: int,
    cpu_chunks: int,
    disk_chunks: int,
    block_tokens: int,
    bytes_per_block: int,
    cpu_bytes_per_s: float = PCIE5_X16_BYTES_PER_S,
    disk_bytes_per_s: float = NVME_READ_BYTES_PER_S,
    store_batch_blocks: int = 16,
) -> TierStats:
    """Prefix hits per tier for prompts run one at a time, each done before the next.

    ``prompts``: each prompt's chained block keys and its length in tokens.
    A prompt's GPU prefix hit is extended by the CPU tier's ready chunks, then
    by the disk tier's; every block of the prompt is then offered to the CPU
    tier (vLLM's store path offers each computed block, hit or not, and skips
    what is cached already) in offers of ``store_batch_blocks`` blocks, as a
    chunked prefill computes them (vLLM offers the blocks each step completes;
    an offer protects only its own keys, so a prompt longer than the tier
    evicts its own first blocks), its stores complete before the next prompt, and
    the GPU keeps the most recent ``gpu_blocks`` blocks, a prompt's deeper
    blocks evicted before its shallower ones. One chunk is one block.
    No timing: this is the cache alone, without concurrency (a block another
    request is still using cannot be evicted in the engine, here it can).
    """
    gpu: OrderedDict[bytes, None] = OrderedDict()  # oldest first
    cpu = HostTier(cpu_chunks)
    disk = DiskTier(disk_chunks)
    st = TierStats()
    for n, (keys, tokens) in enumerate(prompts):
        g = 0
        for k in keys:
            if k not in gpu:
                break
            g += 1
        req = Request(rid=str(n), positions={k: (i + 1) * block_tokens for i, k in enumerate(keys)})
        c = cpu.hits(keys[g:])
        if c:
            cpu.prepare_load(keys[g : g + c], req)
            cpu.complete_load(keys[g : g + c])
        d = disk.hits(keys[g + c :]) if disk_chunks else 0
        ends = [min((i + 1) * block_tokens, tokens) for i in range(g + c + d)]
        at = [0, *ends]
        st.gpu_tokens += at[g]
        st.cpu_tokens += at[g + c] - at[g]
        st.disk_tokens += at[g + c + d] - at[g + c]
        st.cpu_blocks += c
        st.disk_blocks += d
        st.load_bytes += (c + d) * bytes_per_block
        st.load_s += load_seconds(c, bytes_per_block, cpu_bytes_per_s)
        st.load_s += load_seconds(d, bytes_per_block, disk_bytes_per_s)
        for lo in range(0, len(keys) if cpu_chunks else 0, store_batch_blocks):
            out = cpu.prepare_store(list(keys[lo : lo + store_batch_blocks]), req)
            if out is not None:
                cpu.complete_store(out[0])
                if disk_chunks:
                    disk.put(out[1])
        for k in reversed(keys):  # the deepest block is the oldest: evicted first
            gpu[k] = None
            gpu.move_to_end(k)
        while len(gpu) > gpu_blocks:
            gpu.popitem(last=False)
    return st


# --- the tiers in the replay loops ---------------------------------------------------
#
# The loops (reference_kv.py, and cache.py / policies/vllm.py compiled) use a simpler
# tier than HostTier above, one both can keep step by step: each tier of a replica is
# an LRU of cache units (one entry per unit key, holding the unit's KV blocks),
# sized in blocks; see docs/replay.md, "KV offloading tiers", for what it leaves out.

KEYS = (
    "kv_offloading_size_gb",
    "kv_disk_size_gb",
    "kv_offloading_link_gb_s",
    "kv_disk_read_gb_s",
    "kv_offloading_kv_bytes_per_token",
)
GIB = 2**30


@dataclass(frozen=True)
class Tiers:
    """A scenario's KV offloading tiers, resolved (one replica's)."""

    cpu_blocks: int  # KV blocks the CPU tier holds (kv_offloading_size_gb)
    disk_blocks: int  # ... the disk tier (kv_disk_size_gb; 0: none)
    block_bytes: int  # bytes of one KV block (all layers, K and V, all TP ranks)
    cpu_bytes_per_s: float  # host link to the GPUs, one direction (all of them together)
    disk_bytes_per_s: float  # the disk's read bandwidth

    def pack(self, cfg: npt.NDArray[np.int64], cfgf: npt.NDArray[np.float64]) -> None:
        cfg[C_TIER_BLOCKS] = self.cpu_blocks
        cfg[C_TIER_BLOCKS + 1] = self.disk_blocks
        cfg[C_TIER_BLOCK_BYTES] = self.block_bytes
        cfgf[CF_TIER_BLOCK_S] = self.block_bytes / self.cpu_bytes_per_s
        cfgf[CF_TIER_BLOCK_S + 1] = self.block_bytes / self.disk_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_tier_cpu_blocks": self.cpu_blocks,
            "kv_tier_disk_blocks": self.disk_blocks,
            "kv_tier_block_bytes": self.block_bytes,
            "kv_tier_cpu_bytes_per_s": self.cpu_bytes_per_s,
            "kv_tier_disk_bytes_per_s": self.disk_bytes_per_s,
        }


def resolve(
    params: Any, *, profile: str | None, block_size: int, caching: bool, where: str
) -> Tiers | None:
    """The scenario's offloading tiers (None: off), their keys checked.

    ``profile``: the profile's name or path ("": the default profile; None with a
    [cost] table): its KV bytes per token and its GPU's host link are the defaults.
    """
    cpu_gb = params.kv_offloading_size_gb
    disk_gb = params.kv_disk_size_gb
    for key in KEYS:
        v = getattr(params, key)
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(f"{where}: {key} must be a finite number >= 0, got {v}")
    if cpu_gb == 0:
        if disk_gb > 0:
            raise ScenarioError(
                f"{where}: kv_disk_size_gb needs kv_offloading_size_gb > 0 (the disk tier "
                "takes the CPU tier's evictions); set both or drop kv_disk_size_gb"
            )
        return None
    if not caching:
        raise ScenarioError(
            f"{where}: kv_offloading_size_gb needs enable_prefix_caching = true (the tiers "
            "extend the prefix cache's hits); drop kv_offloading_size_gb or turn caching on"
        )
    if profile == "":
        from pipeline.sim import profiles

        profile = profiles.DEFAULT_PROFILE
    kv = params.kv_offloading_kv_bytes_per_token
    if not kv and profile is not None:
        from pipeline.sim import profiles

        kv = profiles.load_profile(profile).kv_bytes_per_token
    if not kv:
        raise ScenarioError(
            f"{where}: kv_offloading_size_gb with a [cost] table needs "
            "kv_offloading_kv_bytes_per_token and kv_offloading_link_gb_s (there is no model "
            "or GPU to derive them from)"
        )
    if params.kv_offloading_link_gb_s > 0:
        link = params.kv_offloading_link_gb_s * 1e9
    else:
        if profile is None:
            raise ScenarioError(
                f"{where}: kv_offloading_size_gb with a [cost] table needs kv_offloading_link_gb_s"
            )
        gpu, tp = _profile_gpu(profile)
        if gpu not in HOST_LINK_BYTES_PER_S:
            raise ScenarioError(
                f"{where}: no host-link figure for GPU {gpu!r}; set kv_offloading_link_gb_s "
                "(GB/s one way)"
            )
        link = HOST_LINK_BYTES_PER_S[gpu][0] * tp  # each GPU loads its shard over its own
    disk_bw = (
        params.kv_disk_read_gb_s * 1e9 if params.kv_disk_read_gb_s > 0 else NVME_READ_BYTES_PER_S
    )
    block_bytes = int(kv) * block_size
    too_big = max(cpu_gb, disk_gb) * GIB / block_bytes
    if too_big > 2**62:
        raise ScenarioError(
            f"{where}: kv_offloading_size_gb / kv_disk_size_gb hold more than 2**62 KV blocks "
            f"({too_big:.3g}); give sizes in GiB"
        )
    cpu = num_chunks(cpu_gb, block_bytes, 1)
    disk = num_chunks(disk_gb, block_bytes, 1) if disk_gb > 0 else 0
    return Tiers(cpu, disk, block_bytes, float(link), float(disk_bw))


def tier_slots(cfg: npt.NDArray[np.int64], num_keys: int) -> int:
    """Entries one tier of a replica needs at most: a unit has >= 1 block, and only the
    replay's own keys are stored (0: the tiers are off)."""
    if cfg[C_TIER_BLOCKS] == 0:
        return 0
    return int(min(max(cfg[C_TIER_BLOCKS], cfg[C_TIER_BLOCKS + 1]), num_keys))


# The compiled side. The tiers of every replica live in one flat int64 array ``tt``
# from offset ``n0`` on (``cache.py`` keeps them after the requests' unit slots, so
# that no compiled signature grows when they are off). ``tt[n0]`` is S, the entries of
# one tier, ``tt[n0 + 1]`` T, its hash table's size (a power of two >= 2 S); tier t of
# replica r (of R) then takes ``HDR + EW * S + 2 * T`` words from
# ``n0 + 2 + (t * R + r) * that`` on:
#
# - a header: its LRU list's head + 1 (the least recently used entry; 0: empty), its
#   tail + 1 (the most recent), the entries handed out so far, the free list's head + 1;
# - S entries of (key, blocks, prev + 1, next + 1): the key is the unit key's bits, the
#   links make the LRU list (a free entry's next links the free list);
# - T table entries of (key, entry + 1; 0: empty): open addressing with linear probing,
#   deletion by backward shift (as ``cache.py``'s and ``prefix_index.py``'s tables,
#   whose hash it uses).
#
# Every store, hit and eviction is O(1) (the table's probes aside). The list is the
# LRU order the stamps of a clock gave before (every store or hit moves its unit to
# the tail, stamped newest; eviction takes the head, the oldest stamp). All zeros
# but the two sizes is every tier empty (``tier_init``).
HDR = 4
EW = 4


def tier_table(slots: int) -> int:
    """Hash table entries of a tier of ``slots`` entries (load <= 1/2)."""
    return 1 << max(4, (2 * slots - 1).bit_length())


def tier_words(num_replicas: int, slots: int) -> int:
    """Words of ``tt`` the tiers take (2 tiers of ``slots`` entries per replica; 0: off)."""
    if slots <= 0:
        return 0
    return 2 + 2 * num_replicas * (HDR + EW * slots + 2 * tier_table(slots))


def tier_init(tt: npt.NDArray[np.int64], n0: int, slots: int) -> None:
    """Empty tiers in ``tt[n0:]`` (all zeros), of ``slots`` entries each (0: off)."""
    if slots > 0:
        tt[n0] = slots
        tt[n0 + 1] = tier_table(slots)


@njit(cache=True, error_model="numpy", inline="always")
def _base(tt: npt.NDArray[np.int64], n0: int, nrep: int, t: int, r: int) -> tuple[int, int, int]:
    """(offset of tier t of replica r, of its hash table, the table's mask)."""
    slots = tt[n0]
    size = tt[n0 + 1]
    b0 = n0 + 2 + (t * nrep + r) * (HDR + EW * slots + 2 * size)
    return b0, b0 + HDR + EW * slots, size - 1


@njit(cache=True, error_model="numpy", inline="always")
def _find(tt: npt.NDArray[np.int64], tb: int, mask: int, key: int | np.int64) -> int:
    """The entry holding ``key`` (-1: none)."""
    j = _home(np.uint64(key), mask)
    while True:
        v = tt[tb + 2 * j + 1]
        if v == 0:
            return -1
        if tt[tb + 2 * j] == key:
            return int(v - 1)
        j = (j + 1) & mask


@njit(cache=True, error_model="numpy", inline="always")
def _unlink(tt: npt.NDArray[np.int64], b0: int, e: int) -> None:
    q = b0 + HDR + EW * e
    prev = tt[q + 2]
    nxt = tt[q + 3]
    if prev > 0:
        tt[b0 + HDR + EW * (prev - 1) + 3] = nxt
    else:
        tt[b0] = nxt
    if nxt > 0:
        tt[b0 + HDR + EW * (nxt - 1) + 2] = prev
    else:
        tt[b0 + 1] = prev


@njit(cache=True, error_model="numpy", inline="always")
def _append(tt: npt.NDArray[np.int64], b0: int, e: int) -> None:
    """Entry e becomes the most recently used (the list's tail)."""
    q = b0 + HDR + EW * e
    tail = tt[b0 + 1]
    tt[q + 2] = tail
    tt[q + 3] = 0
    if tail > 0:
        tt[b0 + HDR + EW * (tail - 1) + 3] = e + 1
    else:
        tt[b0] = e + 1
    tt[b0 + 1] = e + 1


@njit(cache=True, error_model="numpy", inline="always")
def _to_tail(tt: npt.NDArray[np.int64], b0: int, e: int) -> None:
    if tt[b0 + 1] != e + 1:
        _unlink(tt, b0, e)
        _append(tt, b0, e)


@njit(cache=True, error_model="numpy")
def _add(
    tt: npt.NDArray[np.int64],
    b0: int,
    tb: int,
    mask: int,
    rp: npt.NDArray[np.int64],
    r: int,
    t: int,
    key: int | np.int64,
    b: int,
) -> None:
    """A new unit (not held, and room made for it) becomes the most recently used."""
    e = tt[b0 + 3] - 1
    if e >= 0:  # a free entry, reused
        tt[b0 + 3] = tt[b0 + HDR + EW * e + 3]
    else:
        e = tt[b0 + 2]
        tt[b0 + 2] = e + 1  # never more than S at once: sized for every key (tier_slots)
    q = b0 + HDR + EW * e
    tt[q] = key
    tt[q + 1] = b
    _append(tt, b0, e)
    j = _home(np.uint64(key), mask)
    while tt[tb + 2 * j + 1] != 0:
        j = (j + 1) & mask
    tt[tb + 2 * j] = key
    tt[tb + 2 * j + 1] = e + 1
    rp[r, P_TIER_USED + t] += b


@njit(cache=True, error_model="numpy")
def _pop(
    tt: npt.NDArray[np.int64],
    b0: int,
    tb: int,
    mask: int,
    rp: npt.NDArray[np.int64],
    r: int,
    t: int,
) -> tuple[int, int]:
    """Evict the least recently used unit: its (key, blocks)."""
    e = tt[b0] - 1
    q = b0 + HDR + EW * e
    key = tt[q]
    b = tt[q + 1]
    _unlink(tt, b0, e)
    tt[q + 3] = tt[b0 + 3]  # onto the free list
    tt[b0 + 3] = e + 1
    rp[r, P_TIER_USED + t] -= b
    i = _home(np.uint64(key), mask)
    while tt[tb + 2 * i] != key or tt[tb + 2 * i + 1] == 0:
        i = (i + 1) & mask
    j = i
    while True:  # backward shift: move later entries of the probe run into the hole
        j = (j + 1) & mask
        if tt[tb + 2 * j + 1] == 0:
            break
        k = _home(np.uint64(tt[tb + 2 * j]), mask)
        # leave j where it is if its home lies cyclically in (i, j]
        if (i < j and i < k <= j) or (i > j and (k > i or k <= j)):
            continue
        tt[tb + 2 * i] = tt[tb + 2 * j]
        tt[tb + 2 * i + 1] = tt[tb + 2 * j + 1]
        i = j
    tt[tb + 2 * i + 1] = 0
    return int(key), int(b)


@njit(cache=True, error_model="numpy", inline="always")
def _admit(
    tt: npt.NDArray[np.int64],
    n0: int,
    rp: npt.NDArray[np.int64],
    r: int,
    t: int,
    key: int | np.int64,
    b: int,
) -> tuple[int, int, int]:
    """Where tier t must add a unit of b blocks, or b0 = -1 when it need not: the unit is
    larger than the tier (not stored), or held already (it becomes the most recent)."""
    if b <= 0 or b > rp[r, P_TIER_CAP + t]:
        return -1, 0, 0
    b0, tb, mask = _base(tt, n0, rp.shape[0], t, r)
    e = _find(tt, tb, mask, key)
    if e >= 0:
        _to_tail(tt, b0, e)
        return -1, 0, 0
    return b0, tb, mask


@njit(cache=True, error_model="numpy")
def _put(
    tt: npt.NDArray[np.int64],
    n0: int,
    rp: npt.NDArray[np.int64],
    r: int,
    t: int,
    key: int | np.int64,
    b: int,
) -> None:
    """Store (or refresh) a unit of b blocks in tier t, evicting the least recently used
    units until it fits; tier 0's evictions go down to tier 1, if any, each stored there
    the same way as it leaves; tier 1's vanish (no recursion: numba)."""
    b0, tb, mask = _admit(tt, n0, rp, r, t, key, b)
    if b0 < 0:
        return
    down = t == 0 and rp[r, P_TIER_CAP + 1] > 0
    while rp[r, P_TIER_USED + t] + b > rp[r, P_TIER_CAP + t]:
        k, kb = _pop(tt, b0, tb, mask, rp, r, t)
        if down:
            d0, db, dmask = _admit(tt, n0, rp, r, 1, k, kb)
            if d0 >= 0:
                while rp[r, P_TIER_USED + 1] + kb > rp[r, P_TIER_CAP + 1]:
                    _pop(tt, d0, db, dmask, rp, r, 1)
                _add(tt, d0, db, dmask, rp, r, 1, k, kb)
    _add(tt, b0, tb, mask, rp, r, t, key, b)


@njit(cache=True, error_model="numpy")
def tier_store(
    tt: npt.NDArray[np.int64],
    n0: int,
    rp: npt.NDArray[np.int64],
    r: int,
    key: int | np.int64,
    b: int,
) -> None:
    """Store a unit of ``b`` blocks, just computed (committed), to the CPU tier.

    A key stored already becomes the most recently used; a new one evicts the least
    recently used units until it fits (each goes down to the disk tier, if any); a
    unit larger than the tier is not stored.
    """
    _put(tt, n0, rp, r, 0, key, b)


@njit(cache=True, error_model="numpy")
def tier_run(
    tt: npt.NDArray[np.int64],
    n0: int,
    nrep: int,
    t: int,
    r: int,
    keys: npt.NDArray[np.uint64],
    lo: int,
    hi: int,
) -> int:
    """How many of ``keys[lo:hi]``, from the first on, tier t of replica r holds."""
    _, tb, mask = _base(tt, n0, nrep, t, r)
    n = 0
    while lo + n < hi and _find(tt, tb, mask, np.int64(keys[lo + n])) >= 0:
        n += 1
    return n


@njit(cache=True, error_model="numpy")
def tier_touch(
    tt: npt.NDArray[np.int64],
    n0: int,
    rp: npt.NDArray[np.int64],
    t: int,
    r: int,
    keys: npt.NDArray[np.uint64],
    lo: int,
    hi: int,
) -> None:
    """A load of ``keys[lo:hi]`` from tier t: each becomes the most recently used, in order."""
    if lo >= hi:
        return
    b0, tb, mask = _base(tt, n0, rp.shape[0], t, r)
    for q in range(lo, hi):
        _to_tail(tt, b0, _find(tt, tb, mask, np.int64(keys[q])))


@njit(cache=True, error_model="numpy")
def count_load(rp: npt.NDArray[np.int64], r: int, t: int, tokens: int, blocks: int) -> None:
    """The step being decided loads ``blocks`` blocks (``tokens`` tokens) from tier t."""
    rp[r, P_STEP_TIER_TOK + t] += tokens
    rp[r, P_STEP_TIER_BLK + t] += blocks


class LoopTier:
    """One tier of one replica in the reference loop: an LRU of unit keys, in blocks."""

    def __init__(self, blocks: int) -> None:
        self.cap = blocks
        self.used = 0
        self.lru: OrderedDict[int, int] = OrderedDict()  # key -> blocks, oldest first

    def put(self, key: int, blocks: int) -> list[tuple[int, int]]:
        """Store (or refresh) a unit; the (key, blocks) it evicted, oldest first."""
        if blocks <= 0 or blocks > self.cap:
            return []
        if key in self.lru:
            self.lru.move_to_end(key)
            return []
        out = []
        while self.used + blocks > self.cap:
            k, b = self.lru.popitem(last=False)
            self.used -= b
            out.append((k, b))
        self.lru[key] = blocks
        self.used += blocks
        return out

    def run(self, keys: Sequence[int]) -> int:
        n = 0
        for k in keys:
            if k not in self.lru:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[int]) -> None:
        for k in keys:
            self.lru.move_to_end(k)
