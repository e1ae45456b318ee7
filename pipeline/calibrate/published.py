"""The published step times the shipped default profiles are derived from and checked against.

``pipeline/sim/profiles/_published_step_times.csv`` is a measurements file (the schema of
``tracereplay calibrate measurements``) of step times that engines' benchmark pages
published, one row per step, plus a ``source`` column (docs/cost_model.md cites each
source). ``defaults_accuracy`` predicts every row with the shipped defaults of its model,
GPU and tensor-parallel degree: the validation table of docs/cost_model.md and
bench/defaults_accuracy.py.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from pipeline.calibrate.measurements import read_measurements
from pipeline.sim.cost_model import StepCost
from pipeline.sim.profiles import (
    PROFILE_DIR,
    derive_step_cost,
    load_efficiencies,
    load_gpus,
    load_models,
)

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
