"""tracereplay: replay LLM serving request logs through scheduler models."""

from pipeline import allocator as _allocator
from pipeline.jit import use_writable_cache as _use_writable_cache

__version__ = "0.1.0"

_use_writable_cache()  # before any compiled (numba) function is defined

_allocator.configure("replay")  # before polars is imported (see pipeline/allocator.py)
