"""The knobs that sweeps and capacity searches turn, named as each policy names them.

- **concurrency cap**: how many requests a replica runs at once. vLLM, Orca and
  Sarathi-Serve call it ``max_num_seqs``, SGLang ``max_running_requests``,
  static batching (and TGI) ``max_batch_size``.
- **rate**: requests per second; a trace is time-scaled to it (scenario key ``rate``).
- **replicas**: engine replicas behind the router.
- **scheduler overlap** (axis ``sched_overlap``): whether the engine schedules the next
  step while the GPU runs this one (docs/replay.md, "Scheduler CPU time"): vLLM's
  ``async_scheduling``, SGLang's ``overlap_schedule``; the other engines are synchronous.
- **swap space** (axis ``swap_space_gb``): GiB of host memory per GPU for swapped KV,
  vLLM V0's ``--swap-space`` (docs/replay.md, "Swap preemption"); only with
  ``preemption_mode = "swap"``, on the ``vllm`` policy.
- **speculation** (axes ``spec_num_tokens``, ``spec_acceptance``): the draft tokens per
  step (k) and their acceptance rate of the scenario's ``[speculative]`` table
  (docs/replay.md, "Speculative decoding"), on the ``vllm`` policy.
"""

from __future__ import annotations

from pipeline.errors import ScenarioError
from pipeline.sim import swap
from pipeline.sim.policies import POLICIES
from pipeline.sim.sched_cpu import OVERLAP_KEYS

# policy -> the parameter that caps its running requests
CONCURRENCY_KNOBS = {
    "static": "max_batch_size",
    "orca": "max_num_seqs",
    "vllm": "max_num_seqs",
    "sarathi": "max_num_seqs",
    "sglang": "max_running_requests",
    "tgi": "max_batch_size",
}
# NOTE: a policy missing from the table above is still served if it has one of
# these parameters, so a newly registered policy works without an edit here.
_FALLBACK = ("max_num_seqs", "max_running_requests", "max_batch_size")


def concurrency_knob(policy: str) -> str:
    """The parameter of ``policy`` that caps how many requests run at once.

    Raises:
        ScenarioError: an unknown policy, or one without a concurrency cap.
    """
    if policy not in POLICIES:
        raise ScenarioError(f"unknown policy {policy!r}; allowed: {', '.join(sorted(POLICIES))}")
    params = POLICIES[policy].param_help()
    knob = CONCURRENCY_KNOBS.get(policy)
    if knob in params:
        return knob
    for name in _FALLBACK:
        if name in params:
            return name
    raise ScenarioError(
        f"policy {policy!r} has no concurrency cap (none of {', '.join(_FALLBACK)} is one "
        "of its parameters)"
    )


def overlap_knob(policy: str) -> str:
    """The boolean parameter of ``policy`` that says whether its scheduler overlaps the GPU.

    Raises:
        ScenarioError: a policy whose engine always schedules synchronously.
    """
    if policy not in OVERLAP_KEYS:
        raise ScenarioError(
            f"policy {policy!r} schedules synchronously (no overlap parameter); the "
            f"sched_overlap axis applies to {', '.join(sorted(OVERLAP_KEYS))}"
        )
    return OVERLAP_KEYS[policy]


SWAP_SPACE_KNOB = "swap_space_gb"
# sweep axis -> the key of the scenario's [speculative] table it sets
SPEC_KNOBS = {"spec_num_tokens": "num_tokens", "spec_acceptance": "acceptance"}


def swap_knob(policy: str) -> str:
    """The parameter of ``policy`` that sizes its host swap space.

    Raises:
        ScenarioError: a policy without swap preemption (every one but vllm).
    """
    if policy != "vllm":
        raise ScenarioError(swap.refusal(policy, SWAP_SPACE_KNOB) or SWAP_SPACE_KNOB)
    return SWAP_SPACE_KNOB


def spec_knob(policy: str, axis: str) -> str:
    """The key of the ``[speculative]`` table that the sweep axis ``axis`` sets.

    Raises:
        ScenarioError: a policy without speculative decoding (every one but vllm), or an
            axis that is not one of ``SPEC_KNOBS``.
    """
    if axis not in SPEC_KNOBS:
        raise ScenarioError(f"unknown speculation axis {axis!r}; allowed: {', '.join(SPEC_KNOBS)}")
    if policy != "vllm":
        raise ScenarioError(
            f"{axis}: speculative decoding is modelled for policy vllm only, not {policy}; put "
            "the axis under [axes.vllm]"
        )
    return SPEC_KNOBS[axis]
