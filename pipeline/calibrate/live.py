"""``calibrate live``: probe the in-process engine, fit a profile to the step times.

``run_probes`` (``probes``) times the designed shapes; the rows go to a measurements
file in the ``calibrate measurements`` schema (mixed rows to ``<stem>.mixed.csv``), and
the profile is fitted with the same fit (``fit.calibrate``), starting from a profile
derived from the probes themselves (``start_profile``: there is no datasheet for "this
model on this machine"); its provenance names the engine, the torch and transformers
versions, the device and the dtype.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.calibrate.features import StepFeatures, mixed_features
from pipeline.calibrate.fit_error import MIXED, PACKED
from pipeline.calibrate.measurements import Measurements
from pipeline.calibrate.probe_design import DESIGNS, ProbeDesign
from pipeline.calibrate.probes import device_name, run_probes
from pipeline.errors import PipelineError


def start_profile(loaded: Any, rows: pl.DataFrame, *, name: str) -> dict[str, Any]:
    """A profile to start the fit from, derived from the model's shape and the probes.

    Its coefficients come from least squares on the probe rows with one term per
    feature (per-step, per-token, per-attention-pair, per-KV-token, per-sequence),
    clipped to be positive: the fit then moves each by a factor, as it does from a
    datasheet profile.
    """
    cfg = loaded.model.config
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(loaded.dtype, 4)
    kv_bytes = 2 * layers * kv_heads * head_dim * dtype_bytes
    weight_bytes = int(loaded.num_parameters) * dtype_bytes
    if loaded.device.startswith("cuda"):
        import torch

        memory_bytes = int(torch.cuda.get_device_properties(loaded.device).total_memory)
    else:
        memory_bytes = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    b = rows["batch_size"].to_numpy().astype(float)
    p = rows["prompt_tokens"].to_numpy().astype(float)
    c = rows["context_tokens"].to_numpy().astype(float)
    pre = (rows["phase"] == "prefill").to_numpy()
    t = rows["time_ms"].to_numpy() / 1000.0
    tokens = np.where(pre, b * p, b)
    attn = tokens * np.where(pre, b * p, b * c)  # packed (query, key) pairs
    kv = np.where(pre, 0.0, b * c)
    x = np.column_stack([np.ones_like(t), tokens, attn, kv, b])
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)  # relative error
    floor = float(np.min(t))
    fixed = max(float(coef[0]), 0.2 * floor)
    per_token = max(float(coef[1]), 0.01 * floor / max(float(tokens.max()), 1.0))
    per_attn = max(float(coef[2]), 1e-3 * per_token / max(float(p.max()), 1.0))
    per_kv = max(float(coef[3]), 1e-3 * per_token)
    coefficients = {
        "fixed_s": fixed,
        "comm_s_fixed": 0.0,
        "seq_s": max(float(coef[4]), 0.0),
        "flop_s_per_token": per_token,
        "flop_tokens_half": 0.0,
        "flop_s_per_attn": per_attn,
        "mem_s_weights": 0.5 * fixed,
        "mem_s_per_kv_token": per_kv,
        "mem_s_per_token": 0.1 * per_token,
        "comm_s_per_token": 0.0,
        "overlap": 0.0,
    }
    max_len = int(getattr(cfg, "max_position_embeddings", 4096))
    return {
        "name": name,
        "cost_model_version": 2,
        # A counts (query, key) pairs over the packed batch: a profile for the transformers
        # policy (the fit, its error and profile check count them so: fit_error.py)
        "provenance": {"attention": PACKED},
        "model": {
            "name": loaded.name,
            "num_layers": layers,
            "hidden_size": int(cfg.hidden_size),
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": int(getattr(cfg, "intermediate_size", 0)),
            "vocab_size": int(cfg.vocab_size),
            "dtype_bytes": dtype_bytes,
            "max_model_len": max_len,
        },
        "gpu": {"name": device_name(loaded.device), "memory_bytes": memory_bytes},
        "tensor_parallel": 1,
        "coefficients": coefficients,
        "memory": {
            "kv_bytes_per_token": kv_bytes,
            "weight_bytes": weight_bytes,
            "gpu_memory_bytes": memory_bytes,
            "reserve_bytes": 0,
            "max_model_len": max_len,
        },
    }


@dataclass
class LiveCalibration:
    profile: dict[str, Any]
    measurements_path: Path
    output: Path
    rows: pl.DataFrame
    mixed: pl.DataFrame
    fit: Any  # fit.FitResult, its figures over the rows of measurements_path
    mixed_error: Any  # fit_error.FitError over the mixed rows, or None


def calibrate_live(
    output: Path,
    *,
    model: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    design: ProbeDesign | str = "cpu",
    block_size: int = 32,
    seed: int = 0,
    cpu_threads: int | None = 1,
    loaded: Any = None,
    progress: Any = None,
) -> LiveCalibration:
    """Probe the in-process engine, write ``<output stem>.measurements.csv`` and the profile."""
    import torch
    import transformers

    from pipeline.calibrate.measurements import read_measurements
    from pipeline.calibrate.profile import calibrated_profile, write_profile
    from pipeline.live.model import load_model

    if isinstance(design, str):
        if design not in DESIGNS:
            raise PipelineError(f"unknown probe design {design!r}; allowed: {', '.join(DESIGNS)}")
        design = DESIGNS[design]
    if loaded is None:
        loaded = load_model(model, device=device, dtype=dtype, seed=seed)
    if loaded.device == "cpu" and cpu_threads is not None:
        torch.set_num_threads(int(cpu_threads))
    rows, mixed = run_probes(loaded, design, block_size=block_size, seed=seed, progress=progress)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    mpath = output.with_name(f"{output.stem}.measurements.csv")
    rows.write_csv(mpath)
    mixed_path = output.with_name(f"{output.stem}.mixed.csv")
    mixed.write_csv(mixed_path)
    m = read_measurements(mpath)
    like = start_profile(loaded, rows, name=f"{output.stem}.start")
    result, mixed_error = fit_probes(m, mixed, like)
    profile = calibrated_profile(like, like["name"], output.stem, result, m)
    profile["provenance"]["method"] = "in-process engine probes (engine steps), fitted"
    profile["provenance"]["mixed_source_file"] = str(mixed_path)
    if mixed_error is not None:
        mixed_rows = mixed_error.phases["mixed"].to_dict()
        profile["provenance"]["fit_error"]["mixed"] = {"which": MIXED, **mixed_rows}
    profile["provenance"]["engine"] = {
        "engine": "inprocess",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": loaded.device,
        "gpu": device_name(loaded.device),
        "dtype": loaded.dtype,
        "model": loaded.name,
        "weights": loaded.weights,
        "num_parameters": loaded.num_parameters,
        "block_size": block_size,
        "cpu_threads": torch.get_num_threads() if loaded.device == "cpu" else None,
        "design": {
            "prefill": design.prefill_shapes(),
            "decode": design.decode_shapes(),
            "repeats": design.repeats,
            "warmup": design.warmup,
        },
    }
    write_profile(profile, output)
    return LiveCalibration(profile, mpath, output, rows, mixed, result, mixed_error)


def fit_probes(m: Measurements, mixed: pl.DataFrame, like: dict[str, Any]) -> tuple[Any, Any]:
    """(the fit of ``like``'s coefficients to the pure probe rows ``m`` and the mixed rows,
    the fitted profile's error on the mixed rows or None).

    The fit takes both; the figures (fit_error.py) are over the rows of ``m``, the
    measurements file, as ``profile check`` computes them with the written profile on that
    file, and, apart, over the mixed rows, which that file's schema cannot hold.
    """
    from pipeline.calibrate.fit import as_vector, calibrate, predict
    from pipeline.calibrate.fit_error import (
        ALL_MEASURED,
        FitError,
        features_for,
        phase_errors,
        profile_error,
    )

    fm = mixed_features(mixed)
    tm = mixed["time_ms"].to_numpy() / 1000.0
    both = Measurements(
        path=m.path,
        sha256=m.sha256,
        is_prefill=np.concatenate([m.is_prefill, np.ones(len(tm), dtype=bool)]),
        batch_size=np.concatenate([m.batch_size, fm.N]),
        prompt_tokens=np.concatenate([m.prompt_tokens, fm.P]),
        context_tokens=np.concatenate([m.context_tokens, np.zeros(len(tm))]),
        time_s=np.concatenate([m.time_s, tm]),
    )
    pure = features_for(like, m)
    features = StepFeatures(
        *(np.concatenate([getattr(pure, k), getattr(fm, k)]) for k in ("P", "A", "N", "D", "C"))
    )
    result = calibrate(both, features, like["coefficients"], cv=None)
    fitted = {**like, "coefficients": result.coefficients}
    result.fit_error = profile_error(fitted, m, ALL_MEASURED)[0].phases
    result.like_error = profile_error(like, m, ALL_MEASURED)[0].phases
    if not len(tm):
        return result, None
    mixed_pred = predict(as_vector(result.coefficients), fm)
    per = phase_errors(mixed_pred, tm, np.ones(len(tm), dtype=bool))
    return result, FitError({"mixed": per["prefill"]}, MIXED)
