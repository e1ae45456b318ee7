"""Prefix caching on the real Mooncake conversation trace (12,031 requests, 512-token hashes).

The trace is ingested once, as a user would; the scenario is one Llama-3-70B
on 8 H200s with Llama-3.1's 131,072-token context (the trace's longest prompt
is 126,195 tokens), the trace replayed at a quarter of its rate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.contracts import REQUESTS
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.sim.replay_input import prepare, read_requests
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import R_CACHED, R_PROMPT, SimResult
from pipeline.sim.summary import request_metrics, summarize
from pipeline.warehouse import Warehouse
from tests.helpers import TRACES_RAW
from tests.sim.test_differential import check_equal, check_invariants

MOONCAKE = TRACES_RAW / "mooncake" / "conversation_trace.jsonl"
BASE = {
    "profile": "llama-3-70b_h200_tp8",
    "max_model_len": 131072,
    "time_scale": 4.0,
}
UNBOUNDED = 10**8  # KV blocks: more than the trace's prompts and outputs hold


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    if not MOONCAKE.exists():
        pytest.fail(f"the real public traces are expected beside the project at {TRACES_RAW}")
    wh = Warehouse(tmp_path_factory.mktemp("mooncake") / "wh")
    ingest_logs([str(MOONCAKE)], wh, IngestOptions(quiet=True))
    return read_requests(wh.files(REQUESTS))


def independent_hit_rate(engine_block: int | None = None) -> float:
    """Longest leading run of previously seen block ids, in full 512-token blocks, at most
    prompt - 1 tokens; over all prompt tokens. Straight from the JSON lines. With an
    ``engine_block`` size, a prompt whose every full block hits and whose partial last
    block's id was seen (the same prompt) also hits the engine blocks of that block, up to
    prompt - 1 tokens."""
    seen: set[int] = set()
    hit = total = 0
    for line in MOONCAKE.read_text().splitlines():
        rec = json.loads(line)
        length, ids = rec["input_length"], rec["hash_ids"]
        full = ids[: length // 512]
        k = 0
        while k < min(len(full), (length - 1) // 512) and full[k] in seen:
            k += 1
        hit += k * 512
        partial = ids[len(full) :]
        if engine_block and partial and k == len(full) and partial[0] in seen:
            hit += (length - 1 - k * 512) // engine_block * engine_block
        total += length
        seen.update(ids if engine_block else full)
    return hit / total


def replay(frame: pl.DataFrame, **values: Any) -> tuple[SimResult, dict[str, Any]]:
    sc = build_scenario({**BASE, **values})
    prep = prepare(frame, sc)
    res = simulate(prep.inp, sc.engine())
    check_invariants(prep.inp, sc, res)  # completes once, KV <= capacity, hits <= prompt - 1
    return res, {**summarize(res), **prep.prefix_info}


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_unbounded_cache_hit_rate_is_the_trace_s_own(mooncake: pl.DataFrame, policy: str) -> None:
    res, s = replay(mooncake, policy=policy, num_gpu_blocks=UNBOUNDED)
    assert independent_hit_rate() == pytest.approx(0.3734, abs=5e-4)  # whole blocks only
    expected = independent_hit_rate(16 if policy == "vllm" else 1)  # and the tails
    assert expected == pytest.approx(0.3736, abs=5e-4)
    if policy == "vllm":
        assert s["prefix_token_hit_rate"] == pytest.approx(expected, rel=1e-12)
    else:  # SGLang caches a batch's prompts after it: two in one batch both miss what they share
        assert expected - 1e-4 < s["prefix_token_hit_rate"] <= expected
    assert s["prefix_evicted_blocks"] == 0
    assert s["prefix_request_hit_rate"] > 0.999  # every prompt starts with the system prompt
    assert s["prefix_bridged"] and s["prefix_unit_tokens"] == [512]
    assert (res.rq[:, R_CACHED] <= res.rq[:, R_PROMPT] - 1).all()


def test_whole_blocks_only_is_the_trace_s_count_of_full_blocks(mooncake: pl.DataFrame) -> None:
    s = replay(mooncake, policy="vllm", num_gpu_blocks=UNBOUNDED, prefix_partial_blocks=False)[1]
    assert s["prefix_token_hit_rate"] == pytest.approx(independent_hit_rate(), rel=1e-12)


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_hit_rate_never_falls_as_the_cache_grows(mooncake: pl.DataFrame, policy: str) -> None:
    rates = [
        replay(mooncake, policy=policy, block_size=16, num_gpu_blocks=blocks * 32 + 1)[1][
            "prefix_token_hit_rate"
        ]
        for blocks in (1_000, 5_000, 20_000, UNBOUNDED // 32)
    ]
    assert rates == sorted(rates) and rates[0] < rates[-1]


def test_sglang_queues_where_vllm_preempts(mooncake: pl.DataFrame) -> None:
    # 256k tokens of KV: vLLM without the full-sequence check admits on the step's needs and
    # preempts when decodes outgrow the pool; SGLang reserves the expected decodes and keeps
    # requests waiting instead; vLLM's default full-sequence check preempts less
    both = {p: replay(mooncake, policy=p, block_size=16, num_gpu_blocks=16_001,
                      **({"scheduler_reserve_full_isl": False} if p == "vllm" else {}))
            for p in ("vllm", "sglang")}  # fmt: skip
    (v_res, vllm), (s_res, sglang) = both["vllm"], both["sglang"]
    assert vllm["num_preemptions"] > 10 * max(sglang["num_preemptions"], 1)
    full = replay(mooncake, policy="vllm", block_size=16, num_gpu_blocks=16_001)[1]
    assert full["num_preemptions"] < vllm["num_preemptions"]
    v_queue = float(np.mean(request_metrics(v_res)["queue_s"]))
    s_queue = float(np.mean(request_metrics(s_res)["queue_s"]))
    assert s_queue > v_queue


@pytest.mark.parametrize("policy", ["vllm", "sglang", "tgi"])
def test_fast_equals_reference_on_the_trace_head(mooncake: pl.DataFrame, policy: str) -> None:
    # the first 120 requests, with a cache of 64k tokens: hits, evictions, preemptions
    sc = build_scenario(
        {**BASE, "policy": policy, "num_requests": 120, "block_size": 16, "num_gpu_blocks": 8_001}
    )
    check_equal(prepare(mooncake, sc).inp, sc)


def test_tracereplay_replay_reports_the_bridging(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipeline.cli import cli

    wh = tmp_path / "wh"
    ingest_logs([str(MOONCAKE)], Warehouse(wh), IngestOptions(quiet=True))
    scenario = tmp_path / "mooncake.toml"
    scenario.write_text(
        'policy = "vllm"\nprofile = "llama-3-70b_h200_tp8"\nmax_model_len = 131072\n'
        "time_scale = 4.0\nnum_requests = 500\nprefix_warmup_requests = 100\n"
    )
    out = CliRunner().invoke(
        cli, ["replay", "--warehouse", str(wh), "--scenario", str(scenario), "--json", "--quiet"]
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)["scenarios"]["mooncake"]["summary"]
    assert summary["completed"] == 400 and summary["num_warmup_requests"] == 100
    assert summary["prefix_bridged"] and "512-token units" in summary["prefix_bridging"]
    assert summary["prefix_token_hit_rate"] > 0.1
