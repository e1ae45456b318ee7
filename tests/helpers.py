"""Builders of test data, shared by the test directories: scenarios with explicit costs,
simulator inputs, requests tables, small warehouses, grid and capacity files, and the
hand-written report warehouses.

Plain functions, imported explicitly (``from tests.helpers import make_scenario``); the
fixtures in the conftest files call them. Every figure a test expects from a builder is
worked out from what the builder's docstring (or the module docstring of the tests that
use it) says it writes.
"""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from pipeline.contracts import (
    QUARANTINE,
    REQUESTS,
    RUNS,
    SCENARIOS,
    SIM_REQUESTS,
    SIM_STEPS,
    Contract,
    write_table,
)
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.state import SimInput
from pipeline.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[1]
# The real public traces, beside the project (not in it: they are large).
TRACES_RAW = ROOT.parent / "shared" / "traces_raw"
AZURE_CONV = TRACES_RAW / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


# --- simulator: cost tables, scenarios, inputs, requests tables -------------------------

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


def write_requests(
    root: Path, table: pa.Table, day: str = "2024-05-01", stem: str = "src-test"
) -> Path:
    """A warehouse at ``root`` holding one requests file (``table``) of day ``day``."""
    Warehouse(root).write(REQUESTS, table, {"date": day}, stem)
    return root


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


def chain(*blocks: int) -> list[int]:
    """Chained hashes of a prompt whose full blocks have these contents."""
    out: list[int] = []
    for b in blocks:
        out.append(hash((out[-1] if out else 0, b)) & 0xFFFFFFFF)
    return out


# --- sweeps and capacity: grid files, capacity files, seeded warehouses -----------------

# An explicit step cost and KV size: no profile needed, hand-sized memory.
BASE: dict[str, Any] = {"cost": H100_8B_COST, "num_gpu_blocks": 4000, "max_model_len": 4096}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def grid_toml(axes: dict[str, Any], *, slo: dict[str, str] | None = None, **base: Any) -> str:
    """A grid file over BASE (cost table included) with these axes."""
    lines = ["[base]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in {**BASE, **base}.items() if k != "cost"]
    lines.append("[base.cost]")
    lines += [f"{k} = {v!r}" for k, v in H100_8B_COST.items()]
    lines.append("[axes]")
    for k, v in axes.items():
        if isinstance(v, dict):
            continue
        lines.append(f"{k} = {toml_value(v)}")
    for k, v in axes.items():
        if isinstance(v, dict):
            lines.append(f"[axes.{k}]")
            lines += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    if slo:
        lines.append("[slo]")
        lines += [f'{k} = "{v}"' for k, v in slo.items()]
    return "\n".join(lines) + "\n"


def capacity_file(path: Path, sections: str) -> Path:
    """A capacity file at ``path``: a [base] of BASE (its cost table included), then
    ``sections`` ([slo], [search.<kind>], ...) as written."""
    cost = "\n".join(f"{k} = {v!r}" for k, v in BASE["cost"].items())
    path.write_text(
        f"[base]\nnum_gpu_blocks = 4000\nmax_model_len = 4096\n[base.cost]\n{cost}\n{sections}"
    )
    return path


def seeded_warehouse(root: Path, n: int = 400, rate: float = 15.0, seed: int = 7) -> Path:
    """A warehouse at ``root`` of ``n`` requests, Poisson-ish at ``rate``, Azure-like lengths."""
    rng = np.random.default_rng(seed)
    table = requests_table(
        rng.integers(50, 2000, n), rng.integers(2, 300, n), rng.exponential(1 / rate, n)
    )
    Warehouse(root).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")
    return root


def small_warehouse_at(root: Path, n: int = 300, rate: float = 20.0, seed: int = 1) -> Path:
    """A warehouse at ``root`` of ``n`` requests from noon of 2024-05-01: Poisson-ish
    arrivals at ``rate``, Azure-like lengths."""
    rng = np.random.default_rng(seed)
    table = requests_table(
        rng.integers(50, 2000, n),
        rng.integers(1, 300, n),
        rng.exponential(1.0 / rate, n),
        start=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )
    Warehouse(root).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")
    return root


# --- reports: the tiny hand-written warehouse, hostile names, replayed and swept ones --

# Names a log can carry that would run script if a report pasted them into HTML.
EVIL_MODEL = '</script><script>alert("model")</script>'
EVIL_TENANT = '<img src=x onerror=alert("tenant")>'
EVIL_FILE = '<script>alert("file")<.jsonl'

R1 = "20240501T000000Z-aaaa"
R2 = "20240502T000000Z-bbbb"
T0 = datetime(2024, 5, 1, tzinfo=UTC)


def table(contract: Contract, rows: list[dict[str, Any]]) -> pa.Table:
    """A contract table from row dicts (missing nullable columns are null)."""
    types = dict(contract.columns)
    names = contract.file_columns
    return pa.table(
        {n: pa.array([r.get(n) for r in rows], type=types[n]) for n in names},
    )


def request(rid: str, second: int, prompt: int, output: int, **kw: Any) -> dict[str, Any]:
    return {
        "request_id": rid,
        "arrival_time": datetime.fromtimestamp(T0.timestamp() + second, UTC),
        "arrival_s": float(second),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "prefix_hashes": kw.pop("prefix_hashes", []),
        "source_format": kw.pop("source_format", "gateway"),
        "source_file": kw.pop("source_file", "a.jsonl"),
        "source_line": second + 1,
        **kw,
    }


def config(name: str, policy: str, cap: int, time_scale: float = 1.0) -> str:
    cap_key = "max_batch_size" if policy == "static" else "max_num_seqs"
    return json.dumps(
        {
            "name": name,
            "policy": policy,
            cap_key: cap,
            "profile": "tiny",
            "replicas": 2,
            "rate": None,
            "time_scale": time_scale,
            "num_kv_blocks": 100,
            "block_size": 16,
            "enable_prefix_caching": policy != "static",
        }
    )


def sim_rows(scenario: str, arrivals: list[float], ttft: list[float], finished: list[float],
             depth: list[int], cached: list[int]) -> list[dict[str, Any]]:  # fmt: skip
    prompts, outputs = [100, 200, 400, 800], [10, 20, 5, 1]
    rows = []
    for i in range(4):
        e2e = finished[i] - arrivals[i]
        rows.append(
            {
                "scenario": scenario,
                "request_id": f"r{i + 1}",
                "replica": i % 2,
                "arrival_s": arrivals[i],
                "prompt_tokens": prompts[i],
                "output_tokens": outputs[i],
                "first_scheduled_s": arrivals[i],
                "first_token_s": arrivals[i] + ttft[i],
                "finished_s": finished[i],
                "queue_s": 0.0,
                "ttft_s": ttft[i],
                "tpot_s": (e2e - ttft[i]) / (outputs[i] - 1) if outputs[i] > 1 else None,
                "e2e_s": e2e,
                "num_preemptions": 0,
                "num_prefill_chunks": 1,
                "cached_tokens": cached[i],
                "queue_depth_at_arrival": depth[i],
            }
        )
    return rows


def step(scenario: str, replica: int, idx: int, start: float, dur: float, **kw: Any) -> dict:
    return {
        "scenario": scenario,
        "replica": replica,
        "step": idx,
        "num_steps": kw.get("num_steps", 1),
        "start_s": start,
        "duration_s": dur,
        "num_running": kw.get("running", 1),
        "num_waiting": kw.get("waiting", 0),
        "num_prefill_tokens": 0,
        "num_decode_tokens": 0,
        "num_kv_blocks_used": kw.get("used", 0),
        "num_kv_blocks_total": 100,
        "num_preemptions": kw.get("preempt", 0),
        "num_prefix_query_tokens": kw.get("query", 0),
        "num_prefix_hit_tokens": kw.get("hit", 0),
        # the features' columns (null unless given): scheduler CPU time, swap
        # preemption, speculative decoding
        "sched_cpu_s": kw.get("cpu"),
        "sched_cpu_exposed_s": kw.get("exposed"),
        "swap_out_bytes": kw.get("swap_out"),
        "swap_in_bytes": kw.get("swap_in"),
        "num_draft_tokens": kw.get("drafts"),
        "num_accepted_tokens": kw.get("accepted"),
    }


def write_run(wh: Warehouse, rid: str, day: int) -> None:
    """A committed replay run's row (the sim views show a run once it has one)."""
    run = {
        "run_id": rid, "command": "replay", "started_at": datetime(2024, 5, day, tzinfo=UTC),
        "finished_at": datetime(2024, 5, day, 0, 1, tzinfo=UTC), "status": "ok",
        "inputs": "[]", "rows_read": 0, "rows_kept": 0, "rows_quarantined": 0,
        "rows_duplicate": 0, "details": "{}", "version": "0.1.0",
    }  # fmt: skip
    wh.write(RUNS, table(RUNS, [run]), {}, rid)


def build(root: Path) -> Warehouse:
    """The tiny hand-written warehouse at ``root``: five requests, two replay runs, four
    scenarios. Every figure the SQL tests expect is worked out by hand from these rows (see
    tests/report/test_sql.py). The latest run, R2, replays r1..r4 through four scenarios:

    The gateway logged cached_tokens for r1 (50 of 100) and r3 (100 of 400).

        scenario     policy  cap  time_scale  ttft_s of r1..r4      queue depth met
        static-4     static   4   1.0         0.5 0.4 0.3 0.2       0 1 2 3
        vllm-2       vllm     2   1.0         0.1 0.2 0.3 0.5       0 0 1 9
        vllm-4       vllm     4   1.0         0.1 0.1 0.1 0.2       0 0 0 0
        vllm-4-fast  vllm     4   0.5         0.1 0.2 0.3 0.3       0 1 1 2

    R1 is older and replays r1 only, through one scenario.
    """
    wh = Warehouse(root)
    hashes = {"prefix_hashes": [1, 2], "block_size": 16}
    day1 = [
        request("r1", 0, 100, 10, model="m-a", tenant="t1", cached_tokens=50, **hashes),
        request("r2", 1, 200, 20, model="m-a", tenant="t2", **hashes),
        request("r3", 2, 400, 5, model="m-b", tenant="t1", cached_tokens=100),
        request("r4", 3, 800, 1, source_file="b.csv", source_format="azure"),
    ]
    day2 = [request("r5", 86400, 50, 2, source_file="b.csv", source_format="azure")]
    wh.write(REQUESTS, table(REQUESTS, day1), {"date": "2024-05-01"}, "src-a")
    wh.write(REQUESTS, table(REQUESTS, day2), {"date": "2024-05-02"}, "src-b")
    rejects = [
        {"run_id": "ingest", "source_format": "gateway", "source_file": "a.jsonl",
         "source_line": 9, "reason": "prompt_tokens is missing"},
        {"run_id": "ingest", "source_format": "gateway", "source_file": "a.jsonl",
         "source_line": 7, "reason": "prompt_tokens is missing"},
        {"run_id": "ingest", "source_format": "gateway", "source_file": "c.jsonl",
         "source_line": 4, "reason": "negative output token count -12 (was 7)"},
        {"run_id": "ingest", "source_format": "gateway", "source_file": "c.jsonl",
         "source_line": 2, "reason": "negative output token count -5"},
    ]  # fmt: skip
    wh.write(QUARANTINE, table(QUARANTINE, rejects), {}, "src-q")
    for rid, day in ((R1, 1), (R2, 2)):
        write_run(wh, rid, day)

    old = sim_rows("old", [0.0] * 4, [9.0] * 4, [10.0] * 4, [0] * 4, [0] * 4)[:1]
    wh.write(SIM_REQUESTS, table(SIM_REQUESTS, old), {"run_id": R1}, "old")
    wh.write(
        SCENARIOS,
        table(SCENARIOS, [{"scenario": "old", "policy": "vllm", "replicas": 1, "profile": "tiny",
                           "config_json": config("old", "vllm", 4), "summary_json": "{}"}]),
        {"run_id": R1},
        "scenarios",
    )  # fmt: skip

    a1, a_fast = [0.0, 1.0, 2.0, 3.0], [0.0, 0.5, 1.0, 1.5]
    sims = {
        "static-4": sim_rows("static-4", a1, [0.5, 0.4, 0.3, 0.2], [4.0] * 4, [0, 1, 2, 3],
                             [0] * 4),
        "vllm-2": sim_rows("vllm-2", a1, [0.1, 0.2, 0.3, 0.5], [1.0, 2.0, 3.0, 5.0],
                           [0, 0, 1, 9], [0] * 4),
        "vllm-4": sim_rows("vllm-4", a1, [0.1, 0.1, 0.1, 0.2], [1.0, 2.0, 3.0, 4.0],
                           [0] * 4, [0, 100, 300, 0]),
        "vllm-4-fast": sim_rows("vllm-4-fast", a_fast, [0.1, 0.2, 0.3, 0.3],
                                [1.0, 1.5, 2.0, 3.0], [0, 1, 1, 2], [0] * 4),
    }  # fmt: skip
    steps = {
        "static-4": [step("static-4", 0, 0, 0.0, 4.0, running=4, used=40)],
        "vllm-2": [step("vllm-2", 0, 0, 0.0, 5.0, running=2, waiting=2, used=60, query=1500)],
        "vllm-4": [
            step("vllm-4", 0, 0, 0.0, 1.0, running=1, used=10, query=100),
            step("vllm-4", 0, 1, 1.0, 2.0, num_steps=2, running=2, waiting=1, used=30,
                 preempt=1, query=200, hit=100),
            step("vllm-4", 0, 3, 3.0, 1.0, running=1, waiting=3, used=20, query=400, hit=300),
            step("vllm-4", 1, 0, 0.5, 0.5, running=1, used=50, query=100, hit=100),
        ],
        "vllm-4-fast": [],
    }  # fmt: skip
    meta = []
    for name, rows in sims.items():
        wh.write(SIM_REQUESTS, table(SIM_REQUESTS, rows), {"run_id": R2}, name)
        wh.write(SIM_STEPS, table(SIM_STEPS, steps[name]), {"run_id": R2}, name)
        policy = "static" if name.startswith("static") else "vllm"
        cfg = config(name, policy, 2 if name == "vllm-2" else 4, 0.5 if "fast" in name else 1.0)
        meta.append({"scenario": name, "policy": policy, "replicas": 2, "profile": "tiny",
                     "config_json": cfg, "summary_json": "{}"})  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": R2}, "scenarios")
    wh.init()  # every table's directory, as a command leaves it: a test run alone finds them
    return wh


# --- a run with the features of issue 25: swap preemption, speculation, scheduler CPU ---

R3 = "20240503T000000Z-cccc"
SWAP_BLOCK_BYTES = 1000  # the "swap" scenario's KV block, and its host link (B/s)
SWAP_LINK_BYTES_PER_S = 10_000.0
FEATURE_EXTRAS: dict[str, dict[str, Any]] = {
    "swap": {"preemption_mode": "swap", "swap_space_gb": 4, "async_scheduling": False,
             "enable_prefix_caching": False, "swap_host_blocks": 50,
             "swap_block_bytes": SWAP_BLOCK_BYTES,
             "swap_link_bytes_per_s": SWAP_LINK_BYTES_PER_S},
    "recompute": {"preemption_mode": "recompute", "async_scheduling": False,
                  "enable_prefix_caching": False},
    "spec": {"async_scheduling": False,
             "speculative": {"method": "eagle", "num_tokens": 3, "acceptance": [0.7] * 3,
                             "draft_cost": 0.05}},
    "cpu-async": {"async_scheduling": True, "sched_cpu_s": 0.002},
    "cpu-sync": {"async_scheduling": False, "sched_cpu_s": 0.002},
}  # fmt: skip


def feature_steps() -> dict[str, list[dict[str, Any]]]:
    """The sim_steps rows of ``build_features``' scenarios (tests/report/test_feature_views.py
    works its figures out from these)."""
    return {
        "swap": [
            step("swap", 0, 0, 0.0, 1.0, preempt=1, swap_out=4000, swap_in=0),
            step("swap", 0, 1, 1.0, 1.0, swap_out=0, swap_in=4000),
            step("swap", 0, 2, 2.5, 0.5, swap_out=0, swap_in=0),
            step("swap", 0, 3, 3.0, 1.0, preempt=2, swap_out=2000, swap_in=0),
            step("swap", 1, 0, 0.5, 0.5, preempt=1, swap_out=1000, swap_in=0),
            # host memory full: recomputed, nothing copied
            step("swap", 1, 1, 1.5, 0.5, preempt=1, swap_out=0, swap_in=0),
        ],
        "recompute": [
            step("recompute", 0, 0, 0.0, 2.0, preempt=3, swap_out=0, swap_in=0),
        ],
        "spec": [
            step("spec", 0, 0, 0.0, 0.5, drafts=0, accepted=0),  # a prefill: no drafts yet
            step("spec", 0, 1, 0.5, 0.5, drafts=6, accepted=4),
            step("spec", 0, 2, 1.0, 0.5, drafts=6, accepted=3),
            step("spec", 1, 0, 0.2, 0.3, drafts=3, accepted=3),
            step("spec", 1, 1, 2.5, 0.5, drafts=3, accepted=0),
        ],
        "cpu-async": [
            step("cpu-async", 0, 0, 0.0, 0.01, cpu=0.002, exposed=0.0),
            step("cpu-async", 0, 1, 0.01, 0.01, cpu=0.003, exposed=0.001),
            step("cpu-async", 1, 0, 0.0, 0.02, num_steps=2, cpu=0.004, exposed=0.0),
        ],
        "cpu-sync": [
            step("cpu-sync", 0, 0, 0.0, 0.012, cpu=0.002, exposed=0.002),
            step("cpu-sync", 0, 1, 0.012, 0.013, cpu=0.003, exposed=0.003),
        ],
    }


def build_features(root: Path) -> Warehouse:
    """A hand-written warehouse at ``root`` whose one replay run, R3, has a scenario that
    swapped ('swap'), one that preempted by recompute ('recompute'), one with speculative
    decoding ('spec') and two with scheduler CPU time ('cpu-async', 'cpu-sync'); their
    steps are ``feature_steps``. Each replays r1..r4 of ``build``'s first day."""
    wh = Warehouse(root)
    day1 = [
        request("r1", 0, 100, 10, model="m-a", tenant="t1"),
        request("r2", 1, 200, 20, model="m-a", tenant="t2"),
        request("r3", 2, 400, 5, model="m-b", tenant="t1"),
        request("r4", 3, 800, 1),
    ]
    wh.write(REQUESTS, table(REQUESTS, day1), {"date": "2024-05-01"}, "src-a")
    write_run(wh, R3, 3)
    a1 = [0.0, 1.0, 2.0, 3.0]
    meta = []
    for name, rows in feature_steps().items():
        sims = sim_rows(name, a1, [0.1, 0.2, 0.3, 0.5], [1.0, 2.0, 3.0, 5.0], [0] * 4, [0] * 4)
        wh.write(SIM_REQUESTS, table(SIM_REQUESTS, sims), {"run_id": R3}, name)
        wh.write(SIM_STEPS, table(SIM_STEPS, rows), {"run_id": R3}, name)
        cfg = {**json.loads(config(name, "vllm", 4)), **FEATURE_EXTRAS[name]}
        meta.append({"scenario": name, "policy": "vllm", "replicas": 2, "profile": "tiny",
                     "config_json": json.dumps(cfg), "summary_json": "{}"})  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": R3}, "scenarios")
    wh.init()
    return wh


def gateway_log(path: Path, n: int = 240, seed: int = 7) -> Path:
    """A gateway (LiteLLM) log whose model, tenant and file names are HTML/script."""
    rng = random.Random(seed)
    t = 0.0
    lines = []
    for i in range(n):
        t += rng.expovariate(20.0)
        start = T0 + timedelta(seconds=t)
        out = rng.randint(1, 300)
        lines.append(
            json.dumps(
                {
                    "request_id": f"req-{i}",
                    "startTime": _iso(start),
                    "completionStartTime": _iso(start + timedelta(seconds=0.2)),
                    "endTime": _iso(start + timedelta(seconds=1 + out * 0.02)),
                    "prompt_tokens": rng.randint(20, 1500),
                    "completion_tokens": out,
                    "model": EVIL_MODEL if i % 3 else "llama-3-8b",
                    "team_id": EVIL_TENANT if i % 2 else "team-a",
                    "status": "success",
                }
            )
        )
    lines.insert(5, '{"request_id": "bad", "startTime": "not a time"}')
    path.write_text("\n".join(lines) + "\n")
    return path


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def build_replayed(root: Path, logs: Path) -> Warehouse:
    """Ingest the gateway log with hostile names, then replay it through five scenarios.

    vllm at three concurrency caps (a concurrency sweep), vllm at twice the rate
    (a rate sweep with vllm-16) and static batching.
    """
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.sim.replay import replay
    from pipeline.sim.scenario import build_scenario

    logs.mkdir(parents=True, exist_ok=True)
    wh = Warehouse(root)
    result = ingest_logs([str(gateway_log(logs / EVIL_FILE))], wh, IngestOptions(quiet=True))
    assert result.ok
    base = {"profile": "llama-3-8b_h100-80gb_tp1", "num_gpu_blocks": 2000, "drop_too_long": True}
    vllm = {**base, "policy": "vllm"}
    scenarios = [
        build_scenario({**vllm, "name": f"vllm-{n}", "max_num_seqs": n}) for n in (4, 16, 64)
    ]
    scenarios.append(
        build_scenario({**vllm, "name": "vllm-16-x2", "max_num_seqs": 16, "time_scale": 0.5})
    )
    scenarios.append(
        build_scenario({**base, "policy": "static", "name": "static-16", "max_batch_size": 16,
                        "max_model_len": 2048})
    )  # fmt: skip
    replay(root, scenarios, quiet=True)
    return wh


SWEEP_POLICIES = ("vllm", "sarathi")
SWEEP_CAPS = (4, 8, 16, 32, 64)
SWEEP_SCALES = (1.0, 0.5, 0.25)


def build_sweep(root: Path, logs: Path) -> tuple[Warehouse, str, str, str]:
    """30 scenarios (2 policies x 5 caps x 3 time scales) and two capacity runs: one whose
    searches all answer, one whose SLO nothing meets. Returns (warehouse, sweep run id,
    capacity run id, 'none' capacity run id)."""
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.plan.capacity import SearchSpec, run_capacity
    from pipeline.plan.slo import parse_slos
    from pipeline.sim.replay import replay
    from pipeline.sim.scenario import build_scenario

    logs.mkdir(parents=True, exist_ok=True)
    wh = Warehouse(root)
    result = ingest_logs([str(gateway_log(logs / "gateway.jsonl", n=300, seed=11))], wh,
                         IngestOptions(quiet=True))  # fmt: skip
    assert result.ok
    base = {"profile": "llama-3-8b_h100-80gb_tp1", "num_gpu_blocks": 2000, "drop_too_long": True}
    scenarios = [
        build_scenario({**base, "policy": p, "name": f"{p}-{c}-x{int(1 / s)}",
                        "max_num_seqs": c, "time_scale": s})
        for p in SWEEP_POLICIES for c in SWEEP_CAPS for s in SWEEP_SCALES
    ]  # fmt: skip
    sweep_id = replay(root, scenarios, quiet=True).run_id
    specs = [SearchSpec("concurrency", hi=64), SearchSpec("rate", tolerance=0.1),
             SearchSpec("replicas", rate_scale=4.0, hi=8)]  # fmt: skip
    ok = run_capacity(root, {**base, "policy": "vllm", "name": "cap"},
                      parse_slos(["ttft_p99=2s", "tpot_p99=100ms"]), specs, quiet=True)  # fmt: skip
    none = run_capacity(root, {**base, "policy": "vllm", "name": "tight"},
                        parse_slos(["ttft_p99=5ms"]), [SearchSpec("concurrency", hi=8)],
                        quiet=True)  # fmt: skip
    return wh, sweep_id, ok.run_id, none.run_id


MANY_TOKENS = (2048, 4096, 8192, 16384)  # max_num_batched_tokens
MANY_CAPS = (16, 64, 256, 512, 1024)
MANY_SCALES = (1.0, 0.5, 0.25, 0.125, 0.0625)


def build_many(root: Path, logs: Path, n: int = 60) -> tuple[Warehouse, str, str]:
    """A short gateway log of two tenants replayed twice: through one scenario, and through
    100 (vLLM at 4 max_num_batched_tokens x 5 caps up to 1,024 x 5 time scales).
    Returns (warehouse, one-scenario run id, 100-scenario run id)."""
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.sim.replay import replay
    from pipeline.sim.scenario import build_scenario

    logs.mkdir(parents=True, exist_ok=True)
    wh = Warehouse(root)
    result = ingest_logs([str(gateway_log(logs / "gateway.jsonl", n=n, seed=5))], wh,
                         IngestOptions(quiet=True))  # fmt: skip
    assert result.ok
    base = {"profile": "llama-3-8b_h100-80gb_tp1", "num_gpu_blocks": 4000, "drop_too_long": True}
    one = replay(root, [build_scenario({**base, "policy": "vllm", "name": "vllm-64",
                                        "max_num_seqs": 64})], quiet=True).run_id  # fmt: skip
    scenarios = [
        build_scenario({**base, "policy": "vllm", "name": f"vllm-t{t}-c{c}-x{int(1 / s)}",
                        "max_num_batched_tokens": t, "max_num_seqs": c, "time_scale": s})
        for t in MANY_TOKENS for c in MANY_CAPS for s in MANY_SCALES
    ]  # fmt: skip
    hundred = replay(root, scenarios, quiet=True).run_id
    return wh, one, hundred


def specs(html: str) -> dict[str, dict[str, Any]]:
    """The chart specs a report page embeds, by chart id."""
    m = re.search(r'<script type="application/json" id="chart-specs">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def requests_file(path: Path, n: int, gap_s: float) -> Path:
    """A requests file of ``n`` short requests ``gap_s`` apart (prompts of 8 + i tokens,
    outputs of 3 to 5)."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        rows.append(request(f"req-{i:02d}", 0, 8 + i, 3 + i % 3))
        rows[-1]["arrival_time"] = datetime.fromtimestamp(1_700_000_000 + i * gap_s, UTC)
        rows[-1]["arrival_s"] = i * gap_s
    return write_table(table(REQUESTS, rows), REQUESTS, path)


# --- a fleet: two replica pools split by prompt length ---------------------------------

FLEET_TOML = """
name = "split"
policy = "vllm"
max_num_seqs = 32

[[pool]]
name = "short"
max_prompt_tokens = 1000
replicas = {short}

[[pool]]
name = "long"
replicas = {long}
max_num_seqs = 8
"""


def fleet_toml(path: Path, short: int = 1, long: int = 1) -> Path:
    """A fleet scenario file at ``path``: pool short (prompts <= 1,000 tokens) on ``short``
    replicas, pool long (the rest) on ``long`` replicas."""
    path.write_text(FLEET_TOML.format(short=short, long=long))
    return path


def build_fleet(root: Path) -> tuple[Warehouse, str, str]:
    """A warehouse of 300 requests replayed twice through the fleet of ``fleet_toml``
    (beside a one-pool scenario, 'single'): run A with one replica per pool, run B with
    pool long on two. Returns (warehouse, run A, run B)."""
    from pipeline.plan.slo import parse_slos
    from pipeline.sim.replay import replay
    from pipeline.sim.scenario import read_scenario_file

    small_warehouse_at(root, n=300, rate=20.0)
    runs = []
    for long in (1, 2):
        fleet = build_scenario(read_scenario_file(fleet_toml(root.parent / "f.toml", 1, long)))
        single = build_scenario({"name": "single", "policy": "vllm", "max_num_seqs": 32})
        result = replay(
            root, [fleet, single], quiet=True, intervals=False, slos=parse_slos(["ttft_p99=2s"])
        )
        runs.append(result.run_id)
    return Warehouse(root), runs[0], runs[1]


# An autoscaler that scales within the small warehouse's 300 requests at 40 req/s: two
# outstanding requests per replica, a tick a second, replicas routable 3 s after a start.
AUTOSCALE_TABLE = {
    "min_replicas": 1,
    "max_replicas": 4,
    "target": 2,
    "interval_s": 1,
    "startup_s": 3,
}
AUTOSCALE_COMMON = {
    "policy": "vllm",
    "cost": H100_8B_COST,
    "num_gpu_blocks": 2000,
    "max_model_len": 4096,
    "max_num_seqs": 8,
    "router": "least_outstanding",
}


def build_autoscaled(root: Path) -> tuple[Warehouse, str, str]:
    """A warehouse of 300 requests at 40 req/s replayed twice with the SLO ttft_p99=2s:
    run A through an autoscaled scenario ('auto', AUTOSCALE_TABLE) and a fleet ('fleet')
    whose pool 'short' (prompts <= 1,000 tokens) is autoscaled the same way and pool
    'long' has 2 fixed replicas; run B through one fixed scenario ('fixed', 2 replicas).
    Returns (warehouse, run A, run B)."""
    from pipeline.plan.slo import parse_slos
    from pipeline.sim.replay import replay

    small_warehouse_at(root, n=300, rate=40.0)
    slos = parse_slos(["ttft_p99=2s"])
    auto = build_scenario(
        {**AUTOSCALE_COMMON, "name": "auto", "replicas": 1, "autoscale": AUTOSCALE_TABLE}
    )
    short = {"name": "short", "max_prompt_tokens": 1000, "replicas": 1}
    fleet = build_scenario(
        {
            **AUTOSCALE_COMMON,
            "name": "fleet",
            "pool": [{**short, "autoscale": AUTOSCALE_TABLE}, {"name": "long", "replicas": 2}],
        }
    )
    fixed = build_scenario({**AUTOSCALE_COMMON, "name": "fixed", "replicas": 2})
    a = replay(root, [auto, fleet], quiet=True, intervals=False, slos=slos).run_id
    b = replay(root, [fixed], quiet=True, intervals=False, slos=slos).run_id
    return Warehouse(root), a, b


def assert_nested_close(got: Any, want: Any, where: str = "") -> None:
    """``got`` is ``want``, a nested summary entry (dicts of numbers, None, text), with its
    floats to 1e-12: a mean summed over a sharded replay's parts, in another order than
    the whole replay's, may differ in its last bit."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            assert_nested_close(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12), where
    else:
        assert got == want, where
