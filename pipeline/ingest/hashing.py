"""Chained prefix block hashes, computed the way vLLM's prefix cache computes them.

A prompt of token ids is cut into blocks of ``block_size`` tokens; only full
blocks are hashed (a trailing partial block is never cached by vLLM either).
Block ``i`` is hashed together with the hash of block ``i - 1``, so two prompts
have equal hashes at block ``i`` exactly when their first ``(i + 1) *
block_size`` tokens are equal: a longest-leading-match cache lookup over these
hashes is a prefix match.

How this matches vLLM (``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``
with the default ``--prefix-caching-hash-algo sha256``, ``vllm/utils/hashing.py``):

* each block hash is ``sha256(pickle.dumps((parent, tuple(block_token_ids),
  extra_keys), protocol=5))`` where ``parent`` is the previous block's 32-byte
  digest, or ``NONE_HASH`` for the first block;
* ``extra_keys`` is ``None``, except on the first block of a request that has a
  cache salt, where it is ``(cache_salt,)`` (vLLM's ``cache_salt`` request
  field: requests with different salts never share blocks);
* vLLM draws ``NONE_HASH`` from ``os.urandom`` unless ``PYTHONHASHSEED`` is set,
  in which case it is ``sha256(pickle.dumps(PYTHONHASHSEED))``. Here it is always
  the seeded form, with seed ``"0"`` by default, so hashes are reproducible.

Byte-identical with vLLM (sha256 algo, ``PYTHONHASHSEED=0``, same block size)
for text-only requests without LoRA, multimodal inputs or prompt embeddings:
the 32-byte digests are the same, and our uint64s equal the integers vLLM's
``maybe_convert_block_hash`` makes of them for KV-cache events (with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``). This is the bytes-valued hashing of
current V1 engines; older releases chained Python ints and are not matched.
Not identical: requests with a LoRA adapter, images or prompt embeddings (their
extra keys are not in a log), the ``sha256_cbor`` / ``xxhash`` algorithms, and
an engine started without ``PYTHONHASHSEED`` (random ``NONE_HASH``). The
tracereplay ingest salt (``hash_salt``) is an extra key of our own, appended
after the request's ``cache_salt``; with a salt set, hashes deliberately differ
from the engine's. ``pickle`` protocol 5 is what vLLM's
``pickle.HIGHEST_PROTOCOL`` is on every CPython it supports.

Why 64 bits are enough: the requests table keeps the low 8 bytes of each digest
(``int.from_bytes(digest, "big") & (2**64 - 1)``, vLLM's own conversion for KV
events) as uint64. Any 64 bits of sha256 are uniformly distributed, so among
``n`` distinct blocks the chance of any collision is about ``n**2 / 2**65``:
below 3e-4 for 100 million distinct blocks, far more than a day of traffic
holds. A collision would at worst let the simulator count one spurious block
hit; it cannot corrupt anything else. The 64-bit value also cannot be reversed
to tokens any more than the full digest can; a secret ``hash_salt`` also stops
anyone from confirming a guessed prompt (a known system prompt) by hashing it.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

DEFAULT_BLOCK_SIZE = 16  # vLLM's default KV block size on GPUs
DEFAULT_SEED = "0"  # vLLM's NONE_HASH seed when PYTHONHASHSEED=0
PICKLE_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL on CPython 3.8 - 3.14


@lru_cache(maxsize=8)
def none_hash(seed: str = DEFAULT_SEED) -> bytes:
    """The parent hash of every first block (vLLM's ``NONE_HASH`` for a given seed)."""
    return hashlib.sha256(pickle.dumps(seed, protocol=PICKLE_PROTOCOL)).digest()


def _extra_keys(salts: Sequence[str]) -> tuple[str, ...] | None:
    keys = tuple(s for s in salts if s)
    return keys or None


def block_digests(
    token_ids: Sequence[int] | np.ndarray,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    cache_salt: str = "",
    hash_salt: str = "",
    seed: str = DEFAULT_SEED,
) -> list[bytes]:
    """The 32-byte chained sha256 digest of every full block of ``token_ids``.

    Args:
        token_ids: the prompt's token ids (Python ints; numpy integers hash differently
            under pickle and are converted).
        block_size: tokens per block (> 0).
        cache_salt: the request's own ``cache_salt`` (vLLM semantics), first block only.
        hash_salt: tracereplay's ingest salt, also first block only, after ``cache_salt``.
        seed: seed of the first block's parent hash.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    ids = token_ids.tolist() if isinstance(token_ids, np.ndarray) else list(token_ids)
    n_full = len(ids) // block_size
    out: list[bytes] = []
    if n_full == 0:
        return out
    dumps = pickle.dumps
    sha = hashlib.sha256
    parent = none_hash(seed)
    extra = _extra_keys((cache_salt, hash_salt))
    for b in range(n_full):
        block = tuple(ids[b * block_size : (b + 1) * block_size])
        parent = sha(dumps((parent, block, extra if b == 0 else None), PICKLE_PROTOCOL)).digest()
        out.append(parent)
    return out


def digests_to_uint64(digests: Sequence[bytes]) -> np.ndarray:
    """The low 64 bits (last 8 bytes, big-endian) of each 32-byte digest, as uint64."""
    if not digests:
        return np.zeros(0, dtype=np.uint64)
    buf = np.frombuffer(b"".join(digests), dtype=">u8").reshape(len(digests), 4)
    return buf[:, 3].astype(np.uint64)


def prefix_hashes(
    token_ids: Sequence[int] | np.ndarray,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    cache_salt: str = "",
    hash_salt: str = "",
    seed: str = DEFAULT_SEED,
) -> np.ndarray:
    """Chained block hashes of ``token_ids`` as uint64, one per full block.

    See the module docstring for the byte layout and which vLLM settings it matches.
    """
    return digests_to_uint64(
        block_digests(token_ids, block_size, cache_salt=cache_salt, hash_salt=hash_salt, seed=seed)
    )
