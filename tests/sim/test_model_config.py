"""config.json -> ModelShape, and `tracereplay profile new` / `profile list`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import ConfigError
from pipeline.sim.cost_model import COST_MODEL_VERSION
from pipeline.sim.hardware import load_models, resolve_gpu
from pipeline.sim.model_config import read_model_config
from pipeline.sim.profiles import PROFILE_DIR, list_profiles, load_profile

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"


@pytest.mark.parametrize(
    ("model", "total", "active"),
    [
        # published totals: model cards (Meta, Mistral AI, Qwen, Google) and release posts
        ("llama-3-8b", 8.03e9, None),
        ("llama-3-70b", 70.6e9, None),
        ("mistral-7b", 7.25e9, None),
        ("qwen2.5-32b", 32.5e9, None),  # card rounds; q/k/v biases included here
        ("qwen3-8b", 8.2e9, None),
        ("gemma-2-9b", 9.24e9, None),
        ("mixtral-8x7b", 46.7e9, 12.9e9),
        ("qwen3-30b-a3b", 30.5e9, 3.3e9),
        ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9),  # Qwen2-MoE: a shared expert beside 60 routed
    ],
)
def test_parameter_counts_match_published(model: str, total: float, active: float | None) -> None:
    m = read_model_config(CONFIGS / f"{model}.json")
    assert m.params_total == pytest.approx(total, rel=0.01)
    embeddings = m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    if active is None:
        assert m.active_params_nonembedding == m.params_nonembedding
    else:
        assert m.active_params_nonembedding + embeddings == pytest.approx(active, rel=0.02)


def test_family_details_are_read() -> None:
    gemma = read_model_config(CONFIGS / "gemma-2-9b.json")
    assert (gemma.head_dim, gemma.tie_word_embeddings, gemma.norms_per_layer) == (256, True, 4)
    assert read_model_config(CONFIGS / "qwen2.5-32b.json").attention_bias
    assert read_model_config(CONFIGS / "qwen3-8b.json").qk_norm
    mixtral = read_model_config(CONFIGS / "mixtral-8x7b.json")
    assert (mixtral.num_experts, mixtral.num_experts_per_tok) == (8, 2)
    assert mixtral.mlp_active_width == 2 * 14336


def test_shipped_model_shapes_agree_with_their_configs() -> None:
    # the shipped profiles' model shapes are the ones these config.json files give
    for name in ("llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-32b"):
        shipped = json.loads((PROFILE_DIR / f"{name}_h100-80gb_tp1.json").read_text())["model"]
        m = read_model_config(CONFIGS / f"{name}.json")
        for key in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "attention_bias",
            "tie_word_embeddings",
        ):
            assert shipped[key] == getattr(m, key), (name, key)


def test_the_validation_only_mixtral_shape_is_its_config() -> None:
    shipped = load_models()["mixtral-8x7b"]
    m = read_model_config(CONFIGS / "mixtral-8x7b.json", name="mixtral-8x7b")
    assert dataclasses.replace(m, source=shipped.source, kv_dtype_bytes=0) == shipped


def _write(tmp_path: Path, cfg: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_a_missing_key_names_the_file_and_the_key(tmp_path: Path) -> None:
    cfg = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    del cfg["num_hidden_layers"]
    path = _write(tmp_path, cfg)
    with pytest.raises(ConfigError) as err:
        read_model_config(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "'num_hidden_layers'" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"hidden_size": -1}, r"'hidden_size' must be an integer in \[1, 1048576\], got -1"),
        ({"model_type": None}, "missing key 'model_type'"),
        ({"max_position_embeddings": None}, "missing key 'max_position_embeddings'"),
    ],
)
def test_bad_configs_get_one_line(tmp_path: Path, change: dict[str, object], expected: str) -> None:
    cfg = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    for k, v in change.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    with pytest.raises(ConfigError, match=expected):
        read_model_config(_write(tmp_path, cfg))


def test_not_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  oops\n}')
    with pytest.raises(ConfigError, match=r"config.json: not valid JSON \(line 3"):
        read_model_config(path)


def test_profile_new_reproduces_a_shipped_profile(tmp_path: Path) -> None:
    out = tmp_path / "l70.json"
    args = ["profile", "new", "--model-config", str(CONFIGS / "llama-3-70b.json")]
    args += ["--gpu", "h100-sxm", "--tensor-parallel-size", "4", "--model-name", "llama-3-70b"]
    args += ["-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    made = json.loads(out.read_text())
    shipped = json.loads((PROFILE_DIR / "llama-3-70b_h100-80gb_tp4.json").read_text())
    assert made["cost_model_version"] == COST_MODEL_VERSION
    assert made["coefficients"] == shipped["coefficients"]
    assert made["memory"] == shipped["memory"]
    assert load_profile(out).cost == load_profile("llama-3-70b_h100-80gb_tp4").cost


def test_moe_computes_with_active_and_holds_every_expert(tmp_path: Path) -> None:
    out = tmp_path / "mixtral.json"
    args = ["profile", "new", "--model-config", str(CONFIGS / "mixtral-8x7b.json")]
    args += ["--gpu", "a100-80gb", "--tensor-parallel-size", "2", "-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    m = read_model_config(CONFIGS / "mixtral-8x7b.json")
    gpu, eff = resolve_gpu("a100-80gb")
    c = data["coefficients"]
    every = m.params_nonembedding + m.params_lm_head
    flops = 2 * gpu.peak_flops * eff.compute_efficiency
    # compute: the experts a token runs; the lm head once per sequence (v3)
    assert c["flop_s_per_token"] == pytest.approx(2 * m.active_params_nonembedding / flops)
    assert c["flop_s_per_seq"] == pytest.approx(2 * m.params_lm_head / flops)
    bandwidth = 2 * gpu.hbm_bytes_per_s * eff.memory_efficiency
    assert c["mem_s_weights"] == pytest.approx(every * 2 / bandwidth)
    assert data["memory"]["weight_bytes"] == m.params_total * 2


def test_fp8_halves_weight_bytes_and_uses_the_fp8_peak(tmp_path: Path) -> None:
    runs = {}
    for dtype, flag in (("bf16", "bfloat16"), ("fp8", "fp8")):
        out = tmp_path / f"{dtype}.json"
        args = ["profile", "new", "--model-config", str(CONFIGS / "llama-3-8b.json")]
        args += ["--gpu", "h100-sxm", "--dtype", flag, "-o", str(out)]
        assert CliRunner().invoke(cli, args).exit_code == 0
        runs[dtype] = json.loads(out.read_text())
    assert runs["fp8"]["memory"]["weight_bytes"] * 2 == runs["bf16"]["memory"]["weight_bytes"]
    assert (
        runs["fp8"]["memory"]["kv_bytes_per_token"] * 2
        == runs["bf16"]["memory"]["kv_bytes_per_token"]
    )
    ratio = (
        runs["bf16"]["coefficients"]["flop_s_per_token"]
        / runs["fp8"]["coefficients"]["flop_s_per_token"]
    )
    # the datasheets' fp8 / bf16 dense peaks, each at its GEMM efficiency
    _, eff = resolve_gpu("h100-sxm")
    want = 1978.9 * eff.fp8_compute_efficiency / (989.4 * eff.compute_efficiency)
    assert ratio == pytest.approx(want)


def test_gpu_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "mygpu.json"
    spec.write_text(
        json.dumps(
            {
                "peak_flops": 500e12,
                "hbm_bytes_per_s": 2.5e12,
                "memory_bytes": 96 * 2**30,
                "nvlink_bytes_per_s": 200e9,
                "like": "a100-80gb",
                "efficiency": {"memory_efficiency": 0.5},
            }
        )
    )
    out = tmp_path / "p.json"
    args = ["profile", "new", "--model-config", str(CONFIGS / "qwen3-8b.json")]
    r = CliRunner().invoke(cli, [*args, "--gpu-spec", str(spec), "-o", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["name"] == "qwen3-8b_mygpu_tp1"
    assert data["efficiency"]["memory_efficiency"] == 0.5
    m = read_model_config(CONFIGS / "qwen3-8b.json")
    expected = (m.params_nonembedding + m.params_lm_head) * 2 / (2.5e12 * 0.5)
    assert data["coefficients"]["mem_s_weights"] == pytest.approx(expected)
    spec.write_text(json.dumps({"peak_flops": 1e12}))
    r = CliRunner().invoke(cli, [*args, "--gpu-spec", str(spec), "-o", str(out)])
    assert r.exit_code == 1
    assert "mygpu.json: missing key 'hbm_bytes_per_s'" in r.output


def test_unknown_gpu_lists_the_built_in_ones(tmp_path: Path) -> None:
    args = ["profile", "new", "--model-config", str(CONFIGS / "qwen3-8b.json")]
    r = CliRunner().invoke(cli, [*args, "--gpu", "h100", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 1
    assert "unknown GPU" in r.output and "mi300x" in r.output and "h100-sxm" in r.output


def test_profile_list_shows_every_shipped_profile_at_the_current_version() -> None:
    r = CliRunner().invoke(cli, ["profile", "list"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 + len(list_profiles())
    assert all(f" v{COST_MODEL_VERSION} " in line for line in lines[1:])


def test_a_config_json_is_named_after_its_directory(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "llama-3-8b.json").read_text())
    out = tmp_path / "p.json"
    args = ["profile", "new", "--model-config", str(folder / "config.json"), "--gpu", "l4"]
    r = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["name"] == "meta-llama-3-8b_l4_tp1"
    assert str(tmp_path) not in json.dumps(data)  # no local paths in the profile
