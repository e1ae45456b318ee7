"""The profile term of intervals: read from the profile, overridden by the scenario, checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.errors import ScenarioError
from pipeline.sim import cost_uncertainty
from pipeline.sim.cost_model import StepCost
from pipeline.sim.profiles import PROFILE_DIR
from pipeline.sim.scenario import build_scenario
from tests.helpers import H100_8B_COST

SHIPPED = "llama-3-8b_h100-80gb_tp1"


def _profile(tmp_path: Path, uncertainty: Any = None, *, raw: str | None = None) -> Path:
    data = json.loads((PROFILE_DIR / f"{SHIPPED}.json").read_text())
    if uncertainty is not None:
        data["uncertainty"] = uncertainty
    path = tmp_path / "calibrated.json"
    text = json.dumps(data)
    if raw is not None:  # JSON with a literal the json module would not write
        text = text[:-1] + f', "uncertainty": {raw}}}'
    path.write_text(text)
    return path


def test_a_profile_without_one_gets_the_default_and_says_so() -> None:
    for values in ({"profile": SHIPPED}, {}, {"cost": H100_8B_COST, "num_gpu_blocks": 100}):
        unc = build_scenario(values).cost_uncertainty
        assert unc.is_default and unc.log_sd == cost_uncertainty.DEFAULT_STEP_TIME_LOG_SD
        assert "default" in unc.describe()


def test_the_profile_states_it_and_the_scenario_key_wins(tmp_path: Path) -> None:
    path = _profile(tmp_path, {"step_time_log_sd": 0.04, "source": "fit to 412 steps"})
    unc = build_scenario({"profile": str(path)}).cost_uncertainty
    assert (unc.log_sd, unc.is_default) == (0.04, False)
    assert unc.source == "profile: fit to 412 steps"
    sc = build_scenario({"profile": str(path), "cost_uncertainty": 0})
    assert sc.cost_uncertainty.log_sd == 0.0
    assert sc.to_dict()["cost_uncertainty"] == 0.0
    assert sc.to_dict()["cost_uncertainty_source"] == "scenario key cost_uncertainty"


@pytest.mark.parametrize(
    ("value", "raw", "message"),
    [
        ("0.1", None, "uncertainty must be an object"),
        ({"source": "x"}, None, "uncertainty.step_time_log_sd is missing"),
        ({"step_time_log_sd": "0.1"}, None, "step_time_log_sd must be a number >= 0"),
        ({"step_time_log_sd": True}, None, "step_time_log_sd must be a number >= 0"),
        ({"step_time_log_sd": -0.2}, None, "must be a finite number >= 0"),
        (None, '{"step_time_log_sd": NaN}', "uncertainty.step_time_log_sd is not a finite number"),
        (
            None,
            '{"step_time_log_sd": Infinity}',
            "uncertainty.step_time_log_sd is not a finite number",
        ),
        ({"step_time_log_sd": 0.1, "source": 3}, None, "uncertainty.source must be text"),
    ],
)
def test_a_malformed_value_is_one_line_naming_the_file_and_key(
    tmp_path: Path, value: Any, raw: str | None, message: str
) -> None:
    path = _profile(tmp_path, value, raw=raw)
    with pytest.raises(ScenarioError, match=message) as err:
        build_scenario({"profile": str(path)})
    text = str(err.value)
    assert str(path) in text and "uncertainty" in text and "\n" not in text


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), "much"])
def test_a_bad_scenario_key_is_one_line(value: Any) -> None:
    with pytest.raises(ScenarioError, match="cost_uncertainty must be a") as err:
        build_scenario({"cost_uncertainty": value}, where="prod.toml")
    assert str(err.value).startswith("prod.toml: ") and "\n" not in str(err.value)


def test_scaling_the_cost_scales_every_step() -> None:
    """Every time coefficient scales, the token count and the share do not: the step time
    scales exactly, whatever the step (guards a coefficient added to the cost model)."""
    rng = np.random.default_rng(0)
    cost = StepCost(**{**H100_8B_COST, "seq_s": 1e-5, "flop_tokens_half": 300.0,
                       "overlap": 0.3, "prefill_fixed_s": 0.002})  # fmt: skip
    for factor in (0.8, 1.0, 1.37):
        scaled = cost_uncertainty.scaled_cost(cost, factor)
        assert scaled.flop_tokens_half == cost.flop_tokens_half
        assert scaled.overlap == cost.overlap
        for _ in range(50):
            p, a, seqs, d, ctx = (float(x) for x in rng.integers(0, 4000, 5))
            assert scaled.step_s(p, a * 10, seqs, d, ctx * 50) == pytest.approx(
                factor * cost.step_s(p, a * 10, seqs, d, ctx * 50), rel=1e-12
            )
    low, high = cost_uncertainty.cost_factors(0.1, 1.645)
    assert low == pytest.approx(np.exp(-0.1645)) and high * low == pytest.approx(1.0)
