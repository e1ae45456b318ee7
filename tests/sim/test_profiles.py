import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.calibrate.published import (
    HELD_OUT,
    HeldOut,
    PublishedStep,
    held_out_ms,
    predict_ms,
    published_rows,
)
from pipeline.cli import cli
from pipeline.errors import ScenarioError
from pipeline.sim import profiles
from pipeline.sim.cost_model import StepCost, load_step_cost
from pipeline.sim.hardware import load_efficiencies, load_gpus, load_models
from pipeline.sim.profiles import (
    DEFAULT_PROFILE,
    PROFILE_DIR,
    PROFILE_EXTRA,
    PROFILE_GPUS,
    PROFILE_MATRIX,
    expected_profiles,
    generate_profiles,
    list_profiles,
    load_profile,
    render,
    stale_profiles,
)
from pipeline.sim.roofline import derive_step_cost

MODELS = load_models()
GPUS = {name: load_gpus()[name] for name in PROFILE_GPUS}  # those with shipped profiles
EFF = load_efficiencies()


def cost(model: str, gpu: str, tp: int) -> StepCost:
    return derive_step_cost(MODELS[model], GPUS[gpu], tp, EFF[gpu])


def decode_s(c: StepCost, batch: int = 1, ctx: int = 1000) -> float:
    return c.step_s(0, 0, batch, batch, batch * ctx)


def prefill_s(c: StepCost, tokens: int) -> float:
    return c.step_s(tokens, tokens * (tokens + 1) / 2, 1, 0, 0)


def weight_read_bytes(model: str) -> int:
    m = MODELS[model]
    return (m.params_nonembedding + m.params_lm_head) * m.dtype_bytes


# Published measurements, one row per step (docs/cost_model.md lists them with sources).
PUBLISHED = published_rows()


def _row_id(r: PublishedStep) -> str:
    return f"{r.source}-{r.model}-{r.gpu}-tp{r.tp}-{r.phase}-b{r.batch_size}-p{r.prompt_tokens}"


@pytest.mark.parametrize("row", PUBLISHED, ids=_row_id)
def test_defaults_match_each_published_step_within_15_percent(row: PublishedStep) -> None:
    c = cost(row.model, row.gpu, row.tp)
    assert abs(predict_ms(c, row) / row.time_ms - 1) <= 0.15


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_defaults_median_error_per_phase_within_30_percent(phase: str) -> None:
    # the bar for the shipped defaults: within +-30% median per phase at TP 1-8
    rows = [r for r in PUBLISHED if r.phase == phase]
    errors = [predict_ms(cost(r.model, r.gpu, r.tp), r) / r.time_ms - 1 for r in rows]
    assert len({r.tp for r in rows}) >= 2
    assert abs(float(np.median(errors))) <= 0.30
    for tp in sorted({r.tp for r in rows}):  # and no TP degree systematically off
        at_tp = [e for e, r in zip(errors, rows, strict=True) if r.tp == tp]
        assert abs(float(np.median(at_tp))) <= 0.30, (phase, tp)


def test_short_prefills_have_a_floor() -> None:
    # v1 predicted a 128-token Llama-2-7B prefill on A100 in 10.9 ms (TensorRT-LLM: 16 ms):
    # small GEMMs run far below peak; flop_tokens_half is that floor
    c = cost("llama-2-7b", "a100-80gb", 1)
    assert c.flop_tokens_half > 0
    short, long = c.prefill_step_s(1, 128), c.prefill_step_s(1, 2048)
    assert short > 1.3 * c.flop_s_per_token * 128 + c.fixed_s
    assert long / short < 2048 / 128 / 1.5


def test_every_extra_sequence_costs_something() -> None:
    for gpu in PROFILE_GPUS:
        c = cost("llama-3-70b", gpu, 8)
        assert c.seq_s > 0
        assert c.decode_step_s(9, 1000) - c.decode_step_s(8, 1000) >= c.seq_s


def test_allreduce_latency_grows_with_tp() -> None:
    for gpu in PROFILE_GPUS:
        per_step = [cost("llama-3-70b", gpu, tp).comm_s_fixed for tp in (1, 2, 4, 8)]
        assert per_step[0] == 0 and per_step[1] < per_step[2] < per_step[3]


@pytest.mark.parametrize(
    ("model", "published_params", "tolerance"),
    [
        ("llama-3-8b", 8.03e9, 0.005),
        ("llama-3-70b", 70.6e9, 0.005),
        ("mistral-7b", 7.25e9, 0.005),
        ("qwen2.5-32b", 32.5e9, 0.015),  # model card rounds; q/k/v biases included here
    ],
)
def test_parameter_counts_match_published(
    model: str, published_params: float, tolerance: float
) -> None:
    assert MODELS[model].params_total == pytest.approx(published_params, rel=tolerance)


def test_decode_batch1_is_weights_over_bandwidth_within_efficiency() -> None:
    c = cost("llama-3-8b", "h100-80gb", 1)
    bandwidth_only = weight_read_bytes("llama-3-8b") / GPUS["h100-80gb"].hbm_bytes_per_s
    efficiency = EFF["h100-80gb"].memory_efficiency
    step = decode_s(c)
    assert c.mem_s_weights == pytest.approx(bandwidth_only / efficiency)
    compute = c.flop_s_per_token * (1 + c.flop_tokens_half) + c.flop_s_per_attn * 1000
    overheads = c.fixed_s + c.seq_s + c.overlap * compute + c.mem_s_per_kv_token * 1000
    assert bandwidth_only / efficiency < step < bandwidth_only / efficiency + overheads + 1e-4
    assert 1.2 < step / bandwidth_only < 1.6


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_prefill_4096_is_compute_bound(gpu: str) -> None:
    c = cost("llama-3-8b", gpu, 1)
    n = 4096
    compute = c.flop_s_per_token * n + c.flop_s_per_attn * n * (n + 1) / 2
    memory = c.mem_s_weights + c.mem_s_per_token * n
    assert compute > 3 * memory
    m = MODELS["llama-3-8b"]
    flop = 2 * (m.params_nonembedding + m.params_lm_head) * n
    assert prefill_s(c, n) > flop / GPUS[gpu].peak_flops  # never faster than peak


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_tensor_parallel_reduces_time_less_than_linearly(gpu: str) -> None:
    for step in (decode_s, lambda c: prefill_s(c, 4096)):
        times = {tp: step(cost("llama-3-70b", gpu, tp)) for tp in (1, 2, 4, 8)}
        assert times[1] > times[2] > times[4] > times[8]
        for tp in (2, 4, 8):
            assert times[1] / times[tp] < tp


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_70b_tp8_decode_is_much_slower_than_bandwidth_alone(gpu: str) -> None:
    bandwidth_only = weight_read_bytes("llama-3-70b") / (8 * GPUS[gpu].hbm_bytes_per_s)
    assert decode_s(cost("llama-3-70b", gpu, 8)) > 1.8 * bandwidth_only


def test_blog_prefill_figure_is_beyond_eight_a100s() -> None:
    # 4,096-token prefill of Llama-3-70B in ~120 ms would need more than 8 A100s at peak.
    c = cost("llama-3-70b", "a100-80gb", 8)
    n = 4096
    flop = (c.flop_s_per_token * n + c.flop_s_per_attn * n * (n + 1) / 2) * (
        8 * GPUS["a100-80gb"].peak_flops * EFF["a100-80gb"].compute_efficiency
    )
    assert flop == pytest.approx(6.1e14, rel=0.05)
    assert flop / 0.120 > 8 * GPUS["a100-80gb"].peak_flops
    assert prefill_s(c, n) > 3 * 0.120
    # its decode figure (~18 ms) fits 8-way tensor parallelism, not 4-way
    assert decode_s(c) == pytest.approx(18e-3, rel=0.15)
    assert decode_s(cost("llama-3-70b", "a100-80gb", 4)) > 1.4 * 18e-3


def test_communication_terms_only_with_tensor_parallelism() -> None:
    one = cost("llama-3-70b", "h100-80gb", 1)
    assert one.comm_s_fixed == one.comm_s_per_token == 0
    eight = cost("llama-3-70b", "h100-80gb", 8)
    eff = EFF["h100-80gb"]
    latency = eff.allreduce_latency_s + 2 * 7 * eff.allreduce_hop_latency_s
    assert eight.comm_s_fixed == pytest.approx(2 * 80 * latency)
    assert eight.comm_s_per_token > 0


def test_default_profile_kv_block_count_is_plausible() -> None:
    # 0.9 * 79.6 GiB - 15.0 GiB weights - 2.0 GiB reserve = 54.7 GiB; 2 MiB per 16-token block
    profile = load_profile(DEFAULT_PROFILE)
    assert profile.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert 26_000 <= profile.num_gpu_blocks(16, 0.9) <= 30_000
    assert profile.num_gpu_blocks(32, 0.9) == profile.num_gpu_blocks(16, 0.9) // 2


def test_tp_adds_memory_for_kv_blocks() -> None:
    blocks = [
        load_profile(f"llama-3-70b_h100-80gb_tp{tp}").num_gpu_blocks(16, 0.9) for tp in (2, 4, 8)
    ]
    assert blocks == sorted(blocks) and blocks[0] > 0


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_70b_on_one_gpu_has_no_room_for_kv(gpu: str) -> None:
    profile = load_profile(f"llama-3-70b_{gpu}_tp1")
    with pytest.raises(ValueError, match="tensor-parallel"):
        profile.num_gpu_blocks(16, 0.9)


@pytest.mark.parametrize(("block_size", "utilization"), [(0, 0.9), (16, 0.0), (16, 1.5)])
def test_num_gpu_blocks_rejects_bad_arguments(block_size: int, utilization: float) -> None:
    with pytest.raises(ValueError):
        load_profile(DEFAULT_PROFILE).num_gpu_blocks(block_size, utilization)


def test_unknown_name_lists_the_shipped_profiles() -> None:
    with pytest.raises(ScenarioError) as exc:
        load_profile("llama-9-1b_tpu_tp1")
    for name in list_profiles():
        assert name in str(exc.value)


def test_file_that_is_not_a_profile_is_a_scenario_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"coefficients": {}}')
    with pytest.raises(ScenarioError, match="bad.json"):
        load_profile(str(tmp_path / "bad.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")


def test_profile_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "copy.json"
    shutil.copy(PROFILE_DIR / f"{DEFAULT_PROFILE}.json", path)
    by_name = load_profile(DEFAULT_PROFILE)
    by_path = load_profile(str(path))
    assert by_path == by_name
    assert load_step_cost(path) == by_name.cost
    assert StepCost.from_dict(by_name.cost.to_dict()) == by_name.cost
    data = json.loads(path.read_text())
    assert set(data["coefficients"]) == set(StepCost.__dataclass_fields__)
    assert data["provenance"]["method"] == "analytic roofline"


def test_every_matrix_entry_is_shipped_on_every_gpu() -> None:
    expected = {f"{m}_{g}_tp{tp}" for m, tps in PROFILE_MATRIX for tp in tps for g in GPUS}
    expected |= {f"{m}_{g}_tp{tp}" for m, g, tp in PROFILE_EXTRA}
    assert set(list_profiles()) == expected
    assert DEFAULT_PROFILE in expected


def test_shipped_json_equals_generator_output() -> None:
    for name, profile in expected_profiles().items():
        assert (PROFILE_DIR / f"{name}.json").read_text() == render(profile), (
            f"{name} is stale: run tracereplay profile regenerate"
        )


def test_regenerate_check_passes_on_the_shipped_profiles() -> None:
    r = CliRunner().invoke(cli, ["profile", "regenerate", "--check"])
    assert r.exit_code == 0, r.output
    assert stale_profiles() == []


def test_stale_profiles_names_a_changed_and_an_extra_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for src in PROFILE_DIR.glob("*.json"):
        shutil.copy(src, tmp_path / src.name)
    (tmp_path / f"{DEFAULT_PROFILE}.json").write_text("{}")
    (tmp_path / "old_profile_tp3.json").write_text("{}")
    monkeypatch.setattr(profiles, "PROFILE_DIR", tmp_path)
    assert stale_profiles() == [DEFAULT_PROFILE, "old_profile_tp3"]
    r = CliRunner().invoke(cli, ["profile", "regenerate", "--check"])
    assert r.exit_code == 1
    assert f"out of date: {DEFAULT_PROFILE}" in r.output


def test_generate_profiles_writes_and_prunes(tmp_path: Path) -> None:
    (tmp_path / "old_profile_tp3.json").write_text("{}")
    written = generate_profiles(tmp_path)
    assert sorted(p.stem for p in written) == list_profiles()
    assert not (tmp_path / "old_profile_tp3.json").exists()
    assert (tmp_path / f"{DEFAULT_PROFILE}.json").read_bytes() == (
        PROFILE_DIR / f"{DEFAULT_PROFILE}.json"
    ).read_bytes()


@pytest.mark.parametrize("h", HELD_OUT, ids=lambda h: h.label)
def test_held_out_published_latencies(h: HeldOut) -> None:
    # never fitted to: vLLM's end-to-end latency tests on H200 (a GPU whose efficiencies
    # are copied from H100) come out fast by 12-16%, within 20%: the documented direction
    # (H200's HBM3e reaches a lower share of its datasheet bandwidth in these decode steps
    # than H100's HBM3); TensorRT-LLM's fp8 first tokens on H100 within 20% at 2,048 tokens
    # (fp8_compute_efficiency); at 128 tokens they come out fast, the documented direction:
    # that engine's context-phase launch costs, which grow with the TP degree, are not in
    # the defaults (prefill_fixed_s is 0)
    error = held_out_ms(h) / h.measured_ms - 1
    if h.dtype == "bf16":
        assert -0.20 <= error < 0
    elif h.prompt_tokens >= 2048:
        assert abs(error) <= 0.20
    else:
        assert -0.6 < error < 0


def test_the_sync_runtime_pays_its_cpu_time_as_scheduler_terms_not_gpu_time() -> None:
    from pipeline.sim.hardware import resolve_runtime
    from pipeline.sim.roofline import profile_dict

    model, gpu = load_models()["llama-3-8b"], load_gpus()["h100-80gb"]
    eff = load_efficiencies()["h100-80gb"]
    sync, default = resolve_runtime("vllm-sync"), resolve_runtime("vllm")
    a = profile_dict(model, gpu, 1, eff, "a", {}, runtime=default)["coefficients"]
    b = profile_dict(model, gpu, 1, eff, "b", {}, runtime=sync)["coefficients"]
    assert b["sched_cpu_s"] == sync.sched_cpu["sched_cpu_s"] > 0 == a["sched_cpu_s"]
    assert b["sched_cpu_per_seq_s"] == sync.sched_cpu["sched_cpu_per_seq_s"] > 0
    assert b["fixed_s"] == a["fixed_s"] and b["seq_s"] == a["seq_s"]  # the GPU's step alike
