"""``tracereplay profile``: step-cost profiles: build one for any model and GPU, list or
regenerate the shipped ones."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.cli.profile_check import check_command
from pipeline.errors import ConfigError
from pipeline.sim.cost_model import StepCost
from pipeline.sim.hardware import (
    DEFAULT_RUNTIME,
    load_runtimes,
    read_gpu_spec,
    resolve_gpu,
    resolve_runtime,
)
from pipeline.sim.model_config import DTYPE_BYTES, read_model_config
from pipeline.sim.profiles import (
    PROFILE_DIR,
    describe_profiles,
    generate_profiles,
    render,
    stale_profiles,
)
from pipeline.sim.roofline import new_profile
from pipeline.text import render_table
from pipeline.validation import non_finite_key

# --dtype and --kv-cache-dtype by vLLM's names -> the model config's (DTYPE_BYTES)
PROFILE_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8"}
assert set(PROFILE_DTYPES.values()) == set(DTYPE_BYTES)


@click.group()
def profile() -> None:
    """Step-cost profiles: the time an engine step takes for a model on a GPU.

    Example:

    \b
        tracereplay profile list
        tracereplay profile new --model-config config.json --gpu h100-sxm \\
            --tensor-parallel-size 4 -o my.json
    """


@profile.command("new")
@click.option(
    "--model-config",
    "model_config",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The model's Hugging Face config.json.",
)
@click.option(
    "--gpu", help="A built-in GPU (see the error for the list), or the name of --gpu-spec."
)
@click.option(
    "--gpu-spec",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A JSON file describing the GPU (peak_flops, hbm_bytes_per_s, ...) instead.",
)
@opt.option(
    "--tensor-parallel-size",
    "tp",
    deprecated=("--tp",),
    type=opt.BoundedInt(1, 1024),
    default=1,
    show_default=True,
    help="Tensor parallel GPUs.",
)
@click.option(
    "--dtype",
    type=opt.DType(sorted(PROFILE_DTYPES)),
    default="bfloat16",
    show_default=True,
    help="Weights and activations.",
)
@opt.option(
    "--kv-cache-dtype",
    "kv_dtype",
    deprecated=("--kv-dtype",),
    type=opt.DType(sorted(PROFILE_DTYPES)),
    help="KV cache [default: --dtype].",
)
@click.option(
    "--max-model-len", type=opt.BoundedInt(2, 2**31 - 1), help="[default: max_position_embeddings]"
)
@opt.option(
    "--model-name",
    "name",
    deprecated=("--name",),
    help="Model name in the profile [default: the config's directory name].",
)
@click.option(
    "--runtime",
    type=click.Choice(sorted(load_runtimes())),
    default=DEFAULT_RUNTIME,
    show_default=True,
    help="The serving runtime: its step overheads and front end (docs/cost_model.md).",
)
@click.option(
    "--frontend",
    "frontend",
    type=click.Choice(["http", "none"]),
    default="http",
    show_default=True,
    help="http: replays report what an HTTP client sees; none: engine-core times only.",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Profile JSON to write.",
)
def new(
    model_config: Path,
    gpu: str | None,
    gpu_spec: Path | None,
    tp: int,
    dtype: str,
    kv_dtype: str | None,
    max_model_len: int | None,
    name: str | None,
    runtime: str,
    frontend: str,
    output: Path,
) -> None:
    """An analytic cost-model-v3 profile for a decoder-only model on a GPU.

    Example:

    \b
        tracereplay profile new --model-config Llama-3-70B/config.json \\
            --gpu h100-sxm --tensor-parallel-size 4 -o l70.json
        tracereplay replay --profile l70.json
    """
    if gpu_spec is not None:
        spec, eff = read_gpu_spec(gpu_spec, gpu)
    elif gpu is not None:
        spec, eff = resolve_gpu(gpu)
    else:
        raise ConfigError("give --gpu NAME or --gpu-spec FILE.json")
    model = read_model_config(
        model_config,
        name,
        PROFILE_DTYPES[dtype],
        PROFILE_DTYPES[kv_dtype] if kv_dtype else None,
        max_model_len,
    )
    if model.num_heads % tp:
        raise ConfigError(
            f"--tensor-parallel-size {tp}: {model_config} has {model.num_heads} attention "
            "heads, which do not split evenly over that many GPUs; give a "
            "--tensor-parallel-size that divides them"
        )
    data = new_profile(model, spec, eff, tp, resolve_runtime(runtime), frontend == "http")
    bad = non_finite_key(data)
    if bad is not None:  # the inputs are bounded; this keeps Infinity out of the file anyway
        raise ConfigError(
            f"{output}: {bad} of the profile would not be a finite number; check the GPU "
            "spec and model config figures"
        )
    from pipeline.storage import write_atomic, writing

    with writing(output, "give -o another path"):
        write_atomic(output, render(data))
    derived, mem, gib = data["derived"], data["memory"], 2**30
    click.echo(
        f"wrote {output}: {data['name']}, {derived['params_total'] / 1e9:.2f}e9 parameters "
        f"({derived['active_params_nonembedding'] / 1e9:.2f}e9 active non-embedding), "
        f"weights {mem['weight_bytes'] / gib:.1f} GiB of {mem['gpu_memory_bytes'] / gib:.1f} GiB; "
        f"decode step (batch 1) {_decode_ms(data['coefficients']):.2f} ms, "
        f"1,000-token prefill {_prefill_ms(data['coefficients']):.1f} ms; runtime {runtime}"
    )


def _decode_ms(c: dict[str, float]) -> float:
    return StepCost.from_dict(c).decode_step_s(1, 1000) * 1e3


def _prefill_ms(c: dict[str, float]) -> float:
    return StepCost.from_dict(c).prefill_step_s(1, 1000) * 1e3


@profile.command("list")
def list_() -> None:
    """The shipped profiles (use a name with --profile).

    Example:

    \b
        tracereplay profile list
    """
    rows = describe_profiles()
    headers = ["name", "model", "gpu", "tp", "cost model", "method"]
    cells = [
        [r["name"], r["model"], r["gpu"], str(r["tp"]), f"v{r['cost_model_version']}", r["method"]]
        for r in rows
    ]
    click.echo(render_table(headers, cells))


@profile.command("regenerate")
@click.option(
    "--check", is_flag=True, help="Only compare; exit 1 if a shipped profile is out of date."
)
def regenerate(check: bool) -> None:
    """Rewrite the shipped profiles from the hardware tables (after editing them).

    The tables are pipeline/sim/profiles/_*.json (docs/cost_model.md); profiles
    no longer generated are removed.

    \b
    Example:
      tracereplay profile regenerate --check
    """
    if check:
        stale = stale_profiles()
        for name in stale:
            click.echo(f"out of date: {name}", err=True)
        if stale:
            raise SystemExit(1)
        return
    written = generate_profiles()
    click.echo(f"wrote {len(written)} profiles to {PROFILE_DIR}")


profile.add_command(check_command)  # tracereplay profile check (pipeline/cli/profile_check.py)
