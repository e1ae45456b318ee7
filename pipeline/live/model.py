"""The in-process engine's model: built from a shape with random weights, or loaded from disk.

Nothing is ever downloaded (``HF_HUB_OFFLINE`` is set before transformers is imported).
A model spec is one of:

- a built-in shape name (``SHAPES``): a Llama-architecture config with random weights;
- a ``config.json`` file, or a directory holding only a ``config.json``: that architecture
  with random weights;
- a checkpoint directory (``config.json`` plus ``*.safetensors`` / ``*.bin``): the weights.

Random weights are seeded, so two builds of the same spec are identical. Weights do not
change how long a step takes, only which tokens come out, and EOS is disabled anyway.
Prompts are random token ids of the logged length (``random_prompts``), seeded too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Llama-architecture shapes. "tiny" is for tests (milliseconds a step on one CPU core),
# "small" for CPU benchmarks (step times that grow visibly with tokens), "llama3-8b" is
# Meta-Llama-3-8B's published shape (for GPU calibration).
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
    },
    "small": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 2048,
        "max_position_embeddings": 8192,
    },
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
}
DEFAULT_SHAPE = "tiny"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for the engine, and what it is (for provenance)."""

    model: Any  # transformers PreTrainedModel
    name: str  # the spec as given (shape name or path)
    weights: str  # "random" or "checkpoint"
    device: str
    dtype: str
    num_parameters: int
    config: dict[str, Any]


def resolve_device(device: str | None) -> str:
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str | None, device: str) -> str:
    """fp32 on CPU, bf16 on CUDA unless told otherwise."""
    if dtype is None or dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    return aliases.get(dtype, dtype)


def _config_dict(spec: str) -> tuple[dict[str, Any], Path | None]:
    """(config as a dict, checkpoint dir or None)."""
    if spec in SHAPES:
        return {"model_type": "llama", **SHAPES[spec]}, None
    path = Path(spec)
    if path.is_dir():
        cfg_file = path / "config.json"
        has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    elif path.is_file():
        cfg_file, has_weights = path, False
    else:
        raise ConfigError(
            f"model {spec!r}: not a built-in shape ({', '.join(SHAPES)}), nor a config.json "
            "file, nor a checkpoint directory; pass one of those"
        )
    if not cfg_file.is_file():
        raise ConfigError(f"{path}: no config.json in this directory; add one or pass its path")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{cfg_file}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"
        ) from exc
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ConfigError(f"{cfg_file}: no 'model_type' key; a transformers config.json has one")
    return cfg, (path if has_weights else None)


def load_model(
    spec: str | Path | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Build (random weights, seeded) or load (checkpoint) the model named by ``spec``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    name = DEFAULT_SHAPE if spec is None else str(spec)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    torch_dtype = getattr(torch, dt)
    cfg_dict, checkpoint = _config_dict(name)
    if checkpoint is not None:
        model: Any = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=torch_dtype, local_files_only=True
        )
        model = model.to(dev)
        weights = "checkpoint"
    else:
        cfg_kwargs = {k: v for k, v in cfg_dict.items() if k != "model_type"}
        config = AutoConfig.for_model(cfg_dict["model_type"], **cfg_kwargs)
        torch.manual_seed(seed)
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        weights = "random"
    model.eval()
    return LoadedModel(
        model=model,
        name=name,
        weights=weights,
        device=dev,
        dtype=dt,
        num_parameters=int(sum(p.numel() for p in model.parameters())),
        config=model.config.to_dict(),
    )


def random_prompts(
    lengths: npt.NDArray[np.int64], vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """One list of random token ids per length (ids 1..vocab-1: 0 is often padding)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab_size, int(n)).tolist() for n in lengths]
