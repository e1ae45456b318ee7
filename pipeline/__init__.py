"""tracereplay: replay LLM serving request logs through scheduler models."""

import os as _os

from pipeline.jit import use_writable_cache as _use_writable_cache

__version__ = "0.1.0"

_use_writable_cache()  # before any compiled (numba) function is defined

# NOTE: polars' allocator (jemalloc) keeps freed pages for 0.5 s, then as "muzzy" pages
# (still resident) for 1 s more. A replay frees about 1 GB of them after reading 10M
# requests and at once allocates the simulator's state: a 10M replay peaked at 3.0 GB
# with polars' setting, 2.2 GB with this one (bench/RESULTS.md, Replay memory), at no
# measured cost to ingest. Read when polars is first imported: a setting of the
# user's own wins, and a process that imported polars before us keeps polars'.
_os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:100,muzzy_decay_ms:0")
