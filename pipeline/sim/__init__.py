"""The scheduler simulator: replay requests through an engine's scheduling rules."""

from pipeline import jit

jit.use_digest_cache()  # where numba keeps the compiled simulator (before any is defined)
jit.drop_stale_cache()  # before any compiled function of the simulator is loaded
