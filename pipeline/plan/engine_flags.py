"""The serving engine's own command line for a scenario: what to set to deploy it.

The scenario keys of the vLLM, SGLang and TGI policies are the engines' own
argument names (``pipeline/sim/policies/*.py`` ``Params``), so each maps to the
flag of the same name: vLLM's ``vllm serve`` engine arguments, SGLang's
``python -m sglang.launch_server`` server arguments, TGI's
``text-generation-launcher`` options. Tensor parallelism is read from the
profile name (``..._tp<N>``); replicas are copies of the command behind a
router, which no engine flag sets. Policies that model a paper's scheduler
(static, orca, sarathi) or the in-process engine have no command: their keys
are the simulator's alone.
"""

from __future__ import annotations

from typing import Any

from pipeline.pricing import gpu_kind
from pipeline.sim.scenario import Scenario

PROGRAMS = {
    "vllm": "vllm serve MODEL",
    "sglang": "python -m sglang.launch_server --model-path MODEL",
    "tgi": "text-generation-launcher --model-id MODEL",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def engine_flags(sc: Scenario) -> list[tuple[str, Any]]:
    """(flag, value) pairs for the scenario's engine; a value of None is a bare switch.
    Empty for a policy without an engine command."""
    p, tp = sc.params, gpu_kind(sc.profile)[1]
    out: list[tuple[str, Any]] = []
    if sc.policy == "vllm":
        out += [(_flag("max_num_seqs"), p.max_num_seqs)]
        out += [(_flag("max_num_batched_tokens"), p.max_num_batched_tokens)]
        out += [(_flag("tensor_parallel_size"), tp)]
        out += [(_flag("gpu_memory_utilization"), sc.gpu_memory_utilization)]
        if not p.enable_chunked_prefill:
            out.append(("--no-enable-chunked-prefill", None))
        if p.long_prefill_token_threshold:
            out.append((_flag("long_prefill_token_threshold"), p.long_prefill_token_threshold))
        if p.scheduling_policy != "fcfs":
            out.append((_flag("scheduling_policy"), p.scheduling_policy))
        if not sc.prefix_caching:
            out.append(("--no-enable-prefix-caching", None))
    elif sc.policy == "sglang":
        if p.max_running_requests > 0:
            out.append((_flag("max_running_requests"), p.max_running_requests))
        out += [(_flag("max_prefill_tokens"), p.max_prefill_tokens)]
        out += [(_flag("chunked_prefill_size"), p.chunked_prefill_size)]
        out += [(_flag("schedule_policy"), p.schedule_policy)]
        if p.schedule_conservativeness != 1.0:
            out.append((_flag("schedule_conservativeness"), p.schedule_conservativeness))
        out.append(("--tp-size", tp))
        if not sc.prefix_caching:
            out.append(("--disable-radix-cache", None))
    elif sc.policy == "tgi":
        out += [(_flag("max_batch_prefill_tokens"), p.max_batch_prefill_tokens)]
        if p.max_batch_total_tokens > 0:
            out.append((_flag("max_batch_total_tokens"), p.max_batch_total_tokens))
        if p.max_batch_size > 0:
            out.append((_flag("max_batch_size"), p.max_batch_size))
        if not p.prefill_chunking:
            out += [(_flag("waiting_served_ratio"), p.waiting_served_ratio)]
            out += [(_flag("max_waiting_tokens"), p.max_waiting_tokens)]
        out.append(("--num-shard", tp))
    return out


def engine_command(sc: Scenario) -> str | None:
    """``vllm serve MODEL --max-num-seqs 64 ... --tensor-parallel-size 1`` (None: the policy
    has no engine command)."""
    program = PROGRAMS.get(sc.policy)
    if program is None:
        return None
    parts = [program]
    for flag, value in engine_flags(sc):
        parts.append(flag if value is None else f"{flag} {value:g}" if isinstance(value, float)
                     else f"{flag} {value}")  # fmt: skip
    return " ".join(parts)


__all__ = ["PROGRAMS", "engine_command", "engine_flags"]
