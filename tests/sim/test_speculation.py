"""Speculative decoding (speculation.py): the scenario table, the draws, what a replay does."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest

from pipeline.errors import ScenarioError
from pipeline.sim.replay_tables import sim_requests_table
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.speculation import (
    GOLDEN,
    MASK64,
    STRIDE,
    Speculation,
    _mix_py,
    accepted,
    accepted_py,
)
from pipeline.sim.state import (
    CF_SPEC_RATE,
    NCFG,
    NCFGF,
    R_GENERATED,
    R_OUTPUT,
    R_SPEC_ACC,
    R_SPEC_DRAFT,
    S_DECODE,
    S_SPEC_ACC,
    S_SPEC_DRAFT,
    SimInput,
)
from pipeline.sim.summary import summarize

COST = {
    "fixed_s": 2e-3,
    "flop_s_per_token": 2e-5,
    "flop_s_per_attn": 1e-8,
    "mem_s_weights": 5e-3,
    "mem_s_per_kv_token": 1e-6,
    "mem_s_per_token": 1e-7,
    "comm_s_fixed": 0.0,
    "comm_s_per_token": 0.0,
}


def _values(**spec: Any) -> dict[str, Any]:
    return {
        "policy": "vllm",
        "cost": COST,
        "num_gpu_blocks": 400,
        "max_model_len": 512,
        "async_scheduling": False,
        "speculative": {"method": "eagle", "num_tokens": 3, "acceptance": 0.7} | spec,
    }


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"acceptance": float("nan")}, "speculative.acceptance"),
        ({"acceptance": 1.5}, "speculative.acceptance"),
        ({"acceptance": -0.1}, "speculative.acceptance"),
        ({"acceptance": [0.5, 0.5]}, "has 2 rates but num_tokens is 3"),
        ({"acceptance": [0.5, "x", 0.5]}, "speculative.acceptance[1]"),
        ({"num_tokens": 0}, "speculative.num_tokens"),
        ({"num_tokens": 1000}, "speculative.num_tokens"),
        ({"method": "medusa"}, "speculative.method must be one of"),
        ({"acceptance": "measured"}, "vllm:spec_decode_num_accepted_tokens"),
        ({"colour": 1}, "unknown key speculative.colour"),
    ],
)
def test_bad_tables_get_one_line_errors(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        build_scenario(_values(**spec))
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_other_policies_and_async_are_refused() -> None:
    with pytest.raises(ScenarioError, match="policy vllm only"):
        build_scenario(_values() | {"policy": "sglang", "async_scheduling": None})
    with pytest.raises(ScenarioError, match="async_scheduling = false"):
        build_scenario(_values() | {"async_scheduling": True})


def _packed(rates: tuple[float, ...]) -> npt.NDArray[np.int64]:
    cfg, cfgf = np.zeros(NCFG, dtype=np.int64), np.zeros(NCFGF)
    Speculation("eagle", len(rates), rates, 0.05).pack(cfg, cfgf, 4096)
    assert (cfgf[CF_SPEC_RATE : CF_SPEC_RATE + len(rates)] == rates).all()
    return cfg


def test_compiled_and_python_draws_agree() -> None:
    rates = (0.9, 0.6, 0.3, 0.8)
    cfg = _packed(rates)
    for seed in (0, 7, 2**40):
        for i in range(20):
            for g in range(0, 200, 13):
                assert accepted(cfg, seed, i, g, 4) == accepted_py(rates, seed, i, g, 4)


def test_integer_thresholds_draw_as_the_float_compare_at_its_edges() -> None:
    # a rate exactly on a draw's uniform rejects it (u < rate is false), one ulp of the
    # draw's 53 bits above accepts it; rates 0 and 1 never and always accept
    seed, i, g = 5, 3, 11
    h = _mix_py((seed * GOLDEN + i) & MASK64)
    m = _mix_py((h + g * STRIDE + 1) & MASK64) >> 11
    for rate, want in ((m / 2**53, 0), ((m + 1) / 2**53, 1), (0.0, 0), (1.0, 1)):
        assert accepted_py((rate,), seed, i, g, 1) == want, rate
        assert accepted(_packed((rate,)), seed, i, g, 1) == want, rate


def test_draws_follow_the_rates() -> None:
    rates = (0.8, 0.5)
    got = np.array([accepted_py(rates, 3, i, g, 2) for i in range(100) for g in range(100)])
    # P(a >= 1) = 0.8, P(a = 2) = 0.8 * 0.5; 10,000 draws: well within 0.02
    assert abs((got >= 1).mean() - 0.8) < 0.02
    assert abs((got == 2).mean() - 0.4) < 0.02


def _replay(acceptance: float | None, k: int = 3) -> tuple[Any, Any]:
    rng = np.random.default_rng(5)
    n = 40
    inp = SimInput(
        np.sort(rng.uniform(0, 4, n)),
        rng.integers(10, 200, n).astype(np.int64),
        rng.integers(20, 120, n).astype(np.int64),
    )
    values = _values(num_tokens=k, acceptance=acceptance or 0.0)
    if acceptance is None:
        del values["speculative"]
    sc = build_scenario(values)
    return simulate(inp, sc.engine()), sc


def test_accepted_tokens_shorten_decoding() -> None:
    off, _ = _replay(None)
    none, _ = _replay(0.0)
    full, _ = _replay(1.0)
    assert off.st[:, S_SPEC_DRAFT].sum() == 0
    assert none.st[:, S_SPEC_ACC].sum() == 0 and none.st[:, S_SPEC_DRAFT].sum() > 0
    assert (full.st[:, S_SPEC_ACC] == full.st[:, S_SPEC_DRAFT]).all()
    # every accepted draft saves a step; rejected ones only cost their rows
    assert full.num_steps < none.num_steps
    assert none.st[:, S_DECODE].sum() > off.st[:, S_DECODE].sum()
    s = summarize(full)
    assert s["spec_acceptance_rate"] == 1.0
    assert "spec_draft_tokens" not in summarize(off)


# A request past max_model_len, given to simulate() directly (Scenario.cap_lengths not
# called): the scheduler bounds a running request's tokens by max_model_len - computed - 1,
# and a prompt longer than max_model_len, chunked, reaches a chunk of no tokens, which the
# loop scheduled step after step, the timeline growing without end. In a child process
# under a memory cap and a timeout, so that the old behaviour fails the test instead of
# hanging it.
_TOO_LONG = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SimInput
sc = build_scenario({values!r})
try:
    simulate(SimInput(np.array([0.0]), np.array([{prompt}]), np.array([{output}])), sc.engine())
except ValueError as exc:
    print("refused:", exc)
    sys.exit(0)
print("ran")
"""
_CHUNKED = {"enable_chunked_prefill": True, "max_num_batched_tokens": 16, "max_num_seqs": 4}


@pytest.mark.parametrize(
    ("prompt", "output"),
    [(100, 5), (64, 2), (40, 25)],
    ids=["prompt-past-chunked", "prompt-at", "prompt-plus-output-past"],
)
def test_simulate_refuses_requests_past_max_model_len(prompt: int, output: int) -> None:
    values = _values() | _CHUNKED | {"max_model_len": 64}
    code = _TOO_LONG.format(values=values, prompt=prompt, output=output)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert line.startswith("refused:") and "max_model_len (64)" in line, line
    assert "\n" not in line


def test_requests_that_fit_max_model_len_run() -> None:
    # the limits themselves: prompt + output = max_model_len, and the longest prompt
    sc = build_scenario(_values() | _CHUNKED | {"max_model_len": 64})
    inp = SimInput(np.array([0.0, 0.1]), np.array([40, 63]), np.array([24, 1]))
    res = simulate(inp, sc.engine())
    assert (res.rq[:, R_GENERATED] == inp.output_tokens).all()


def test_each_request_counts_its_drafts_and_accepted_tokens() -> None:
    # per request, over its verify steps: they add up to the steps' counts, never accept
    # more than generated past the prompt's token, and sim_requests carries them (null off)
    off, _ = _replay(None)
    on, sc = _replay(0.6)
    assert not off.rq[:, R_SPEC_DRAFT].any() and not off.rq[:, R_SPEC_ACC].any()
    assert on.rq[:, R_SPEC_DRAFT].sum() == on.st[:, S_SPEC_DRAFT].sum() > 0
    assert on.rq[:, R_SPEC_ACC].sum() == on.st[:, S_SPEC_ACC].sum() > 0
    assert (on.rq[:, R_SPEC_ACC] <= on.rq[:, R_SPEC_DRAFT]).all()
    assert (on.rq[:, R_SPEC_ACC] <= on.rq[:, R_OUTPUT] - 1).all()
    ids = pa.array([str(j) for j in range(len(on.rq))])
    table = sim_requests_table(sc.name, ids, on)
    assert table["num_accepted_tokens"].to_pylist() == on.rq[:, R_SPEC_ACC].tolist()
    assert table["num_draft_tokens"].to_pylist() == on.rq[:, R_SPEC_DRAFT].tolist()
    assert table.schema.field("num_draft_tokens").type == pa.int32()
    plain = sim_requests_table(sc.name, ids, off)
    assert plain["num_accepted_tokens"].null_count == len(off.rq)
