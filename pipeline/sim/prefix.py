"""Prefix-cache keys from the requests table: bridging the trace's hash blocks to the engine's.

A trace carries chained hashes of its prompts' blocks at its own block size T
(``requests.block_size``: Mooncake 512 tokens; Bailian and our token-id
hashing 16). The engine caches KV blocks of B tokens (``block_size`` of the
scenario). The simulator caches **units** of ``U = lcm(T, B)`` tokens, keyed
by the trace's hash at the unit's last trace block (the hashes are chained,
so it names the whole prefix):

- ``T == B``: a unit is one engine block, exactly the engine's model;
- ``T < B`` with B a multiple of T (16-token hashes, an engine with 32-token
  blocks): a unit is one engine block and its key is exact (re-chunking);
- ``T > B`` (Mooncake's 512 vs vLLM's 16), or neither divides the other: a
  unit is coarser than an engine block. This is the **bridging
  approximation**: the trace says nothing about where inside a block two
  prompts diverge, so a hit counts in whole units. It **underestimates** the
  engine's hits: a request that shares ``k`` units plus part of the next one
  hits ``k × U`` tokens here but up to ``k × U + U - B`` in the engine, at most
  ``U - B`` tokens per lookup; and a prompt of whole units, all cached,
  recomputes its last unit here, its last engine block in the engine.
  Capacity, eviction and reservation stay in engine blocks: a unit holds
  ``U / B`` of them and is evicted whole.

**The tail** (``partial_blocks``, on by default; scenario key
``prefix_partial_blocks``). What is left of a prompt after its whole units,
``p`` tokens (``0 < p < U``), is where its last trace block lies when that is
partial. Mooncake lists a hash for it (``len(hash_ids) == ceil(input_length /
512)``), and that hash is chained like the others over the block's tokens,
which are then fewer than T: an equal hash names the whole prompt, up to its
last token. The engine caches the full B-token blocks inside that partial
block, and a request whose prompt is equal hits them, as far as ``num_tokens -
1`` allows. So the prompt gets one more unit, its **tail**: the ``(p - 1) // B
× B`` tokens after its whole units, keyed by the hash of the trace block that
holds the tail's last token and by the tail's length (tails of different
lengths never match), ``R_TAIL`` tokens in the loop's state. A prompt equal to
a cached one then hits exactly what the engine hits (``(L - 1) // B × B``
tokens, L its length), when the trace's hashes cover every whole unit and that
trace block. Off: only whole units (the engines never cache a partial block,
and the partial hash is not used).

Only blocks inside the prompt are used. Keys mix in U so units of different
sizes never match. Requests without hashes get no units and are never looked
up; a request of a hashed trace whose prompt is shorter than one unit has a
unit size and no whole unit: it is looked up (and counted in the hit rates, as
vLLM counts every request) and hits only through its tail.

vLLM also caches the full blocks of generated tokens, hashed by their
tokens (the chain goes on over prompt + output), so a later prompt that
quotes an earlier answer hits them. ``extend_keys`` gives each request's units
beyond its prompt's (the rest of its tail's unit, if it has a tail, then whole
units of prompt and output) the trace's keys of them where the requests table
has them (``output_hashes``, from logs that carry the generated token ids),
keyed as prompt units are, so a later prompt holding the same tokens hits
them; elsewhere keys derived from the request's own chain and its index,
unique to the request: another request never hits them, the request itself
does when it is resumed after a preemption. Either way they take their place
in the eviction order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from pipeline.sim.state import PrefixKeys

_GOLDEN = 0x9E3779B97F4A7C15
_MIX_TAIL = np.uint64(0xD6E8FEB86659FD93)  # mixes a tail's length into its key
_MIX_REST = np.uint64(0xA0761D6478BD642F)  # ... and the rest of its unit's


def unit_tokens(trace_block: int, engine_block: int) -> int:
    """Tokens per cache unit for a trace block size and an engine block size."""
    return math.lcm(trace_block, engine_block)


def build_keys(
    prompt_tokens: npt.NDArray[np.int64],
    trace_block: npt.NDArray[np.int64],
    hashes: pa.Array | pa.ChunkedArray,
    engine_block: int,
    *,
    partial_blocks: bool = True,
    output_hashes: pa.Array | pa.ChunkedArray | None = None,
) -> PrefixKeys:
    """The cache-unit keys of each request.

    Args:
        prompt_tokens: prompt lengths.
        trace_block: the trace's hash block size per request (<= 0: no hashes).
        hashes: per request, its chained block hashes (list<uint64>, null = none).
        engine_block: the engine's KV block size.
        partial_blocks: give a prompt a tail unit where the trace hashes what is
            left of it after its whole units (the module docstring); False: whole
            units only.
        output_hashes: per request, the chain continued over prompt + output:
            the hashes of the trace blocks after the prompt's full blocks
            (``requests.output_hashes``; null = none); they key the units beyond
            the prompt's (``PrefixKeys.output``, for ``extend_keys``).
    """
    n = len(prompt_tokens)
    if isinstance(hashes, pa.ChunkedArray):
        hashes = hashes.combine_chunks() if hashes.num_chunks else pa.array([], hashes.type)
    lens = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(hashes).to_numpy(zero_copy_only=False).astype(np.uint64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if n else np.zeros(0, dtype=np.int64)
    has = pc.fill_null(pc.is_valid(hashes), False).to_numpy(zero_copy_only=False)
    tb = np.where(has, np.maximum(trace_block, 0), 0).astype(np.int64)
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    units = np.zeros(n, dtype=np.int64)
    utok = np.zeros(n, dtype=np.int64)
    per_unit = np.ones(n, dtype=np.int64)  # trace blocks per unit
    tail = np.zeros(n, dtype=np.int64)  # tokens of the tail unit (0: none)
    tail_hash = np.zeros(n, dtype=np.int64)  # index of its hash within the request's
    for t in np.unique(tb[tb > 0]):
        rows = tb == t
        u = unit_tokens(int(t), engine_block)
        full = np.minimum(lens[rows], prompt[rows] // t)  # full blocks inside the prompt
        k = full // (u // t)
        units[rows] = k
        utok[rows] = u  # also for a prompt shorter than one unit: looked up, never hits
        per_unit[rows] = u // t
        if partial_blocks:
            # the full engine blocks of the rest, within the prompt's first num_tokens - 1
            rest = prompt[rows] - k * u
            whole = k == prompt[rows] // u  # every whole unit of the prompt has its hash
            tok = np.where(whole & (rest >= 1), (rest - 1) // engine_block * engine_block, 0)
            at = np.maximum(k * u + tok - 1, 0) // t  # the trace block of its last token
            tail[rows] = np.where((tok > 0) & (lens[rows] > at), tok, 0)
            tail_hash[rows] = at
    count = units + (tail > 0)
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    total = int(offsets[-1])
    owner = np.repeat(np.arange(n), count)
    k = np.arange(total) - offsets[:-1][owner]  # unit index within its request
    is_tail = k == units[owner]  # (a request's units come first: k < units otherwise)
    pick = starts[owner] + np.where(is_tail, tail_hash[owner], (k + 1) * per_unit[owner] - 1)
    mix = (utok[owner].astype(np.uint64) * np.uint64(_GOLDEN)).astype(np.uint64)
    mix ^= np.where(is_tail, tail[owner].astype(np.uint64) * _MIX_TAIL, np.uint64(0))
    keys = flat[pick] ^ mix if total else np.zeros(0, dtype=np.uint64)
    output = None
    if output_hashes is not None:
        whole = (units == prompt // np.maximum(utok, 1)) & (utok > 0)  # every whole unit hashed
        output = _output_keys(prompt, tb, utok, tail, whole, output_hashes)
    return PrefixKeys(offsets, keys.astype(np.uint64), utok, tail if tail.any() else None, output)


def _output_keys(
    prompt: npt.NDArray[np.int64],
    trace_block: npt.NDArray[np.int64],
    utok: npt.NDArray[np.int64],
    tail: npt.NDArray[np.int64],
    whole: npt.NDArray[np.bool_],
    output_hashes: pa.Array | pa.ChunkedArray,
) -> PrefixKeys:
    """The keys of each request's units after its prompt's, from the trace's hashes of
    prompt + output (``build_keys``). The b-th of those units ends at ``(k + 1 + b) × U``
    tokens (k whole prompt units; the first is the rest of the tail's unit when there is
    a tail), so its key is the hash of trace block ``(k + 1 + b) × U / T - 1``; there are
    as many as the trace's hashes reach. The rest of a tail's unit mixes in its length,
    so it never matches a whole unit."""
    n = len(prompt)
    if isinstance(output_hashes, pa.ChunkedArray):
        output_hashes = (
            output_hashes.combine_chunks()
            if output_hashes.num_chunks
            else pa.array([], output_hashes.type)
        )
    lens = pc.fill_null(pc.list_value_length(output_hashes), 0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(output_hashes).to_numpy(zero_copy_only=False).astype(np.uint64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if n else np.zeros(0, dtype=np.int64)
    t = np.maximum(trace_block, 1)
    u = np.maximum(utok, 1)
    step = u // t  # trace blocks per unit
    first = (prompt // u + 1) * step - 1 - prompt // t  # index of the first one's hash
    count = np.where(whole & (lens > first), (lens - 1 - first) // np.maximum(step, 1) + 1, 0)
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    total = int(offsets[-1])
    owner = np.repeat(np.arange(n), count)
    b = np.arange(total) - offsets[:-1][owner]
    pick = starts[owner] + first[owner] + b * step[owner]
    mix = (utok[owner].astype(np.uint64) * np.uint64(_GOLDEN)).astype(np.uint64)
    rest = (b == 0) & (tail[owner] > 0)
    mix ^= np.where(rest, (utok - tail)[owner].astype(np.uint64) * _MIX_REST, np.uint64(0))
    keys = flat[pick] ^ mix if total else np.zeros(0, dtype=np.uint64)
    return PrefixKeys(offsets, keys.astype(np.uint64), utok.copy())


_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN_U = np.uint64(_GOLDEN)


def extend_keys(
    prefix: PrefixKeys,
    prompt_tokens: npt.NDArray[np.int64],
    output_tokens: npt.NDArray[np.int64],
) -> PrefixKeys:
    """``prefix`` plus, per request with units, keys for its units beyond the prompt's.

    A request computes at most ``prompt + output - 1`` tokens, so it has
    ``(prompt + output - 1) // U`` whole units (and its tail); those past its
    prompt units get the trace's keys of them (``prefix.output``: the hashes of
    prompt + output, as vLLM hashes generated blocks by their tokens) as far
    as the trace has them, then keys chained from its last prompt key (or
    from its index when it has none) through splitmix64, unique to the request.
    """
    old = np.diff(prefix.offsets)
    u = prefix.unit_tokens
    # its units within prompt + output - 1 tokens: a tail ends inside the prompt, so it
    # is one unit more than the whole ones
    total = (prompt_tokens + output_tokens - 1) // np.maximum(u, 1) + (prefix.tails > 0)
    total = np.maximum(np.where(u > 0, total, 0), old).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(total)]).astype(np.int64)
    out = prefix.output if prefix.output is not None else PrefixKeys.empty(len(prefix))
    keys = _extended(
        np.ascontiguousarray(prefix.offsets, dtype=np.int64),
        np.ascontiguousarray(prefix.keys, dtype=np.uint64),
        np.ascontiguousarray(out.offsets, dtype=np.int64),
        np.ascontiguousarray(out.keys, dtype=np.uint64),
        offsets,
    )
    return PrefixKeys(offsets, keys, u.copy(), prefix.tail_tokens)


@njit(cache=True)
def _extended(
    old_offsets: npt.NDArray[np.int64],
    old_keys: npt.NDArray[np.uint64],
    out_offsets: npt.NDArray[np.int64],
    out_keys: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.int64],
) -> npt.NDArray[np.uint64]:
    """The keys of ``extend_keys``: each request's prompt keys, the trace's keys of the
    units after them, then its own chain."""
    keys = np.empty(offsets[-1], dtype=np.uint64)
    one = np.uint64(1)
    for j in range(len(offsets) - 1):
        a = old_offsets[j]
        m = old_offsets[j + 1] - a
        base = offsets[j]
        keys[base : base + m] = old_keys[a : a + m]
        o = out_offsets[j]
        traced = min(out_offsets[j + 1] - o, offsets[j + 1] - base - m)
        keys[base + m : base + m + traced] = out_keys[o : o + traced]
        # the request's own chain: its last prompt key (or its index), then splitmix64
        uj = np.uint64(j)
        seed = old_keys[a + m - 1] if m > 0 else uj * _GOLDEN_U
        seed ^= (uj + one) * _MIX1
        for k in range(m + traced, offsets[j + 1] - base):
            x = seed + np.uint64(k - m + 1) * _GOLDEN_U
            x = (x ^ (x >> np.uint64(30))) * _MIX1
            x = (x ^ (x >> np.uint64(27))) * _MIX2
            keys[base + k] = x ^ (x >> np.uint64(31))
    return keys


def describe(
    prefix: PrefixKeys,
    trace_block: npt.NDArray[np.int64],
    engine_block: int,
    *,
    partial_blocks: bool = True,
) -> dict[str, Any]:
    """The granularity facts the summary reports (and the report should show)."""
    has = prefix.unit_tokens > 0
    blocks = sorted({int(t) for t in np.unique(trace_block[has])})
    units = sorted({int(u) for u in np.unique(prefix.unit_tokens[has])})
    bridged = any(u > engine_block for u in units)
    note = None
    if bridged:
        if partial_blocks:
            tails = f" and in the {engine_block}-token blocks of a prompt's rest (its tail)"
            rest = ""
        else:
            tails = ""
            rest = " (plus the engine blocks of a prompt's partial last unit)"
        note = (
            f"prefix hashes come in blocks of {', '.join(map(str, blocks))} tokens, coarser than "
            f"the engine's {engine_block}-token KV blocks: hits are counted in whole "
            f"{', '.join(map(str, units))}-token units{tails}, which underestimates the "
            f"engine's hits by less than one unit per lookup{rest}"
        )
    return {
        "prefix_requests_with_hashes": int(has.sum()),
        "prefix_trace_block_sizes": blocks,
        "prefix_unit_tokens": units,
        "prefix_engine_block_size": engine_block,
        "prefix_bridged": bridged,
        "prefix_bridging": note,
    }
