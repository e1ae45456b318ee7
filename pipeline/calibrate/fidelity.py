"""Replay a real engine run (``groundtruth``) through the simulator and compare, stage by
stage, what the simulator predicts with what the engine measured.

The replay uses the run's recorded engine settings (scheduler caps, token budget,
chunking, prefix caching, KV blocks, tensor and data parallelism) and a profile: by
default the analytic one ``tracereplay profile new`` builds for the run's model and GPU,
with the front end of the run's timing (an HTTP client's for runs timed by a client,
none for runs timed at the engine core). Every stage of a run is replayed in one go, as
the engine ran them back to back, and each stage's statistics are over the requests that
arrived in its window.

Expert parallelism (an MoE spread over the GPUs of data-parallel engines, vLLM's
``--enable-expert-parallel``) is approximated: each engine reads its dense weights and
1 / EP of the experts per step, computes its own tokens' routed experts, and pays two
collectives per layer as a tensor-parallel group of EP GPUs would (docs/fidelity.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.calibrate.groundtruth import METRICS, STATS, GroundTruthRun, Stage, stats_of
from pipeline.sim.cost_model import StepCost
from pipeline.sim.hardware import (
    Efficiency,
    Runtime,
    load_efficiencies,
    load_gpus,
    load_models,
    resolve_runtime,
    with_runtime,
)
from pipeline.sim.prefix import build_keys
from pipeline.sim.roofline import allreduce_latency_s, profile_dict
from pipeline.sim.scenario import Scenario, build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import SimInput, SimResult
from pipeline.sim.summary import request_metrics

F64 = np.ndarray


@dataclass
class StageResult:
    """One stage: simulated statistics next to the measured ones."""

    stage: Stage
    simulated: dict[str, dict[str, float]]  # metric -> stat -> seconds
    requests: int  # replayed requests that arrived in the stage's window
    per_request: dict[str, F64] = field(default_factory=dict)  # simulated, window's requests

    def error(self, metric: str, stat: str) -> float:
        """simulated / measured - 1 (NaN where either is missing)."""
        m = self.stage.measured.get(metric, {}).get(stat, math.nan)
        s = self.simulated.get(metric, {}).get(stat, math.nan)
        return s / m - 1.0 if m and math.isfinite(m) and math.isfinite(s) else math.nan


def analytic_profile(
    run: GroundTruthRun,
    *,
    runtime: Runtime | None = None,
    efficiency: Efficiency | None = None,
    frontend: bool | None = None,
) -> dict[str, Any]:
    """The profile ``profile new`` gives the run's model on its GPU at its TP degree (and
    its expert parallelism), with the front end of its timing unless ``frontend`` says."""
    model = load_models()[run.model]
    gpu = load_gpus()[run.gpu]
    eff = efficiency or load_efficiencies()[run.gpu]
    runtime = runtime or resolve_runtime("vllm")
    with_fe = run.timing == "client" if frontend is None else frontend
    ep = run.expert_parallel if model.num_experts else 1
    if ep > 1:
        model = dataclasses.replace(model, num_experts=model.num_experts // ep)
    data = profile_dict(
        model, gpu, run.tensor_parallel, eff, f"{run.model}_{run.gpu}", {}, runtime, with_fe
    )
    if ep > 1:
        data["coefficients"] = _with_expert_parallel(
            data["coefficients"], model, gpu, with_runtime(eff, runtime), ep
        )
        data["memory"]["weight_bytes"] = _ep_weight_bytes(load_models()[run.model], ep)
    data["provenance"] = {"method": "analytic roofline", "runtime": runtime.name}
    return data


def _ep_weight_bytes(model: Any, ep: int) -> int:
    """One GPU of an expert-parallel group holds the dense weights and 1 / ep of the experts."""
    alone = dataclasses.replace(model, num_experts=model.num_experts // ep)
    return int(alone.params_total * model.dtype_bytes)


def _with_expert_parallel(
    c: dict[str, float], model: Any, gpu: Any, eff: Efficiency, ep: int
) -> dict[str, float]:
    """Two collectives per MoE layer over the ep GPUs (dispatch and combine), as the
    all-reduces of a tensor-parallel group of that size cost."""
    out = dict(c)
    layers = model.num_layers
    ring = 2 * (ep - 1) / ep
    out["comm_s_fixed"] = c["comm_s_fixed"] + 2 * layers * allreduce_latency_s(eff, ep)
    per_token = 2 * layers * model.hidden_size * model.dtype_bytes * ring
    out["comm_s_per_token"] = c["comm_s_per_token"] + per_token / (
        gpu.nvlink_bytes_per_s * eff.link_efficiency
    )
    return out


def run_scenario(
    run: GroundTruthRun, profile: dict[str, Any], workdir: Path, **overrides: Any
) -> Scenario:
    """The run's recorded settings with ``profile`` (written to ``workdir``)."""
    path = Path(workdir) / f"{profile.get('name', 'profile')}.json"
    path.write_text(json.dumps(profile))
    values = {**run.scenario, "profile": str(path), "name": "fidelity", "drop_too_long": True}
    values.update(overrides)
    return build_scenario(values, where=f"fidelity run {run.name}")


def sim_input(run: GroundTruthRun, scenario: Scenario) -> SimInput:
    """The run's requests as the loop takes them, with their prefix keys."""
    req = run.requests
    prompt, output, keep = scenario.cap_lengths(
        req.prompt_tokens, req.output_tokens, np.zeros(len(req), dtype=np.int64)
    )
    assert keep.all(), "a ground-truth prompt longer than the engine's max_model_len"
    keys = None
    if scenario.prefix_caching:
        hashes = pa.array(req.prefix_hashes, type=pa.list_(pa.uint64()))
        block = np.full(len(req), req.block_size, dtype=np.int64)
        keys = build_keys(prompt, block, hashes, scenario.memory.block_size)
    return SimInput(req.arrival_s, prompt, output, prefix=keys)


def replay_run(run: GroundTruthRun, scenario: Scenario) -> tuple[list[StageResult], SimResult]:
    """Replay every stage of the run and take each stage's statistics."""
    res = simulate(sim_input(run, scenario), scenario.engine())
    return stage_results(run, res), res


def stage_results(run: GroundTruthRun, res: SimResult) -> list[StageResult]:
    m = request_metrics(res)
    arrival = run.requests.arrival_s
    out = []
    for stage in run.stages:
        inside = (arrival >= stage.start_s) & (arrival < stage.end_s)
        per = {k: m[k][inside] for k in METRICS}
        out.append(
            StageResult(
                stage=stage,
                simulated={k: stats_of(v) for k, v in per.items()},
                requests=int(inside.sum()),
                per_request=per,
            )
        )
    return out


def replay_with_profile(
    run: GroundTruthRun, profile: dict[str, Any], **overrides: Any
) -> list[StageResult]:
    """Replay the run with a profile given as its JSON object."""
    with tempfile.TemporaryDirectory() as tmp:
        sc = run_scenario(run, profile, Path(tmp), **overrides)
        results, _ = replay_run(run, sc)
    return results


def error_rows(run: GroundTruthRun, results: list[StageResult], label: str) -> list[dict[str, Any]]:
    """One row per stage, metric and statistic: measured, simulated, error, the peer's."""
    rows = []
    for r in results:
        for metric in METRICS:
            for stat in STATS:
                measured = r.stage.measured.get(metric, {}).get(stat, math.nan)
                if not math.isfinite(measured):
                    continue
                peer = run.peer.get(metric, {}).get(stat, math.nan) if run.peer else math.nan
                rows.append(
                    {
                        "run": run.name,
                        "stage": r.stage.index,
                        "rate": r.stage.rate,
                        "profile": label,
                        "metric": metric,
                        "stat": stat,
                        "measured_s": measured,
                        "simulated_s": r.simulated[metric][stat],
                        "error": r.error(metric, stat),
                        "peer_s": peer,
                        "peer_error": peer / measured - 1.0 if math.isfinite(peer) else math.nan,
                    }
                )
    return rows


def step_ms(profile: dict[str, Any]) -> dict[str, float]:
    """A profile's reference steps, ms: a batch-1 and a batch-32 decode at 1,000 tokens of
    context, a 1,000-token prefill."""
    c = StepCost.from_dict(profile["coefficients"])
    return {
        "decode_1": c.decode_step_s(1, 1000) * 1e3,
        "decode_32": c.decode_step_s(32, 1000) * 1e3,
        "prefill_1000": c.prefill_step_s(1, 1000) * 1e3,
    }


# --- calibrated predictions -------------------------------------------------------------

QUANTILE_OF = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "mean": -1.0}


def _stage_masks(run: GroundTruthRun, stages: list[int]) -> list[np.ndarray]:
    a = run.requests.arrival_s
    return [(a >= run.stages[i].start_s) & (a < run.stages[i].end_s) for i in stages]


def _stats_loss(
    masks: list[np.ndarray], stats: list[list[tuple[str, float, float]]], out_tokens: np.ndarray
) -> Any:
    def loss(lat: Any) -> float:
        errs = []
        for mask, items in zip(masks, stats, strict=True):
            for metric, q, obs in items:
                v = _simulated_metric(lat, metric, out_tokens)[mask]
                v = v[np.isfinite(v)]
                if not len(v) or not obs > 0:
                    continue
                s = float(v.mean()) if q < 0 else float(np.quantile(v, q))
                errs.append(math.log(max(s, 1e-9) / obs) ** 2)
        return float(np.mean(errs)) if errs else math.inf

    return loss


def _simulated_metric(lat: Any, metric: str, out_tokens: np.ndarray) -> np.ndarray:
    if metric == "ttft_s":
        return np.asarray(lat.ttft_s)
    if metric == "tpot_s":
        return np.asarray(lat.tpot_s)
    return np.asarray(lat.ttft_s) + np.nan_to_num(lat.tpot_s) * np.maximum(out_tokens - 1, 0)


def fit_run(
    run: GroundTruthRun,
    profile: dict[str, Any],
    *,
    stages: list[int] | None = None,
    requests: np.ndarray | None = None,
    max_iterations: int = 8,
) -> Any:
    """``calibrate observed``'s fit of ``profile`` to the run: to its per-request latencies
    (runs that have them; ``requests`` restricts them to some), else to the statistics of
    ``stages`` (default all). Returns the fitted ``observed_fit.Params`` (relative to
    ``profile``)."""
    from pipeline.calibrate.observed import Latencies, fit_loop, replay_loss
    from pipeline.calibrate.observed import _targets as request_targets
    from pipeline.calibrate.observed_fit import QuantileTargets

    stages = list(range(len(run.stages))) if stages is None else stages
    with tempfile.TemporaryDirectory() as tmp:
        sc = run_scenario(run, profile, Path(tmp))
        inp = sim_input(run, sc)
        per = run.stages[0].per_request if len(run.stages) == 1 else {}
        if per:
            keep = np.ones(len(run.requests), dtype=bool) if requests is None else requests
            obs = Latencies(
                np.where(keep, per["ttft_s"], np.nan), np.where(keep, per["tpot_s"], np.nan)
            )
            stage_list, *_ = fit_loop(
                inp,
                sc,
                lambda replayed: request_targets(obs, replayed),
                lambda replayed: replay_loss(obs, replayed),
                max_iterations=max_iterations,
            )
        else:
            masks = _stage_masks(run, stages)
            stats = [
                [
                    (metric, QUANTILE_OF[stat], value)
                    for metric in ("ttft_s", "e2e_s")
                    for stat, value in run.stages[i].measured[metric].items()
                    if math.isfinite(value)
                ]
                for i in stages
            ]
            target = QuantileTargets(masks, stats)
            out = inp.output_tokens.astype(np.float64)
            stage_list, *_ = fit_loop(
                inp,
                sc,
                lambda _replayed: target,
                _stats_loss(masks, stats, out),
                max_iterations=max_iterations,
            )
    return stage_list[-1].params


def mean_params(fits: list[Any]) -> Any:
    """The geometric mean of fits' factors, the mean of their absolute terms."""
    from pipeline.calibrate.observed_fit import Params

    return Params.of(np.mean([p.vector() for p in fits], axis=0))


def calibrated_profile(profile: dict[str, Any], params: Any) -> dict[str, Any]:
    """``profile`` with a fit's factors, launch cost and front end."""
    out = json.loads(json.dumps(profile))
    out["coefficients"] = params.apply(StepCost.from_dict(profile["coefficients"])).to_dict()
    out["frontend"] = {**params.frontend.to_dict(), "source": "calibrated"}
    return out
