"""Reading the real vLLM runs of ../shared/fidelity: each format, checked against the files
derived from it there (replay.csv, examples.csv, stages.csv), and bad input."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.calibrate.groundtruth import (
    read_inference_perf,
    read_llmservingsim,
    shared_prefix_workload,
)
from pipeline.errors import ConfigError

FIDELITY = Path(__file__).resolve().parents[2].parent / "shared" / "fidelity"
LSS = FIDELITY / "llmservingsim-vllm"
BLIS = FIDELITY / "blis-training-h100"


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file (closed once read)."""
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def fidelity() -> Path:
    if not FIDELITY.exists():
        pytest.fail(f"the real engine runs are expected beside the project at {FIDELITY}")
    return FIDELITY


def _lss_runs() -> list[Path]:
    return sorted(p.parents[1] for p in (LSS / "bench" / "examples").glob("*/*/vllm/meta.json"))


@pytest.mark.parametrize("run_dir", _lss_runs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_llmservingsim_runs_read_as_their_derived_files_say(fidelity: Path, run_dir: Path) -> None:
    run = read_llmservingsim(run_dir, LSS / "workloads")
    assert run.source == "llmservingsim" and run.timing == "engine"
    assert len(run.requests) == 300 and len(run.stages) == 1
    # replay.csv (derived by the data set's keeper): arrival at the engine's queueing,
    # TTFT and E2E from vLLM's own timestamps
    derived = read_csv(run_dir / "vllm" / "replay.csv")
    arrival = np.array([float(r["arrival_s"]) for r in derived])
    ttft = np.array([float(r["ttft_ms"]) for r in derived]) / 1e3
    order = np.argsort(arrival, kind="stable")
    assert run.requests.arrival_s == pytest.approx(arrival[order], abs=1e-5)
    assert run.stages[0].per_request["ttft_s"] == pytest.approx(ttft[order], abs=2e-6)
    # examples.csv: the run's percentiles
    row = next(
        r
        for r in read_csv(LSS / "examples.csv")
        if r["example"] == f"{run_dir.parent.name}/{run_dir.name}"
    )
    m = run.stages[0].measured
    for metric, col in (("ttft_s", "ttft"), ("e2e_s", "e2e"), ("tpot_s", "tpot")):
        for stat in ("p50", "p90", "p99", "mean"):
            assert m[metric][stat] * 1e3 == pytest.approx(float(row[f"{col}_ms_{stat}"]), abs=0.02)
    assert run.scenario["max_num_seqs"] == int(row["max_num_seqs"])
    assert run.scenario["max_num_batched_tokens"] == int(row["max_num_batched_tokens"])
    if row["num_gpu_blocks"]:
        assert run.scenario["num_gpu_blocks"] == int(row["num_gpu_blocks"])
    # every prompt hashed in 16-token blocks from its token ids, the generated tokens too
    pairs = zip(run.requests.prefix_hashes, run.requests.prompt_tokens, strict=True)
    assert all(len(h) == p // 16 for h, p in pairs)
    assert sum(map(len, run.requests.output_hashes)) > 0
    # the peer's prediction read from its summary
    assert set(run.peer) == {"ttft_s", "tpot_s", "e2e_s"} and run.peer_name == "LLMServingSim"


def test_llmservingsim_data_parallel_expert_parallel_run(fidelity: Path) -> None:
    run = read_llmservingsim(
        LSS / "bench" / "examples" / "RTXPRO6000" / "Qwen3-30B-A3B-Instruct-2507", LSS / "workloads"
    )
    assert run.model == "qwen3-30b-a3b" and run.gpu == "rtx-pro-6000"
    assert run.replicas == 2 and run.expert_parallel == 2 and run.tensor_parallel == 1
    assert run.scenario["router"] == "least_outstanding"


def _experiments() -> list[Path]:
    return sorted(
        p.parent
        for p in (BLIS / "default_args").glob("*/exp-config.yaml")
        if "reasoning" not in p.parent.name
    )


@pytest.mark.parametrize("exp", _experiments(), ids=lambda p: p.name[16:])
def test_inference_perf_experiments_read_as_stages_csv_says(fidelity: Path, exp: Path) -> None:
    run = read_inference_perf(exp, kv_blocks=1000)
    assert run.source == "inference-perf" and run.timing == "client" and run.gpu == "h100-80gb"
    rows = [r for r in read_csv(BLIS / "stages.csv") if r["experiment"] == exp.name]
    assert len(run.stages) == len(rows)
    for stage, row in zip(run.stages, rows, strict=True):
        assert stage.rate == float(row["rate"]) and stage.count == int(row["n_success"])
        assert stage.measured["ttft_s"]["p50"] * 1e3 == pytest.approx(
            float(row["ttft_median_ms"]), abs=1e-3
        )
        assert stage.measured["e2e_s"]["p99"] * 1e3 == pytest.approx(
            float(row["e2e_p99_ms"]), abs=1e-3
        )
        # the regenerated fixed-interval schedule: rate x duration requests in the stage
        inside = (run.requests.arrival_s >= stage.start_s) & (run.requests.arrival_s < stage.end_s)
        assert inside.sum() == round(float(row["rate"]) * float(row["duration_s"]))
        assert stage.measured["tpot_s"]["p50"] > 0
    assert run.scenario["max_num_seqs"] == 128 and run.scenario["num_gpu_blocks"] == 1000
    assert run.requests.prompt_tokens.mean() == pytest.approx(
        float(rows[0]["prompt_len_mean"]), rel=0.02
    )


def test_shared_prefix_prompts_repeat_and_share_their_system_prompt() -> None:
    data = {"num_groups": 3, "num_prompts_per_group": 4, "system_prompt_len": 100,
            "question_len": 300, "output_len": 50}  # fmt: skip
    reqs, windows = shared_prefix_workload(data, [(2.0, 30.0), (5.0, 10.0)])
    assert len(reqs) == 60 + 50 and windows == [(0.0, 30.0), (30.0, 40.0)]
    assert np.diff(reqs.arrival_s[:60]) == pytest.approx(0.5)
    assert (reqs.output_tokens == 50).all()
    chains = [tuple(h) for h in reqs.prefix_hashes]
    assert chains[:12] == chains[12:24]  # 12 prompts, cycled
    assert len(set(chains[:12])) == 12
    firsts = {h[0] for h in chains[:12]}
    assert len(firsts) == 3  # the first 6 blocks (96 tokens) are the group's system prompt


def test_bad_files_name_themselves(tmp_path: Path, fidelity: Path) -> None:
    src = LSS / "bench" / "examples" / "RTXPRO6000" / "Llama-3.1-8B"
    run_dir = tmp_path / "bench" / "examples" / "RTXPRO6000" / "Llama-3.1-8B"
    shutil.copytree(src, run_dir)
    meta = run_dir / "vllm" / "meta.json"
    meta.write_text(meta.read_text()[:200])
    with pytest.raises(ConfigError, match=r"meta.json: not valid JSON \(line"):
        read_llmservingsim(run_dir, LSS / "workloads")
    data = json.loads((src / "vllm" / "meta.json").read_text())
    data["model"] = "someone/unknown-7b"
    meta.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="model 'someone/unknown-7b' has no shape"):
        read_llmservingsim(run_dir, LSS / "workloads")
    data["model"] = "meta-llama/Llama-3.1-8B"
    meta.write_text(json.dumps(data))
    reqs = run_dir / "vllm" / "requests.jsonl"
    lines = reqs.read_text().splitlines()
    reqs.write_text("\n".join(lines[:10]) + "\n")
    with pytest.raises(ConfigError, match="10 requests but the workload"):
        read_llmservingsim(run_dir, LSS / "workloads")
    reqs.write_text("\n".join([*lines[:5], "{not json", *lines[6:]]) + "\n")
    with pytest.raises(ConfigError, match=r"requests.jsonl: line 6: not valid JSON"):
        read_llmservingsim(run_dir, LSS / "workloads")
    exp = tmp_path / "exp"
    shutil.copytree(_experiments()[0], exp)
    (exp / "results" / "stage_0_lifecycle_metrics.json").write_text("{}")
    with pytest.raises(
        ConfigError, match="stage_0_lifecycle_metrics.json: missing key 'successes'"
    ):
        read_inference_perf(exp)
