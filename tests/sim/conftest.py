"""Builders for simulator tests: scenarios with explicit costs, request tables."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import settings

from pipeline.contracts import REQUESTS
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.state import SimInput
from pipeline.warehouse import Warehouse

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

TRACES_RAW = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces_raw"
AZURE_CONV = TRACES_RAW / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"

# A step costs 1 s, whatever it computes: hand-checkable timings.
UNIT_COST = {
    "fixed_s": 1.0,
    "flop_s_per_token": 0.0,
    "flop_s_per_attn": 0.0,
    "mem_s_weights": 0.0,
    "mem_s_per_kv_token": 0.0,
    "mem_s_per_token": 0.0,
    "comm_s_fixed": 0.0,
    "comm_s_per_token": 0.0,
}

# Roughly an 8B model on one H100: 6 ms of weights, KV reads, prefill compute.
H100_8B_COST = {
    "fixed_s": 0.003,
    "flop_s_per_token": 2.4e-5,
    "flop_s_per_attn": 1.5e-10,
    "mem_s_weights": 0.006,
    "mem_s_per_kv_token": 5.0e-8,
    "mem_s_per_token": 1.0e-8,
    "comm_s_fixed": 0.0,
    "comm_s_per_token": 0.0,
}


def make_scenario(policy: str, cost: dict[str, float] | None = None, **values: Any) -> Scenario:
    """A scenario with an explicit cost table (no profile), validated."""
    values.setdefault("num_gpu_blocks", 1000)
    values.setdefault("max_model_len", 4096)
    return build_scenario({"policy": policy, "cost": cost or UNIT_COST, **values})


def make_input(arrival_s: list[float], prompt: list[int], output: list[int]) -> SimInput:
    return SimInput(
        np.asarray(arrival_s, dtype=np.float64),
        np.asarray(prompt, dtype=np.int64),
        np.asarray(output, dtype=np.int64),
    )


def requests_table(
    prompt: list[int] | np.ndarray,
    output: list[int] | np.ndarray,
    gaps_s: float | list[float] | np.ndarray = 1.0,
    *,
    start: datetime = datetime(2024, 5, 1, tzinfo=UTC),
    max_tokens: list[int | None] | None = None,
    prefix: str = "r",
) -> pa.Table:
    """A requests table (file columns of the REQUESTS contract)."""
    n = len(prompt)
    gaps = np.broadcast_to(np.asarray(gaps_s, dtype=np.float64), (n,))
    offsets = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    times = [start + timedelta(seconds=float(s)) for s in offsets]
    cols: dict[str, Any] = {
        "request_id": [f"{prefix}{i:06d}" for i in range(n)],
        "arrival_time": pa.array(times, pa.timestamp("us", tz="UTC")),
        "arrival_s": offsets,
        "prompt_tokens": pa.array(np.asarray(prompt), pa.int32()),
        "output_tokens": pa.array(np.asarray(output), pa.int32()),
        "max_tokens": pa.array(max_tokens or [None] * n, pa.int32()),
        "block_size": pa.array([None] * n, pa.int32()),
        "prefix_hashes": pa.array([[]] * n, pa.list_(pa.uint64())),
        "model": pa.array([None] * n, pa.string()),
        "tenant": pa.array([None] * n, pa.string()),
        "priority": pa.array([None] * n, pa.int32()),
        "session_id": pa.array([None] * n, pa.string()),
        "parent_id": pa.array([None] * n, pa.string()),
        "turn": pa.array([None] * n, pa.int32()),
        "observed_ttft_s": pa.array([None] * n, pa.float64()),
        "observed_e2e_s": pa.array([None] * n, pa.float64()),
        "observed_queue_s": pa.array([None] * n, pa.float64()),
        "cached_tokens": pa.array([None] * n, pa.int32()),
        "source_format": ["test"] * n,
        "source_file": ["test"] * n,
        "source_line": pa.array(np.arange(1, n + 1), pa.int64()),
    }
    return pa.table(cols)


@pytest.fixture
def warehouse_with(tmp_path: Path) -> Callable[..., Path]:
    """warehouse_with(table, day="2024-05-01"): a warehouse holding one requests file."""

    def make(table: pa.Table, day: str = "2024-05-01", stem: str = "src-test") -> Path:
        root = tmp_path / "wh"
        Warehouse(root).write(REQUESTS, table, {"date": day}, stem)
        return root

    return make


def read_azure_conv(n: int | None = None) -> pl.DataFrame:
    """The Azure conversation trace as (arrival_s, prompt_tokens, output_tokens)."""
    if not AZURE_CONV.exists():
        pytest.fail(f"the real public traces are expected beside the project at {TRACES_RAW}")
    df = pl.read_csv(AZURE_CONV, n_rows=n).select(
        pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f").alias("t"),
        pl.col("ContextTokens").alias("prompt_tokens"),
        pl.col("GeneratedTokens").alias("output_tokens"),
    )
    t0 = df["t"].min()
    return df.with_columns(
        ((pl.col("t") - t0).dt.total_microseconds() / 1e6).alias("arrival_s")
    ).drop("t")


def shared_prefix_hashes(
    rng: np.random.Generator,
    prompt: np.ndarray,
    block_size: int,
    *,
    num_roots: int = 3,
    partial: bool = False,
) -> list[list[int]]:
    """Chained block hashes of prompts that share prefixes the way chat traffic does.

    Each prompt starts from one of a few roots (system prompts) or from a
    prefix of an earlier prompt (a later turn, a retry), then goes its own
    way; a prompt as long as an earlier one may be a retry of it (the same
    hashes). Full blocks are hashed, and with ``partial`` a partial last block
    too (as Mooncake does: its length is part of its content); equal hash at
    block i means equal prompts up to the end of block i.
    """
    chains: dict[tuple[int, ...], int] = {}
    out: list[list[int]] = []
    for j, length in enumerate(prompt):
        same = np.flatnonzero(prompt[:j] == length)
        if len(same) and rng.random() < 0.5:
            out.append(list(out[int(same[-1])]))
            continue
        blocks = int(length) // block_size
        if j and rng.random() < 0.5:
            base = out[int(rng.integers(0, j))]
            shared = base[: int(rng.integers(0, len(base) + 1))] if base else []
        else:
            shared = []
        root = int(rng.integers(0, num_roots))
        content = [(root, b) for b in range(blocks)]  # shared content unless diverged
        hashes = list(shared[:blocks])
        parent = hashes[-1] if hashes else 0
        for b in range(len(hashes), blocks):
            own = content[b] if not shared and rng.random() < 0.8 else (-1 - j, b)
            parent = chains.setdefault((parent, *own), len(chains) + 1)
            hashes.append(parent)
        rest = int(length) % block_size
        if partial and rest and len(hashes) == blocks:
            own = (root, blocks) if rng.random() < 0.5 else (-1 - j, blocks)
            hashes.append(chains.setdefault((parent, *own, rest), len(chains) + 1))
        out.append(hashes)
    return out


def with_prefix(
    inp: SimInput,
    hashes: list[list[int]],
    trace_block: int | list[int],
    engine_block: int,
    *,
    warmup: int = 0,
    partial_blocks: bool = True,
) -> SimInput:
    """``inp`` with prefix keys built from per-request hashes (the first ``warmup`` warm)."""
    from pipeline.sim.prefix import build_keys

    n = len(inp)
    tb = np.broadcast_to(np.asarray(trace_block, dtype=np.int64), (n,))
    hashed = pa.array(hashes, pa.list_(pa.uint64()))
    keys = build_keys(inp.prompt_tokens, tb, hashed, engine_block, partial_blocks=partial_blocks)
    if not warmup:
        return SimInput(inp.arrival_s, inp.prompt_tokens, inp.output_tokens, prefix=keys,
                        priority=inp.priority)  # fmt: skip
    return SimInput(
        inp.arrival_s[warmup:],
        inp.prompt_tokens[warmup:],
        inp.output_tokens[warmup:],
        prefix=keys.slice(warmup, n),
        priority=None if inp.priority is None else inp.priority[warmup:],
        warmup=keys.slice(0, warmup),
    )
