"""The analytic roofline: a model's step-cost coefficients from its shape and a GPU's datasheet.

``derive_step_cost`` turns (model, gpu, tensor parallel degree, efficiency) into the
coefficients of ``StepCost`` (see ``cost_model``); ``profile_dict`` wraps them, with the
memory a replica needs, into the JSON object of one profile, and ``new_profile`` builds
one for any model shape on any GPU (``tracereplay profile new``).
docs/cost_model.md explains every term and what the defaults were checked against.

Units: seconds, bytes, FLOP. A "replica" is one engine instance: ``tp`` GPUs together.
"""

from dataclasses import replace
from typing import Any

from pipeline.sim.cost_model import COST_MODEL_VERSION, StepCost
from pipeline.sim.frontend import Frontend
from pipeline.sim.hardware import (
    DEFAULT_RUNTIME,
    Efficiency,
    GpuSpec,
    ModelShape,
    Runtime,
    resolve_runtime,
    with_runtime,
    without_name,
)

GENERATOR_VERSION = 3


def kv_bytes_per_token(model: ModelShape, tp: int) -> int:
    """K and V of one token, all layers, all TP ranks together.

    Each rank holds num_kv_heads / tp heads; when tp exceeds num_kv_heads the engine
    replicates heads so that every rank holds one.
    """
    kv_heads = max(model.num_kv_heads, tp)
    return 2 * model.num_layers * kv_heads * model.head_dim * model.kv_bytes


def weight_bytes(model: ModelShape) -> int:
    """Resident weights of one replica (all ranks together)."""
    return model.params_total * model.dtype_bytes


def activation_bytes_per_token(model: ModelShape, tp: int) -> int:
    """HBM traffic per token per rank outside the weights and the KV reads.

    Per layer: about 10 hidden-sized vectors (two norms, residual adds, attention input and
    output), the q/k/v projections written and read, and the MLP intermediate (gate and up
    written and read, activation written and read: 6 intermediate-sized vectors); plus the
    token's own K and V written to the cache.
    """
    per_layer = (
        10 * model.hidden_size
        + 2 * (model.q_dim + 2 * model.kv_dim) // tp
        + 6 * model.mlp_active_width // tp
    )
    kv_write = kv_bytes_per_token(model, tp) // tp
    return model.num_layers * per_layer * model.dtype_bytes + kv_write


def reserve_bytes_per_gpu(model: ModelShape, tp: int, eff: Efficiency) -> int:
    """Memory a GPU keeps outside weights and KV cache.

    The runtime reserve (CUDA context, cuBLAS/NCCL workspaces, CUDA graph pool) plus the
    peak activations of the engine's profiling pass over ``activation_profile_tokens``
    tokens: the MLP gate/up output and activation (3 intermediate-sized vectors per token)
    and about 4 hidden-sized vectors per token, plus fp32 logits for
    ``activation_profile_seqs`` sequences. This mirrors how vLLM sizes its KV cache.
    """
    tokens = eff.activation_profile_tokens
    per_token = (3 * model.mlp_active_width // tp + 4 * model.hidden_size) * model.dtype_bytes
    logits = eff.activation_profile_seqs * (model.vocab_size // tp) * 4
    return eff.runtime_reserve_bytes + tokens * per_token + logits


def runs_fp8(model: ModelShape, gpu: GpuSpec) -> bool:
    """Whether the model's matmuls run on fp8 tensor cores: fp8 weights on a GPU that has
    them (elsewhere fp8 weights are dequantized to bf16 on the fly)."""
    return model.dtype_bytes == 1 and gpu.peak_flops_fp8 > 0


def peak_flops(model: ModelShape, gpu: GpuSpec) -> float:
    """Dense tensor-core FLOP/s the model's matmuls run at: fp8 when ``runs_fp8``, else bf16."""
    return gpu.peak_flops_fp8 if runs_fp8(model, gpu) else gpu.peak_flops


def allreduce_latency_s(eff: Efficiency, tp: int) -> float:
    """Size-independent latency of one all-reduce over tp GPUs: a base plus one hop latency
    per step of a ring all-reduce (2 (tp - 1) steps); 0 at tp 1."""
    if tp <= 1:
        return 0.0
    return eff.allreduce_latency_s + eff.allreduce_hop_latency_s * 2 * (tp - 1)


def derive_step_cost(model: ModelShape, gpu: GpuSpec, tp: int, eff: Efficiency) -> StepCost:
    """The StepCost coefficients (cost model v2) of ``model`` on ``tp`` GPUs of kind ``gpu``.

    With peak = peak_flops(model, gpu), bw = gpu.hbm_bytes_per_s, link =
    gpu.nvlink_bytes_per_s, and for an MoE model the *active* parameters (router, the
    experts a token runs, the shared expert) in compute but *every* expert in memory:

    flop_s_per_token   = 2 * (active_params_nonembedding + params_lm_head) / (tp peak eff_c)
                         two FLOP per weight per token; every layer and the lm head
    flop_tokens_half   = gemm_half_tokens: efficiency(T) = T / (T + half) for T tokens
    flop_s_per_attn    = 4 * layers * num_heads * head_dim / (tp * peak * eff_attn)
                         QK^T and AV: 2 * head_dim FLOP each, per head, per (query, key) pair,
                         at the attention kernels' own efficiency
    mem_s_weights      = (params_nonembedding + params_lm_head) * dtype / (tp * bw * eff_m)
                         every weight read once per step (the embedding table is gathered by
                         row, which is negligible)
    mem_s_per_kv_token = kv_bytes_per_token / (tp * bw * eff_m)
    mem_s_per_token    = activation_bytes_per_token / (bw * eff_m)   (already per rank)
    fixed_s            = step_overhead_s + layers * layer_overhead_s
    seq_s              = seq_overhead_s + layers * seq_layer_overhead_s
    comm_s_fixed       = 2 * layers * (allreduce_latency_s + allreduce_hop_latency_s
                         * 2 (tp - 1))                                       (0 at tp 1)
    comm_s_per_token   = 2 * layers * hidden * dtype * 2 (tp - 1) / tp / (link * eff_link)
                         two all-reduces per layer (after attention and after the MLP) of
                         one hidden vector per token; a ring all-reduce moves 2 (tp - 1) / tp
                         of the buffer over each GPU's link
    overlap            = overlap

    Raises:
        ValueError: tp < 1, or an efficiency out of range.
    """
    if tp < 1:
        raise ValueError(f"tensor parallel degree must be >= 1, got {tp}")
    for f in (
        "compute_efficiency",
        "fp8_gemm_efficiency",
        "memory_efficiency",
        "link_efficiency",
        "attention_efficiency",
        "kv_efficiency",
    ):
        if not 0 < getattr(eff, f) <= 1:
            raise ValueError(f"{eff.name}: {f} must be in (0, 1], got {getattr(eff, f)}")
    if not 0 <= eff.overlap <= 1:
        raise ValueError(f"{eff.name}: overlap must be in [0, 1], got {eff.overlap}")
    peak = tp * peak_flops(model, gpu)
    flops = peak * eff.gemm_efficiency(runs_fp8(model, gpu))
    bandwidth = gpu.hbm_bytes_per_s * eff.memory_efficiency
    matmul_params = model.params_nonembedding + model.params_lm_head
    layers = model.num_layers
    if tp > 1:
        ring = 2 * (tp - 1) / tp
        per_token_bytes = 2 * layers * model.hidden_size * model.dtype_bytes * ring
        comm_fixed = 2 * layers * allreduce_latency_s(eff, tp)
        comm_per_token = per_token_bytes / (gpu.nvlink_bytes_per_s * eff.link_efficiency)
    else:
        comm_fixed = comm_per_token = 0.0
    return StepCost(
        fixed_s=eff.step_overhead_s + layers * eff.layer_overhead_s,
        flop_s_per_token=2 * model.active_params_nonembedding / flops,
        flop_s_per_attn=4
        * layers
        * model.num_heads
        * model.head_dim
        / (peak * eff.attention_efficiency),
        mem_s_weights=matmul_params * model.dtype_bytes / (tp * bandwidth),
        mem_s_per_kv_token=kv_bytes_per_token(model, tp)
        / (tp * gpu.hbm_bytes_per_s * eff.kv_efficiency),
        mem_s_per_token=activation_bytes_per_token(model, tp) / bandwidth,
        comm_s_fixed=comm_fixed,
        comm_s_per_token=comm_per_token,
        seq_s=eff.seq_overhead_s + layers * eff.seq_layer_overhead_s,
        flop_tokens_half=eff.gemm_half_tokens,
        overlap=eff.overlap,
        prefill_fixed_s=eff.prefill_step_overhead_s + layers * eff.prefill_layer_overhead_s,
        flop_s_per_seq=2 * model.params_lm_head / flops,
        separate_attention=1.0,
        prefill_seq_s=eff.prefill_seq_overhead_s,
        prefill_knee_tokens=eff.prefill_knee_tokens,
        prefill_knee_s=eff.prefill_knee_s_per_token,
    )


def profile_name(model: str, gpu: str, tp: int) -> str:
    return f"{model}_{gpu}_tp{tp}"


def profile_dict(
    model: ModelShape,
    gpu: GpuSpec,
    tp: int,
    eff: Efficiency,
    name: str,
    provenance: dict[str, Any],
    runtime: Runtime | None = None,
    frontend: bool = True,
) -> dict[str, Any]:
    """The JSON object of one analytic profile: inputs, coefficients, memory, provenance.

    ``eff`` is the GPU's (the default runtime's); ``runtime`` (default: the default
    runtime) adds its overheads and gives the front end, left at 0 with ``frontend=False``
    (an engine timed at its core, in process).
    """
    runtime = runtime or resolve_runtime(DEFAULT_RUNTIME)
    eff = with_runtime(eff, runtime)
    cost = derive_step_cost(model, gpu, tp, eff)
    if runtime.sched_cpu:  # the scheduler's CPU time is the runtime's, not the GPU's
        cost = replace(cost, **runtime.sched_cpu)
    fe = runtime.frontend if frontend else Frontend()
    return {
        "name": name,
        "cost_model_version": COST_MODEL_VERSION,
        "provenance": provenance,
        "model": {"name": model.name, **without_name(model)},
        "gpu": {"name": gpu.name, **without_name(gpu)},
        "tensor_parallel": tp,
        "runtime": {"name": runtime.name, "description": runtime.description},
        "efficiency": without_name(eff),
        "coefficients": cost.to_dict(),
        "frontend": {
            **fe.to_dict(),
            "source": runtime.source if frontend else "none: times taken at the engine core",
        },
        "memory": {
            "kv_bytes_per_token": kv_bytes_per_token(model, tp),
            "weight_bytes": weight_bytes(model),
            "gpu_memory_bytes": gpu.memory_bytes * tp,
            "reserve_bytes": reserve_bytes_per_gpu(model, tp, eff) * tp,
            "max_model_len": model.max_model_len,
        },
        "derived": {
            "params_total": model.params_total,
            "params_nonembedding": model.params_nonembedding,
            "active_params_nonembedding": model.active_params_nonembedding,
            "flop_per_token": 2 * (model.active_params_nonembedding + model.params_lm_head),
        },
    }


def new_profile(
    model: ModelShape,
    gpu: GpuSpec,
    eff: Efficiency,
    tp: int,
    runtime: Runtime | None = None,
    frontend: bool = True,
) -> dict[str, Any]:
    """An analytic v3 profile for any model shape on any GPU (``tracereplay profile new``)."""
    runtime = runtime or resolve_runtime(DEFAULT_RUNTIME)
    provenance = {
        "method": "analytic roofline",
        "generator": "tracereplay profile new",
        "generator_version": GENERATOR_VERSION,
        "model_source": model.source,
        "gpu_source": gpu.source,
        "runtime": runtime.name,
        "runtime_source": runtime.source,
    }
    name = profile_name(model.name.replace("/", "_").lower(), gpu.name, tp)
    if runtime.name != DEFAULT_RUNTIME:
        name = f"{name}_{runtime.name}"
    return profile_dict(model, gpu, tp, eff, name, provenance, runtime, frontend)
