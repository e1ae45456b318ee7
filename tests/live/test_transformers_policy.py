"""The simulator's ``transformers`` policy decides every step as the installed engine does.

All requests are queued before the engine starts, so its decisions do not depend on how
long a step takes: the sequence of batches (requests and tokens per step) must be the
one the simulator replays, step for step, soft resets included. The engine runs for
real; its scheduler's ``schedule_batch`` is wrapped only to record what it returned.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from tests.extras import require

require("torch")
require("transformers")

import transformers  # noqa: E402
from transformers import GenerationConfig  # noqa: E402
from transformers.generation.continuous_batching import requests as cb_requests  # noqa: E402
from transformers.generation.continuous_batching import scheduler as cb_scheduler  # noqa: E402

from pipeline.live.inprocess import cb_config  # noqa: E402
from pipeline.live.model import load_model, random_prompts  # noqa: E402
from pipeline.sim.cost_model import StepCost  # noqa: E402
from pipeline.sim.scenario import build_scenario  # noqa: E402
from pipeline.sim.simulate import simulate  # noqa: E402
from pipeline.sim.state import (  # noqa: E402
    R_PREEMPT,
    S_DECODE,
    S_NUM_STEPS,
    S_PREFILL,
    S_RUNNING,
    SimInput,
)


def engine_steps(
    prompts: np.ndarray, outputs: np.ndarray, **settings: Any
) -> tuple[list[tuple[int, int]], int]:
    """(requests, tokens) of every step the engine ran, and how many soft resets it made."""
    steps: list[tuple[int, int]] = []
    originals = {}
    for cls in (cb_scheduler.FIFOScheduler, cb_scheduler.PrefillFirstScheduler):
        original = cls.schedule_batch
        originals[cls] = original

        def recorded(self, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            out = _original(self, *args, **kwargs)
            batch = out[0]
            if batch:
                ids = [f.state.request_id for f in batch]
                assert all(not i.startswith("__") for i in ids)
                steps.append((len(batch), sum(int(f.query_length) for f in batch)))
            return out

        cls.schedule_batch = recorded  # type: ignore[method-assign]
    resets = [0]
    soft_reset = cb_requests.RequestState.create_equivalent_initial_request

    def counted(self):  # type: ignore[no-untyped-def]
        resets[0] += 1
        return soft_reset(self)

    cb_requests.RequestState.create_equivalent_initial_request = counted  # type: ignore[method-assign]
    try:
        loaded = load_model("tiny", device="cpu")
        manager = loaded.model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, eos_token_id=-1),
            continuous_batching_config=cb_config(**settings),
        )
        ids = random_prompts(prompts, 512, seed=0)
        for k, (ids_k, out) in enumerate(zip(ids, outputs, strict=True)):
            manager.add_request(ids_k, request_id=f"q{k}", max_new_tokens=int(out), eos_token_id=-1)
        try:
            manager.start()
            got = {}
            while len(got) < len(prompts):
                res = manager.get_result(timeout=30)
                assert res is not None, "the engine stopped answering"
                assert res.error is None, res.error
                assert len(res.generated_tokens) == outputs[int(res.request_id[1:])]
                got[res.request_id] = res
        finally:
            manager.stop(block=True, timeout=30)
    finally:
        cb_requests.RequestState.create_equivalent_initial_request = soft_reset  # type: ignore[method-assign]
        for cls, original in originals.items():
            cls.schedule_batch = original  # type: ignore[method-assign]
    return steps, resets[0]


def sim_steps(prompts: np.ndarray, outputs: np.ndarray, **settings: Any) -> tuple[list, int]:
    sc = build_scenario(
        {
            "policy": "transformers",
            "cost": {**{f.name: 0.0 for f in fields(StepCost)}, "fixed_s": 0.01},
            "num_gpu_blocks": settings["num_blocks"],
            "block_size": settings["block_size"],
            "max_model_len": 4096,
            "max_batch_tokens": settings["max_batch_tokens"],
            "scheduler_type": settings["scheduler"],
            "max_requests_per_batch": settings["max_requests_per_batch"],
        }
    )
    n = len(prompts)
    res = simulate(SimInput(np.zeros(n), prompts, outputs), sc.engine())
    rows = np.repeat(res.st[:, [S_RUNNING, S_PREFILL, S_DECODE]], res.st[:, S_NUM_STEPS], axis=0)
    return [(int(a), int(b + c)) for a, b, c in rows], int(res.rq[:, R_PREEMPT].sum())


CASES = [
    # roomy cache, budget splits prompts
    dict(num_blocks=64, block_size=16, max_batch_tokens=48, scheduler="fifo"),
    dict(num_blocks=64, block_size=16, max_batch_tokens=48, scheduler="prefill_first"),
    # tight cache: safety margin, starvation and soft resets
    dict(num_blocks=9, block_size=16, max_batch_tokens=64, scheduler="fifo"),
    dict(num_blocks=9, block_size=16, max_batch_tokens=64, scheduler="prefill_first"),
    # a cap on requests per step
    dict(num_blocks=32, block_size=8, max_batch_tokens=100, scheduler="fifo"),
]


@pytest.mark.parametrize("settings", CASES, ids=lambda s: f"{s['scheduler']}-{s['num_blocks']}")
def test_simulated_steps_are_the_engine_steps(settings: dict[str, Any]) -> None:
    rng = np.random.default_rng(11)
    n = 12
    prompts = rng.integers(5, 70, n).astype(np.int64)
    outputs = rng.integers(1, 25, n).astype(np.int64)
    settings = {"max_requests_per_batch": 5 if settings["block_size"] == 8 else 64, **settings}
    want, want_resets = engine_steps(prompts, outputs, **settings)
    got, got_resets = sim_steps(prompts, outputs, **settings)
    old = tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 18)
    if old and got != want and settings["num_blocks"] < 16:
        # 5.17 allocates one block more at block boundaries and checks the safety margin
        # before each candidate (docs/replay.md): under KV pressure its steps differ
        pytest.xfail("the policy follows transformers 5.18+; 5.17 allocates blocks differently")
    assert got == want
    assert got_resets == want_resets
