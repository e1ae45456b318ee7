"""Scheduling policies: one module each, one registry.

``POLICIES`` maps a policy name to its description (parameters, validation,
packing for the compiled loop); the CLI and the scenario loader read this dict.
The compiled loop reaches each module's ``schedule`` through ``_schedule`` in
``pipeline.sim.loop``, which dispatches on the policy's ``CODE``: a new policy
is added there too (numba compiles no table of functions).

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

from pipeline.sim.policies import orca, sarathi, sglang, static, tgi, transformers, vllm
from pipeline.sim.policies.base import Memory, Policy

POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        static.POLICY,
        orca.POLICY,
        vllm.POLICY,
        sarathi.POLICY,
        sglang.POLICY,
        tgi.POLICY,
        transformers.POLICY,
    )
}

__all__ = ["POLICIES", "Memory", "Policy"]
