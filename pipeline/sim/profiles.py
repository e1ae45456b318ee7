"""Default step-cost profiles: an analytic roofline from model shape and GPU datasheet.

Three hand-written inputs live next to this module, in ``profiles/``:

    _models.json       model shapes, copied from each model's published config.json
    _gpus.json         GPU datasheet figures (bf16 peak, HBM bandwidth, memory, NVLink)
    _efficiency.json   per GPU: efficiency factors and overheads, each with where it came from
                       (for the default runtime, today's vLLM)
    _runtimes.json     serving runtimes (``--runtime``): how their overheads differ from the
                       default's, and their front end (what a client sees on top)

``derive_step_cost`` turns (model, gpu, tensor parallel degree, efficiency) into the
coefficients of ``StepCost`` (see ``cost_model``); ``generate_profiles`` writes one readable
JSON profile per entry of ``PROFILE_MATRIX`` into ``profiles/<model>_<gpu>_tp<N>.json``.
Regenerate them with ``python -m pipeline.sim.profiles`` (``--check`` only compares).
docs/cost_model.md explains every term and what the defaults were checked against.

Units: seconds, bytes, FLOP. A "replica" is one engine instance: ``tp`` GPUs together.
"""

import argparse
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipeline import validation
from pipeline.errors import ConfigError, ScenarioError
from pipeline.sim.cost_model import COST_MODEL_VERSION, StepCost
from pipeline.sim.frontend import Frontend

GENERATOR_VERSION = 3
PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "llama-3-8b_h100-80gb_tp1"
DEFAULT_RUNTIME = "vllm"

# GPUs the shipped profiles are generated for (_gpus.json has more, for `profile new`).
PROFILE_GPUS: tuple[str, ...] = ("a100-80gb", "h100-80gb", "h200")
# Other names a GPU is known by.
GPU_ALIASES = {"h100-sxm": "h100-80gb"}

# (model, tensor parallel degrees); every entry is generated for every GPU in PROFILE_GPUS.
# NOTE: llama-3-70b at tp1 does not fit in 80 GB (141 GB of weights): the profile exists so
# that its step time can be compared, and Profile.num_gpu_blocks raises for it.
PROFILE_MATRIX: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("llama-3-8b", (1,)),
    ("llama-3-70b", (1, 2, 4, 8)),
    ("mistral-7b", (1,)),
    ("qwen2.5-32b", (1, 2)),
)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer with gated (SwiGLU / GeGLU) MLP and RMSNorm.

    Dense when ``num_experts`` is 0; otherwise every layer's MLP is a mixture of experts:
    a router, ``num_experts`` experts of width ``moe_intermediate_size`` of which
    ``num_experts_per_tok`` run per token, and optionally one always-on shared expert.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention when < num_heads)
    head_dim: int
    intermediate_size: int  # MLP width; gate, up and down projections
    vocab_size: int
    dtype_bytes: int  # bytes per weight, activation and KV element (2 for bf16)
    max_model_len: int
    tie_word_embeddings: bool  # lm head shares the embedding matrix
    attention_bias: bool  # q, k, v projections carry a bias (Qwen2)
    source: str
    num_experts: int = 0  # routed experts per layer; 0 = dense MLP
    num_experts_per_tok: int = 0  # experts each token runs
    moe_intermediate_size: int = 0  # width of one routed expert
    shared_expert_intermediate_size: int = 0  # always-on shared expert (Qwen2-MoE); 0 = none
    norms_per_layer: int = 2  # RMSNorm weight vectors per layer (Gemma-2: 4)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    kv_dtype_bytes: int = 0  # bytes per KV-cache element; 0 = dtype_bytes

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_bytes(self) -> int:
        return self.kv_dtype_bytes or self.dtype_bytes

    def _layer_params(self, experts: int) -> int:
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.num_experts:
            mlp = h * self.num_experts + experts * 3 * h * self.moe_intermediate_size
            if self.shared_expert_intermediate_size:  # shared expert and its 1-wide gate
                mlp += 3 * h * self.shared_expert_intermediate_size + h
        else:
            mlp = 3 * h * self.intermediate_size
        return attn + mlp + self.norms_per_layer * h

    @property
    def mlp_active_width(self) -> int:
        """MLP intermediate width one token computes (routed experts plus shared expert)."""
        if not self.num_experts:
            return self.intermediate_size
        routed = self.num_experts_per_tok * self.moe_intermediate_size
        return routed + self.shared_expert_intermediate_size

    @property
    def params_per_layer(self) -> int:
        """Resident parameters of one layer (every expert)."""
        return self._layer_params(self.num_experts)

    @property
    def active_params_per_layer(self) -> int:
        """Parameters one token computes with in one layer (its routed experts only)."""
        return self._layer_params(self.num_experts_per_tok)

    @property
    def params_nonembedding(self) -> int:
        """Transformer layers plus the final norm; no embedding table, no lm head."""
        return self.num_layers * self.params_per_layer + self.hidden_size

    @property
    def active_params_nonembedding(self) -> int:
        """Like params_nonembedding, counting only the experts a token runs (MoE)."""
        return self.num_layers * self.active_params_per_layer + self.hidden_size

    @property
    def params_lm_head(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params_total(self) -> int:
        embedding = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else self.params_lm_head
        return self.params_nonembedding + embedding + head


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one GPU."""

    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s
    hbm_bytes_per_s: float  # memory bandwidth
    memory_bytes: int  # memory capacity as the driver reports it
    nvlink_bytes_per_s: float  # GPU-to-GPU bandwidth per GPU, one direction (NVLink, else PCIe)
    source: str
    peak_flops_fp8: float = 0.0  # dense fp8 tensor-core FLOP/s; 0 = no fp8 tensor cores


@dataclass(frozen=True)
class Efficiency:
    """What the datasheet does not say: achieved fractions, overheads, memory reserve."""

    name: str  # the GPU it applies to
    compute_efficiency: float  # achieved / peak FLOP/s on prefill-sized matmuls (MFU-like)
    memory_efficiency: float  # achieved / datasheet HBM bandwidth when streaming weights
    link_efficiency: float  # all-reduce bus bandwidth / NVLink bandwidth
    step_overhead_s: float  # per step: scheduling, input preparation, sampling
    layer_overhead_s: float  # per layer per step: small kernels, launch gaps, tails
    allreduce_latency_s: float  # per all-reduce, independent of its size (tp > 1 only)
    gemm_half_tokens: float  # tokens per step at which the linear layers reach half eff.
    attention_efficiency: float  # achieved / peak FLOP/s of the attention kernels
    overlap: float  # share of min(compute, memory) that does not hide behind the max
    seq_overhead_s: float  # per sequence per step: scheduling, sampling, detokenizing
    seq_layer_overhead_s: float  # per sequence per layer: per-request attention work
    allreduce_hop_latency_s: float  # per ring hop of an all-reduce: 2 (tp - 1) hops
    runtime_reserve_bytes: int  # per GPU: CUDA context, workspaces, CUDA graphs, NCCL
    activation_profile_tokens: int  # tokens of the engine's memory-profiling forward pass
    activation_profile_seqs: int  # sequences whose logits that pass keeps
    source: str
    kv_memory_efficiency: float = 0.0  # achieved / datasheet HBM bandwidth of paged KV reads;
    # 0 = memory_efficiency
    prefill_step_overhead_s: float = 0.0  # per step that computes prompt tokens, on top of a
    # decode step's overheads: mixed steps run piecewise or eagerly, not from one CUDA graph
    prefill_layer_overhead_s: float = 0.0  # ... and per layer of such a step
    fp8_compute_efficiency: float = 0.0  # achieved / peak of fp8 GEMMs; 0 = compute_efficiency
    prefill_seq_overhead_s: float = 0.0  # per prefill chunk of such a step (per-prompt set-up)
    prefill_knee_tokens: float = 2048.0  # prompt tokens in a step past which ...
    prefill_knee_s_per_token: float = 0.0  # ... each costs this much more (0: no knee)

    @property
    def fp8_gemm_efficiency(self) -> float:
        return self.gemm_efficiency(True)

    @property
    def kv_efficiency(self) -> float:
        return self.kv_memory_efficiency or self.memory_efficiency

    def gemm_efficiency(self, fp8: bool) -> float:
        """The linear layers' efficiency at the peak they run at (fp8 or bf16)."""
        return (
            (self.fp8_compute_efficiency or self.compute_efficiency)
            if fp8
            else (self.compute_efficiency)
        )


def _load_table(file_name: str) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads((PROFILE_DIR / file_name).read_text())
    return data


def load_models() -> dict[str, ModelShape]:
    return {k: ModelShape(name=k, **v) for k, v in _load_table("_models.json").items()}


def load_gpus() -> dict[str, GpuSpec]:
    return {k: GpuSpec(name=k, **v) for k, v in _load_table("_gpus.json").items()}


def load_efficiencies() -> dict[str, Efficiency]:
    return {k: Efficiency(name=k, **v) for k, v in _load_table("_efficiency.json").items()}


@dataclass(frozen=True)
class Runtime:
    """A serving runtime: how its overheads differ from the default runtime's (which the
    GPU efficiencies describe), and its front end."""

    name: str
    description: str
    efficiency_add: dict[str, float]  # Efficiency field -> seconds added to the GPU's value
    frontend: Frontend
    source: str


def load_runtimes() -> dict[str, Runtime]:
    out = {}
    for k, v in _load_table("_runtimes.json").items():
        out[k] = Runtime(
            name=k,
            description=str(v["description"]),
            efficiency_add={n: float(x) for n, x in v.get("efficiency_add", {}).items()},
            frontend=Frontend.from_dict(v.get("frontend")),
            source=str(v["source"]),
        )
    return out


def resolve_runtime(name: str) -> Runtime:
    """A runtime of _runtimes.json by name.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    runtimes = load_runtimes()
    if name not in runtimes:
        raise ConfigError(
            f"--runtime {name!r}: unknown runtime; built in: {', '.join(sorted(runtimes))}"
        )
    return runtimes[name]


def with_runtime(eff: Efficiency, runtime: Runtime) -> Efficiency:
    """The GPU's efficiencies with the runtime's overheads added."""
    known = {f.name for f in fields(Efficiency)}
    values = {f.name: getattr(eff, f.name) for f in fields(Efficiency)}
    for field_name, add in runtime.efficiency_add.items():
        if field_name not in known or isinstance(values[field_name], str):
            raise ConfigError(f"runtime {runtime.name}: unknown efficiency field {field_name!r}")
        values[field_name] = values[field_name] + add
    return Efficiency(**values)


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


def _without_name(obj: ModelShape | GpuSpec | Efficiency) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name != "name"}


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
    fe = runtime.frontend if frontend else Frontend()
    return {
        "name": name,
        "cost_model_version": COST_MODEL_VERSION,
        "provenance": provenance,
        "model": {"name": model.name, **_without_name(model)},
        "gpu": {"name": gpu.name, **_without_name(gpu)},
        "tensor_parallel": tp,
        "runtime": {"name": runtime.name, "description": runtime.description},
        "efficiency": _without_name(eff),
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


def build_profile(model_name: str, gpu_name: str, tp: int) -> dict[str, Any]:
    """A shipped profile: a model of _models.json on a GPU of _gpus.json."""
    provenance = {
        "method": "analytic roofline",
        "generator": "pipeline.sim.profiles",
        "generator_version": GENERATOR_VERSION,
    }
    return profile_dict(
        load_models()[model_name],
        load_gpus()[gpu_name],
        tp,
        load_efficiencies()[gpu_name],
        profile_name(model_name, gpu_name, tp),
        provenance,
    )


def expected_profiles() -> dict[str, dict[str, Any]]:
    """Every profile of PROFILE_MATRIX on every GPU, by name."""
    out = {}
    for gpu_name in PROFILE_GPUS:
        for model_name, tps in PROFILE_MATRIX:
            for tp in tps:
                profile = build_profile(model_name, gpu_name, tp)
                out[profile["name"]] = profile
    return out


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=2) + "\n"


def generate_profiles(out_dir: Path = PROFILE_DIR) -> list[Path]:
    """Write every profile JSON into out_dir and remove profiles no longer generated."""
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = expected_profiles()
    for stale in out_dir.glob("*.json"):
        if not stale.name.startswith("_") and stale.stem not in expected:
            stale.unlink()
    written = []
    for name, profile in sorted(expected.items()):
        path = out_dir / f"{name}.json"
        path.write_text(render(profile))
        written.append(path)
    return written


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object.

    Raises:
        ConfigError: unreadable, not JSON (the line is named) or not an object.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file; give a JSON file") from None
    data = validation.loads_json(text, str(path))  # nesting bounded, numbers finite
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def resolve_gpu(name: str) -> tuple[GpuSpec, Efficiency]:
    """A GPU of the built-in table (_gpus.json) by name or alias, with its efficiencies.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    key = GPU_ALIASES.get(name, name)
    gpus = load_gpus()
    if key not in gpus:
        known = sorted([*gpus, *GPU_ALIASES])
        raise ConfigError(
            f"--gpu {name!r}: unknown GPU; built in: {', '.join(known)} "
            "(or describe yours with --gpu-spec FILE.json)"
        )
    return gpus[key], load_efficiencies()[key]


# A GPU spec's figures: (lowest, highest, lowest excluded). The highest are far beyond any
# GPU made (1 EFLOP/s, 1 PB/s, 1 PiB) but keep every derived time finite; peak_flops and
# hbm_bytes_per_s divide, so they must be > 0; nvlink_bytes_per_s and peak_flops_fp8 may
# be 0 (no link at TP 1, no fp8 tensor cores).
GPU_SPEC_RANGES: dict[str, tuple[float, float, bool]] = {
    "peak_flops": (0.0, 1e18, True),
    "hbm_bytes_per_s": (0.0, 1e15, True),
    "memory_bytes": (1.0, float(2**50), False),
    "nvlink_bytes_per_s": (0.0, 1e15, False),
    "peak_flops_fp8": (0.0, 1e18, False),
}
# efficiency overrides: fractions in (0, 1] where they divide; everything else >= 0
EFFICIENCY_RANGES: dict[str, tuple[float, float, bool]] = {
    "compute_efficiency": (0.0, 1.0, True),
    "memory_efficiency": (0.0, 1.0, True),
    "link_efficiency": (0.0, 1.0, True),
    "attention_efficiency": (0.0, 1.0, True),
    "overlap": (0.0, 1.0, False),
    "kv_memory_efficiency": (0.0, 1.0, False),
    "fp8_compute_efficiency": (0.0, 1.0, False),
}


def read_gpu_spec(path: Path, name: str | None = None) -> tuple[GpuSpec, Efficiency]:
    """A GPU described in a JSON file: the GpuSpec fields (peak_flops, hbm_bytes_per_s,
    memory_bytes, nvlink_bytes_per_s; optional peak_flops_fp8, name, source), plus optional
    ``like`` (a built-in GPU whose efficiencies to start from; default h100-80gb) and
    ``efficiency`` (an object overriding some of them).

    Raises:
        ConfigError: unreadable file, bad JSON, a missing, unknown or non-numeric key.
    """
    path = Path(path)
    data = read_json_object(path)
    spec_keys = {f.name for f in fields(GpuSpec)}
    required = ("peak_flops", "hbm_bytes_per_s", "memory_bytes", "nvlink_bytes_per_s")
    for key in required:
        if key not in data:
            raise ConfigError(f"{path}: missing key {key!r} (needs {', '.join(required)})")
    unknown = sorted(set(data) - spec_keys - {"like", "efficiency"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {unknown[0]!r}; allowed: "
            + ", ".join(sorted(spec_keys | {"like", "efficiency"}))
        )
    where = str(path)
    num = {
        key: validation.finite_float(
            data.get(key, 0), f"key {key!r}", where, lo=lo, hi=hi, lo_open=lo_open
        )
        for key, (lo, hi, lo_open) in GPU_SPEC_RANGES.items()
    }
    for key in ("name", "source", "like"):
        if key in data:
            validation.string(data[key], f"key {key!r}", where, nonempty=True)
    gpu_name = str(name or data.get("name") or path.stem)
    gpu = GpuSpec(
        name=gpu_name,
        peak_flops=num["peak_flops"],
        hbm_bytes_per_s=num["hbm_bytes_per_s"],
        memory_bytes=int(num["memory_bytes"]),
        nvlink_bytes_per_s=num["nvlink_bytes_per_s"],
        peak_flops_fp8=num["peak_flops_fp8"],
        source=str(data.get("source", f"user GPU spec {path.name}")),
    )
    _, base = resolve_gpu(str(data.get("like", "h100-80gb")))
    overrides = data.get("efficiency", {})
    eff_keys = {f.name for f in fields(Efficiency)} - {"name", "source"}
    if not isinstance(overrides, dict) or set(overrides) - eff_keys:
        raise ConfigError(f"{path}: efficiency must be an object of: {', '.join(sorted(eff_keys))}")
    for key, value in overrides.items():
        lo, hi, lo_open = EFFICIENCY_RANGES.get(key, (0.0, 1e9, False))
        v = validation.finite_float(
            value, f"key 'efficiency.{key}'", where, lo=lo, hi=hi, lo_open=lo_open
        )
        overrides[key] = int(v) if isinstance(getattr(base, key), int) else v
    values = {**_without_name(base), **overrides}
    values["source"] = f"{base.source} Overridden by {path.name}: {sorted(overrides) or 'nothing'}."
    return gpu, Efficiency(name=gpu_name, **values)


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


def describe_profiles() -> list[dict[str, Any]]:
    """One row per shipped profile: name, model, gpu, tp, cost model version, method."""
    rows = []
    for name in list_profiles():
        data = json.loads((PROFILE_DIR / f"{name}.json").read_text())
        rows.append(
            {
                "name": name,
                "model": data.get("model", {}).get("name", "?"),
                "gpu": data.get("gpu", {}).get("name", "?"),
                "tp": data.get("tensor_parallel", "?"),
                "cost_model_version": data.get("cost_model_version", 1),
                "method": data.get("provenance", {}).get("method", "?"),
            }
        )
    return rows


@dataclass(frozen=True)
class Profile:
    """A step-cost profile plus what the simulator needs to size one replica's KV cache."""

    name: str  # "llama-3-8b_h100-80gb_tp1"
    cost: StepCost
    kv_bytes_per_token: int  # per replica (all layers, K+V, all TP ranks together)
    weight_bytes: int  # per replica
    gpu_memory_bytes: int  # per replica (per-GPU memory * tp)
    max_model_len: int
    reserve_bytes: int = 0  # per replica: runtime reserve + profiling-pass activations
    cost_model_version: int = 1  # 1: no seq_s / flop_tokens_half / overlap (they are 0)
    frontend: Frontend = Frontend()  # what a client sees on top of the engine (0: none given)

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        """KV-cache blocks the replica can hold, as vLLM sizes its cache.

        (gpu_memory_bytes * utilization - weight_bytes - reserve_bytes)
            // (kv_bytes_per_token * block_size)

        ``reserve_bytes`` is, per GPU, the runtime reserve (CUDA context, cuBLAS and NCCL
        workspaces, CUDA graph pool; 1 GiB by default) plus the peak activations of a
        forward pass over 8,192 tokens (see ``reserve_bytes_per_gpu``), times tp.

        Raises:
            ValueError: bad arguments, or weights plus reserve leave no room for one block.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        budget = int(self.gpu_memory_bytes * gpu_memory_utilization)
        free = budget - self.weight_bytes - self.reserve_bytes
        block_bytes = self.kv_bytes_per_token * block_size
        if free < block_bytes:
            gib = 2**30
            raise ValueError(
                f"{self.name}: weights ({self.weight_bytes / gib:.1f} GiB) plus reserve "
                f"({self.reserve_bytes / gib:.1f} GiB) leave no room for a KV block in "
                f"{gpu_memory_utilization:.0%} of {self.gpu_memory_bytes / gib:.1f} GiB; "
                "use more tensor-parallel GPUs or a higher gpu_memory_utilization"
            )
        return free // block_bytes


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json") if not p.name.startswith("_"))


# a profile's memory section: bytes up to 1 PiB x 1024 GPUs, lengths the state holds
PROFILE_MEMORY_RANGES: dict[str, tuple[int, int]] = {
    "kv_bytes_per_token": (1, 2**60),
    "weight_bytes": (0, 2**60),
    "gpu_memory_bytes": (1, 2**60),
    "max_model_len": (2, validation.MAX_COUNT),
    "reserve_bytes": (0, 2**60),
}


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name, or any profile JSON file by path.

    Raises:
        ScenarioError: unknown name (the message lists the shipped ones), or a file that is
            not a profile (the message names the file and the missing key).
    """
    text = str(name_or_path)
    if text in list_profiles():
        path = PROFILE_DIR / f"{text}.json"
    else:
        path = Path(text)
        if not path.is_file():
            raise ScenarioError(
                f"unknown profile {text!r}: not a file; shipped profiles are "
                + ", ".join(list_profiles())
            )
    try:
        data = validation.loads_json(path.read_text(), f"profile {path}", error=ScenarioError)
        if not isinstance(data, dict):
            raise ScenarioError(f"profile {path}: not a JSON object; is it a profile JSON?")
        version = validation.integer(
            data.get("cost_model_version", 1),
            "cost_model_version",
            f"profile {path}",
            lo=None,
            hi=None,
            integral_floats=True,
            error=ScenarioError,
        )
        if not 1 <= version <= COST_MODEL_VERSION:
            raise ScenarioError(
                f"profile {path}: cost_model_version {version} is not known to this version "
                f"(it reads 1 to {COST_MODEL_VERSION}); upgrade tracereplay"
            )
        memory = data["memory"]
        if not isinstance(memory, dict) or not isinstance(data["coefficients"], dict):
            raise ScenarioError(f"profile {path}: memory and coefficients must be objects")
        sizes = {
            key: validation.integer(
                memory[key] if key != "reserve_bytes" else memory.get(key, 0),
                f"memory.{key}",
                f"profile {path}",
                lo=lo,
                hi=hi,
                integral_floats=True,
                error=ScenarioError,
            )
            for key, (lo, hi) in PROFILE_MEMORY_RANGES.items()
        }
        return Profile(
            name=str(data.get("name", path.stem)),
            cost=StepCost.from_dict(data["coefficients"]),
            kv_bytes_per_token=sizes["kv_bytes_per_token"],
            weight_bytes=sizes["weight_bytes"],
            gpu_memory_bytes=sizes["gpu_memory_bytes"],
            max_model_len=sizes["max_model_len"],
            reserve_bytes=sizes["reserve_bytes"],
            cost_model_version=version,
            frontend=Frontend.from_dict(data.get("frontend")),
        )
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"profile {path}: not valid JSON ({exc})") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"profile {path}: missing or bad key {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.sim.profiles",
        description="Regenerate the analytic step-cost profiles from the JSON inputs.",
    )
    parser.add_argument(
        "--check", action="store_true", help="Only compare; exit 1 if a file is out of date."
    )
    args = parser.parse_args(argv)
    if args.check:
        expected = expected_profiles()
        stale = [n for n, p in expected.items() if _read(PROFILE_DIR / f"{n}.json") != render(p)]
        extra = sorted(set(list_profiles()) - set(expected))
        for name in sorted(stale) + extra:
            print(f"out of date: {name}", file=sys.stderr)
        return 1 if stale or extra else 0
    written = generate_profiles()
    print(f"wrote {len(written)} profiles to {PROFILE_DIR}")
    return 0


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


if __name__ == "__main__":
    raise SystemExit(main())
