"""The published step times the shipped default profiles are derived from and checked against.

``pipeline/sim/profiles/_published_step_times.csv`` is a measurements file (the schema of
``tracereplay calibrate measurements``) of step times that engines' benchmark pages
published, one row per step, plus a ``source`` column (docs/cost_model.md cites each
source). ``defaults_accuracy`` predicts every row with the shipped defaults of its model,
GPU and tensor-parallel degree: the validation table of docs/cost_model.md and
bench/defaults_accuracy.py. ``HELD_OUT`` are published latencies no default was fitted
to (whole requests and first tokens), predicted by ``held_out_ms``.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline.calibrate.measurements import read_measurements
from pipeline.sim.cost_model import StepCost, decode_run_s
from pipeline.sim.hardware import load_efficiencies, load_gpus, load_models
from pipeline.sim.model_config import DTYPE_BYTES
from pipeline.sim.profiles import PROFILE_DIR
from pipeline.sim.roofline import derive_step_cost

PUBLISHED_CSV = PROFILE_DIR / "_published_step_times.csv"


@dataclass(frozen=True)
class PublishedStep:
    phase: str  # prefill | decode
    batch_size: int
    prompt_tokens: int
    context_tokens: int
    time_ms: float
    model: str  # a model of _models.json
    gpu: str  # a GPU of _gpus.json
    tp: int
    source: str


def published_rows(path: Path = PUBLISHED_CSV) -> list[PublishedStep]:
    """Every row of the file, validated as a measurements file first."""
    read_measurements(path)  # the schema errors of a measurements file, row and column named
    with Path(path).open(newline="") as f:
        return [
            PublishedStep(
                phase=r["phase"],
                batch_size=int(r["batch_size"]),
                prompt_tokens=int(r["prompt_tokens"]),
                context_tokens=int(r["context_tokens"]),
                time_ms=float(r["time_ms"]),
                model=r["model"],
                gpu=r["gpu"],
                tp=int(r["tensor_parallel"]),
                source=r["source"],
            )
            for r in csv.DictReader(f)
        ]


def predict_ms(cost: StepCost, row: PublishedStep) -> float:
    """The step time ``cost`` predicts for one measured step, in ms."""
    if row.phase == "prefill":
        return cost.prefill_step_s(row.batch_size, row.prompt_tokens, row.context_tokens) * 1e3
    return cost.decode_step_s(row.batch_size, row.context_tokens) * 1e3


def default_cost(row: PublishedStep) -> StepCost:
    """The shipped defaults' StepCost for the row's model, GPU and tensor parallelism."""
    return derive_step_cost(
        load_models()[row.model], load_gpus()[row.gpu], row.tp, load_efficiencies()[row.gpu]
    )


def defaults_accuracy(path: Path = PUBLISHED_CSV) -> list[tuple[PublishedStep, float]]:
    """(row, predicted ms) for every published row, with the shipped defaults."""
    return [(row, predict_ms(default_cost(row), row)) for row in published_rows(path)]


@dataclass(frozen=True)
class HeldOut:
    """A published latency no default was fitted to: a whole request or a first token."""

    label: str
    model: str  # a model of _models.json
    gpu: str
    tp: int
    dtype: str  # bf16 | fp8 (weights and KV cache)
    batch: int
    prompt_tokens: int
    output_tokens: int  # 1: first-token latency; more: prefill plus output - 1 decode steps
    measured_ms: float
    source: str


# vLLM's performance benchmark (Buildkite pipeline vllm/performance-benchmark, build 9515,
# "Latency tests": 32 input and 128 output tokens at batch 8, end-to-end, on H200) and
# TensorRT-LLM v0.5's H100 FP8 first-token latencies (docs/source/performance.md).
HELD_OUT: tuple[HeldOut, ...] = (
    HeldOut(
        "vllm latency llama-3-70b tp4",
        "llama-3-70b",
        "h200",
        4,
        "bf16",
        8,
        32,
        128,
        2077.53,
        "vllm-perf-benchmark",
    ),
    HeldOut(
        "vllm latency llama-3-8b tp1",
        "llama-3-8b",
        "h200",
        1,
        "bf16",
        8,
        32,
        128,
        833.42,
        "vllm-perf-benchmark",
    ),
    HeldOut(
        "vllm latency mixtral-8x7b tp2",
        "mixtral-8x7b",
        "h200",
        2,
        "bf16",
        8,
        32,
        128,
        1917.44,
        "vllm-perf-benchmark",
    ),
    HeldOut(
        "trtllm fp8 llama-2-7b 128",
        "llama-2-7b",
        "h100-80gb",
        1,
        "fp8",
        1,
        128,
        1,
        7.0,
        "trtllm-0.5",
    ),
    HeldOut(
        "trtllm fp8 llama-2-7b 2048",
        "llama-2-7b",
        "h100-80gb",
        1,
        "fp8",
        1,
        2048,
        1,
        36.0,
        "trtllm-0.5",
    ),
    HeldOut(
        "trtllm fp8 llama-2-70b tp4 128",
        "llama-2-70b",
        "h100-80gb",
        4,
        "fp8",
        1,
        128,
        1,
        26.0,
        "trtllm-0.5",
    ),
    HeldOut(
        "trtllm fp8 llama-2-70b tp4 2048",
        "llama-2-70b",
        "h100-80gb",
        4,
        "fp8",
        1,
        2048,
        1,
        109.0,
        "trtllm-0.5",
    ),
)


def held_out_ms(h: HeldOut) -> float:
    """The latency the defaults predict for one held-out figure: the prefill step of the
    batch, then (output - 1) decode steps in closed form (context grows by one each)."""
    model = load_models()[h.model]
    size = DTYPE_BYTES[h.dtype]
    model = dataclasses.replace(model, dtype_bytes=size, kv_dtype_bytes=size)
    cost = derive_step_cost(model, load_gpus()[h.gpu], h.tp, load_efficiencies()[h.gpu])
    total = cost.prefill_step_s(h.batch, h.prompt_tokens)
    # decode step j reads prompt + 1 + j tokens per sequence (the loop's C = n + 1)
    ctx0 = float(h.batch * (h.prompt_tokens + 2))
    total += decode_run_s(cost.as_array(), float(h.batch), ctx0, h.output_tokens - 1)
    return total * 1e3
