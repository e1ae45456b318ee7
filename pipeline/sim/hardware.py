"""Hardware tables: model shapes, GPU datasheets, efficiencies and serving runtimes.

Four hand-written inputs live in ``profiles/`` next to this module:

    _models.json       model shapes, copied from each model's published config.json
    _gpus.json         GPU datasheet figures (bf16 peak, HBM bandwidth, memory, NVLink)
    _efficiency.json   per GPU: efficiency factors and overheads, each with where it came from
                       (for the default runtime, today's vLLM)
    _runtimes.json     serving runtimes (``--runtime``): how their overheads differ from the
                       default's, and their front end (what a client sees on top)

This module reads them (and a user's own GPU spec file) into frozen records;
``roofline`` turns those into step-cost coefficients, ``profiles`` into profiles.

Units: seconds, bytes, FLOP.
"""

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeline import validation
from pipeline.errors import ConfigError
from pipeline.sim.frontend import Frontend

# the hand-written tables; the shipped profiles derived from them lie beside them
TABLE_DIR = Path(__file__).with_name("profiles")
DEFAULT_RUNTIME = "vllm"

# Other names a GPU is known by.
GPU_ALIASES = {"h100-sxm": "h100-80gb"}


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
    data: dict[str, dict[str, Any]] = json.loads((TABLE_DIR / file_name).read_text())
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
    # the scheduler's CPU time (StepCost sched_cpu_s, sched_cpu_per_seq_s): paid on top of
    # the GPU's step by a synchronous engine, hidden by an asynchronous one
    sched_cpu: dict[str, float] = field(default_factory=dict)


def load_runtimes() -> dict[str, Runtime]:
    out = {}
    for k, v in _load_table("_runtimes.json").items():
        unknown = set(v.get("sched_cpu", {})) - {"sched_cpu_s", "sched_cpu_per_seq_s"}
        if unknown:
            raise ConfigError(f"runtime {k}: unknown sched_cpu term {sorted(unknown)[0]!r}")
        out[k] = Runtime(
            name=k,
            description=str(v["description"]),
            efficiency_add={n: float(x) for n, x in v.get("efficiency_add", {}).items()},
            frontend=Frontend.from_dict(v.get("frontend")),
            source=str(v["source"]),
            sched_cpu={n: float(x) for n, x in v.get("sched_cpu", {}).items()},
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


def without_name(obj: ModelShape | GpuSpec | Efficiency) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name != "name"}


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
    values = {**without_name(base), **overrides}
    values["source"] = f"{base.source} Overridden by {path.name}: {sorted(overrides) or 'nothing'}."
    return gpu, Efficiency(name=gpu_name, **values)
