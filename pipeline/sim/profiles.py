"""Default step-cost profiles: an analytic roofline from model shape and GPU datasheet.

Three hand-written inputs live next to this module, in ``profiles/``:

    _models.json       model shapes, copied from each model's published config.json
    _gpus.json         GPU datasheet figures (bf16 peak, HBM bandwidth, memory, NVLink)
    _efficiency.json   per GPU: efficiency factors and overheads, each with where it came from

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

from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import COST_MODEL_VERSION, StepCost

GENERATOR_VERSION = 1
PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "llama-3-8b_h100-80gb_tp1"

# (model, tensor parallel degrees); every entry is generated for every GPU in _gpus.json.
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
    """A dense decoder-only transformer with gated (SwiGLU) MLP and RMSNorm."""

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

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attn += self.q_dim + 2 * self.kv_dim
        return attn + 3 * h * self.intermediate_size + 2 * h  # + two RMSNorm weights

    @property
    def params_nonembedding(self) -> int:
        """Transformer layers plus the final norm; no embedding table, no lm head."""
        return self.num_layers * self.params_per_layer + self.hidden_size

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
    nvlink_bytes_per_s: float  # NVLink bandwidth per GPU, one direction
    source: str


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
    runtime_reserve_bytes: int  # per GPU: CUDA context, workspaces, CUDA graphs, NCCL
    activation_profile_tokens: int  # tokens of the engine's memory-profiling forward pass
    activation_profile_seqs: int  # sequences whose logits that pass keeps
    source: str


def _load_table(file_name: str) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads((PROFILE_DIR / file_name).read_text())
    return data


def load_models() -> dict[str, ModelShape]:
    return {k: ModelShape(name=k, **v) for k, v in _load_table("_models.json").items()}


def load_gpus() -> dict[str, GpuSpec]:
    return {k: GpuSpec(name=k, **v) for k, v in _load_table("_gpus.json").items()}


def load_efficiencies() -> dict[str, Efficiency]:
    return {k: Efficiency(name=k, **v) for k, v in _load_table("_efficiency.json").items()}


def kv_bytes_per_token(model: ModelShape, tp: int) -> int:
    """K and V of one token, all layers, all TP ranks together.

    Each rank holds num_kv_heads / tp heads; when tp exceeds num_kv_heads the engine
    replicates heads so that every rank holds one.
    """
    kv_heads = max(model.num_kv_heads, tp)
    return 2 * model.num_layers * kv_heads * model.head_dim * model.dtype_bytes


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
        + 6 * model.intermediate_size // tp
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
    per_token = (3 * model.intermediate_size // tp + 4 * model.hidden_size) * model.dtype_bytes
    logits = eff.activation_profile_seqs * (model.vocab_size // tp) * 4
    return eff.runtime_reserve_bytes + tokens * per_token + logits


def derive_step_cost(model: ModelShape, gpu: GpuSpec, tp: int, eff: Efficiency) -> StepCost:
    """The StepCost coefficients of ``model`` on ``tp`` GPUs of kind ``gpu``.

    With peak = gpu.peak_flops, bw = gpu.hbm_bytes_per_s, link = gpu.nvlink_bytes_per_s:

    flop_s_per_token   = 2 * (params_nonembedding + params_lm_head) / (tp * peak * eff_c)
                         two FLOP per weight per token; every layer and the lm head
    flop_s_per_attn    = 4 * layers * num_heads * head_dim / (tp * peak * eff_c)
                         QK^T and AV: 2 * head_dim FLOP each, per head, per (query, key) pair
    mem_s_weights      = (params_nonembedding + params_lm_head) * dtype / (tp * bw * eff_m)
                         every weight read once per step (the embedding table is gathered by
                         row, which is negligible)
    mem_s_per_kv_token = kv_bytes_per_token / (tp * bw * eff_m)
    mem_s_per_token    = activation_bytes_per_token / (bw * eff_m)   (already per rank)
    fixed_s            = step_overhead_s + layers * layer_overhead_s
    comm_s_fixed       = 2 * layers * allreduce_latency_s                     (0 at tp 1)
    comm_s_per_token   = 2 * layers * hidden * dtype * 2 (tp - 1) / tp / (link * eff_link)
                         two all-reduces per layer (after attention and after the MLP) of
                         one hidden vector per token; a ring all-reduce moves 2 (tp - 1) / tp
                         of the buffer over each GPU's link

    Raises:
        ValueError: tp < 1, or a non-positive efficiency.
    """
    if tp < 1:
        raise ValueError(f"tensor parallel degree must be >= 1, got {tp}")
    for f in ("compute_efficiency", "memory_efficiency", "link_efficiency"):
        if not 0 < getattr(eff, f) <= 1:
            raise ValueError(f"{eff.name}: {f} must be in (0, 1], got {getattr(eff, f)}")
    flops = tp * gpu.peak_flops * eff.compute_efficiency
    bandwidth = gpu.hbm_bytes_per_s * eff.memory_efficiency
    matmul_params = model.params_nonembedding + model.params_lm_head
    layers = model.num_layers
    if tp > 1:
        ring = 2 * (tp - 1) / tp
        per_token_bytes = 2 * layers * model.hidden_size * model.dtype_bytes * ring
        comm_fixed = 2 * layers * eff.allreduce_latency_s
        comm_per_token = per_token_bytes / (gpu.nvlink_bytes_per_s * eff.link_efficiency)
    else:
        comm_fixed = comm_per_token = 0.0
    return StepCost(
        fixed_s=eff.step_overhead_s + layers * eff.layer_overhead_s,
        flop_s_per_token=2 * matmul_params / flops,
        flop_s_per_attn=4 * layers * model.num_heads * model.head_dim / flops,
        mem_s_weights=matmul_params * model.dtype_bytes / (tp * bandwidth),
        mem_s_per_kv_token=kv_bytes_per_token(model, tp) / (tp * bandwidth),
        mem_s_per_token=activation_bytes_per_token(model, tp) / bandwidth,
        comm_s_fixed=comm_fixed,
        comm_s_per_token=comm_per_token,
    )


def profile_name(model: str, gpu: str, tp: int) -> str:
    return f"{model}_{gpu}_tp{tp}"


def _without_name(obj: ModelShape | GpuSpec | Efficiency) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name != "name"}


def build_profile(model_name: str, gpu_name: str, tp: int) -> dict[str, Any]:
    """The JSON object of one analytic profile: inputs, coefficients, memory, provenance."""
    model = load_models()[model_name]
    gpu = load_gpus()[gpu_name]
    eff = load_efficiencies()[gpu_name]
    cost = derive_step_cost(model, gpu, tp, eff)
    return {
        "name": profile_name(model_name, gpu_name, tp),
        "cost_model_version": COST_MODEL_VERSION,
        "provenance": {
            "method": "analytic roofline",
            "generator": "pipeline.sim.profiles",
            "generator_version": GENERATOR_VERSION,
        },
        "model": {"name": model_name, **_without_name(model)},
        "gpu": {"name": gpu_name, **_without_name(gpu)},
        "tensor_parallel": tp,
        "efficiency": _without_name(eff),
        "coefficients": cost.to_dict(),
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
            "flop_per_token": 2 * (model.params_nonembedding + model.params_lm_head),
        },
    }


def expected_profiles() -> dict[str, dict[str, Any]]:
    """Every profile of PROFILE_MATRIX on every GPU, by name."""
    out = {}
    for gpu_name in load_gpus():
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
        data = json.loads(path.read_text())
        version = int(data.get("cost_model_version", 1))
        if not 1 <= version <= COST_MODEL_VERSION:
            raise ScenarioError(
                f"profile {path}: cost_model_version {version} is not known to this version "
                f"(it reads 1 to {COST_MODEL_VERSION}); upgrade tracereplay"
            )
        memory = data["memory"]
        return Profile(
            name=str(data.get("name", path.stem)),
            cost=StepCost.from_dict(data["coefficients"]),
            kv_bytes_per_token=int(memory["kv_bytes_per_token"]),
            weight_bytes=int(memory["weight_bytes"]),
            gpu_memory_bytes=int(memory["gpu_memory_bytes"]),
            max_model_len=int(memory["max_model_len"]),
            reserve_bytes=int(memory.get("reserve_bytes", 0)),
            cost_model_version=version,
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
