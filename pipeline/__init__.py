"""tracereplay: replay LLM serving request logs through scheduler models."""

import os as _os

from pipeline.jit import use_writable_cache as _use_writable_cache

__version__ = "0.1.0"

_use_writable_cache()  # before any compiled (numba) function is defined

# NOTE: polars' allocator (jemalloc) keeps freed pages for 0.5 s, then as "muzzy" pages
# (still resident) for 1 s more. A replay frees about 1 GB of them after reading 10M
# requests and at once allocates the simulator's state: a 10M replay peaked at 3.0 GB
# with polars' setting, 2.2 GB with this one (bench/RESULTS.md, Replay memory). Read
# when polars is first imported; polars writes its own setting into the environment,
# which child processes inherit, so only a decay the user set is left alone.
_POLARS_JEMALLOC = "dirty_decay_ms:500,muzzy_decay_ms:1000"
_OURS = "dirty_decay_ms:100,muzzy_decay_ms:0"
_jemalloc = _os.environ.get("_RJEM_MALLOC_CONF", "")
if "decay_ms" not in _jemalloc.replace(_POLARS_JEMALLOC, ""):  # the last option given wins
    _os.environ["_RJEM_MALLOC_CONF"] = f"{_jemalloc},{_OURS}" if _jemalloc else _OURS
