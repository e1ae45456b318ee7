"""Scheduling policies: one module each, one registry.

``MODULES`` lists the policy modules, one line each; ``POLICIES`` maps a
policy name to its description (parameters, traits, validation, packing for
the compiled loop), which the CLI and the scenario loader read. What a module
must provide is the contract in ``base.py``; ``dispatch.py`` builds the
loop's calls of the policies' kernels from this list. Adding a policy is a
new module here and one line in ``_NAMES`` (or, from outside the package,
``register(module)`` before the first replay).

Policies (see each module's docstring for its exact rules):

- ``static``  request-level batching (FasterTransformer; Triton max queue delay)
- ``orca``    iteration-level batching, whole prompts, max-length reservation
- ``vllm``    vLLM V1: token budget, chunked prefill, paged KV, recompute preemption,
              prefix caching, fcfs or priority scheduling
- ``sarathi`` Sarathi-Serve stall-free batching with chunk_size
- ``sglang``  SGLang: prefill-first, conservative admission (new_token_ratio),
              retraction, radix cache, schedule policies (fcfs, lpm, dfs-weight, lof, random)
- ``tgi``     TGI v3: full-lifetime reservation, no preemption, waiting_served_ratio,
              max_waiting_tokens, prefill chunking, radix prefix cache
- ``transformers`` transformers' continuous batching: fifo or prefill_first, max_batch_tokens,
              safety margin, soft reset of starved requests
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.sim.policies.base import Memory, Policy

# the registry: one line per policy module of this package
_NAMES = ("static", "orca", "vllm", "sarathi", "sglang", "tgi", "transformers")

MODULES: list[ModuleType] = [importlib.import_module(f"{__name__}.{n}") for n in _NAMES]
POLICIES: dict[str, Policy] = {m.POLICY.name: m.POLICY for m in MODULES}


def by_code(code: int) -> Policy:
    """The policy whose kernels run under dispatch code ``code``."""
    return next(m.POLICY for m in MODULES if m.POLICY.code == code)


def register(module: ModuleType) -> None:
    """Add a policy module from outside the package (a plugin, a test) to the registry.

    It must follow the contract of ``base.py``, with a name and a code no
    registered policy has. Call it before the first replay of the process: the
    compiled loop calls the policies it was compiled with.
    """
    from pipeline import jit
    from pipeline.sim.policies import dispatch

    pol = module.POLICY
    if pol.name in POLICIES or any(m.POLICY.code == pol.code for m in MODULES):
        raise ValueError(f"a policy named {pol.name!r} or with code {pol.code} is registered")
    if jit.loop_compiled():
        raise RuntimeError("register policies before the first replay of the process")
    MODULES.append(module)
    POLICIES[pol.name] = pol
    jit.add_source(module)
    dispatch.rebuild()


__all__ = ["MODULES", "POLICIES", "Memory", "Policy", "by_code", "register"]
