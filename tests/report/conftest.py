"""A tiny hand-written warehouse: five requests, two replay runs, four scenarios.

Every figure the SQL tests expect is worked out by hand from these rows (see
test_sql.py). The latest run, R2, replays r1..r4 through four scenarios:

The gateway logged cached_tokens for r1 (50 of 100) and r3 (100 of 400).

    scenario     policy  cap  time_scale  ttft_s of r1..r4      queue depth met
    static-4     static   4   1.0         0.5 0.4 0.3 0.2       0 1 2 3
    vllm-2       vllm     2   1.0         0.1 0.2 0.3 0.5       0 0 1 9
    vllm-4       vllm     4   1.0         0.1 0.1 0.1 0.2       0 0 0 0
    vllm-4-fast  vllm     4   0.5         0.1 0.2 0.3 0.3       0 1 1 2

R1 is older and replays r1 only, through one scenario.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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
)
from pipeline.warehouse import Warehouse

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


@pytest.fixture(scope="session")
def replayed_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    tmp = tmp_path_factory.mktemp("replayed")
    return build_replayed(tmp / "wh", tmp / "logs")


@pytest.fixture(scope="session")
def tiny_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build(tmp_path_factory.mktemp("tiny") / "wh")


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


@pytest.fixture(scope="session")
def sweep_warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str, str, str]:
    tmp = tmp_path_factory.mktemp("sweep")
    return build_sweep(tmp / "wh", tmp / "logs")
