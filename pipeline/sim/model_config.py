"""A Hugging Face ``config.json`` -> the ``ModelShape`` the step-cost profiles are derived from.

Supported ``model_type`` values (decoder-only transformers with a gated MLP):

    llama, mistral, qwen2, qwen3       dense; head_dim when given, else hidden / heads
    gemma, gemma2                      dense, GeGLU MLP, tied embeddings by default;
                                       Gemma-2 has four norms per layer
    mixtral                            MoE: num_local_experts, num_experts_per_tok,
                                       experts of width intermediate_size
    qwen2_moe                          MoE with a shared expert (shared_expert_intermediate_size)
    qwen3_moe                          MoE: num_experts, num_experts_per_tok,
                                       moe_intermediate_size; q/k norms

Qwen2 (and Qwen2-MoE) always carry q/k/v biases; other families read ``attention_bias``
(default false). MoE models compute with their active parameters (router, the experts a
token runs, the shared expert) and hold every expert in memory.

``read_model_config`` raises ConfigError with one line naming the file and the missing or
bad key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import validation
from pipeline.errors import ConfigError
from pipeline.sim.hardware import ModelShape, read_json_object

DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
MODEL_TYPES = DENSE + MOE
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
_ALWAYS_BIASED = ("qwen2", "qwen2_moe")
_TIED_BY_DEFAULT = ("gemma", "gemma2")


# the largest value of each shape key: far beyond any published model, small enough that
# parameter and byte counts stay exact in int64
SHAPE_MAX: dict[str, int] = {
    "hidden_size": 1 << 20,
    "num_attention_heads": 1 << 14,
    "num_key_value_heads": 1 << 14,
    "num_hidden_layers": 1 << 14,
    "vocab_size": 1 << 24,
    "head_dim": 1 << 14,
    "intermediate_size": 1 << 22,
    "num_local_experts": 1 << 14,
    "num_experts": 1 << 14,
    "num_experts_per_tok": 1 << 14,
    "moe_intermediate_size": 1 << 22,
    "shared_expert_intermediate_size": 1 << 22,
}


def _get(cfg: dict[str, Any], key: str, path: Path, kind: type = int) -> Any:
    if key not in cfg:
        raise ConfigError(
            f"{path}: missing key {key!r} (a config.json of a {cfg['model_type']} "
            "model has it; copy it from the model's published config.json)"
        )
    value = cfg[key]
    if kind is int:
        return validation.integer(value, f"key {key!r}", str(path), lo=1, hi=SHAPE_MAX[key])
    return value


def model_shape_from_config(
    cfg: dict[str, Any],
    path: Path,
    name: str | None = None,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    max_model_len: int | None = None,
) -> ModelShape:
    """The ModelShape of one parsed config.json (``path`` only names it in errors)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: not a JSON object")
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ConfigError(f"{path}: missing key 'model_type' (one of {', '.join(MODEL_TYPES)})")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"{path}: model_type {model_type!r} is not supported; supported: "
            + ", ".join(MODEL_TYPES)
        )
    for flag, value in (("--dtype", dtype), ("--kv-cache-dtype", kv_dtype or dtype)):
        if value not in DTYPE_BYTES:
            raise ConfigError(f"{flag} {value!r}: use one of {', '.join(DTYPE_BYTES)}")
    hidden = _get(cfg, "hidden_size", path)
    heads = _get(cfg, "num_attention_heads", path)
    layers = _get(cfg, "num_hidden_layers", path)
    vocab = _get(cfg, "vocab_size", path)
    kv_heads = _get(cfg, "num_key_value_heads", path) if "num_key_value_heads" in cfg else heads
    if heads % kv_heads:
        raise ConfigError(
            f"{path}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
            f"({kv_heads}): each KV head serves the same number of query heads"
        )
    head_dim = cfg.get("head_dim") or hidden // heads
    head_dim = validation.integer(
        head_dim, "key 'head_dim'", str(path), lo=1, hi=SHAPE_MAX["head_dim"]
    )
    moe: dict[str, int] = {}
    if model_type == "mixtral":
        moe = {
            "num_experts": _get(cfg, "num_local_experts", path),
            "num_experts_per_tok": _get(cfg, "num_experts_per_tok", path),
            "moe_intermediate_size": _get(cfg, "intermediate_size", path),
        }
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        moe = {
            "num_experts": _get(cfg, "num_experts", path),
            "num_experts_per_tok": _get(cfg, "num_experts_per_tok", path),
            "moe_intermediate_size": _get(cfg, "moe_intermediate_size", path),
        }
        if model_type == "qwen2_moe":
            moe["shared_expert_intermediate_size"] = _get(
                cfg, "shared_expert_intermediate_size", path
            )
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            raise ConfigError(
                f"{path}: dense layers inside an MoE model (mlp_only_layers, "
                "decoder_sparse_step) are not supported"
            )
    if moe and moe["num_experts_per_tok"] > moe["num_experts"]:
        raise ConfigError(
            f"{path}: num_experts_per_tok ({moe['num_experts_per_tok']}) must be at most the "
            f"number of experts ({moe['num_experts']})"
        )
    if model_type == "mixtral":  # Mixtral's intermediate_size is one expert's width
        intermediate = moe["moe_intermediate_size"]
    else:
        intermediate = _get(cfg, "intermediate_size", path) if model_type in DENSE else 0
    tied = cfg.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
    bias = model_type in _ALWAYS_BIASED or bool(cfg.get("attention_bias", False))
    length = max_model_len or cfg.get("max_position_embeddings")
    if length is None:
        raise ConfigError(
            f"{path}: missing key 'max_position_embeddings' (or give --max-model-len)"
        )
    length = validation.integer(
        length, "key 'max_position_embeddings'", str(path), lo=2, hi=validation.MAX_COUNT
    )
    # a file called config.json is named after its directory, any other after itself
    label = name or (path.parent.resolve().name if path.stem == "config" else path.stem)
    return ModelShape(
        name=str(label),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        dtype_bytes=DTYPE_BYTES[dtype],
        max_model_len=length,
        tie_word_embeddings=bool(tied),
        attention_bias=bias,
        source=f"Hugging Face config.json ({model_type}) read from {path.name}",
        norms_per_layer=4 if model_type == "gemma2" else 2,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        kv_dtype_bytes=DTYPE_BYTES[kv_dtype or dtype],
        **moe,
    )


def read_model_config(
    path: Path,
    name: str | None = None,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    max_model_len: int | None = None,
) -> ModelShape:
    """Read a Hugging Face config.json file into a ModelShape.

    Raises:
        ConfigError: unreadable file, not JSON, unsupported model_type, a missing or bad key.
    """
    path = Path(path)
    cfg = read_json_object(path)
    return model_shape_from_config(cfg, path, name, dtype, kv_dtype, max_model_len)
