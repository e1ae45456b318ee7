"""``tracereplay calibrate live``: probe a live engine's step times and fit a profile."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.calibrate.live import calibrate_live
from pipeline.calibrate.probe_design import DESIGNS
from pipeline.cli import options as opt
from pipeline.cli.live import ENGINE_DTYPES
from pipeline.errors import ConfigError


@click.command(name="live")
@click.option(
    "--engine",
    type=click.Choice(["inprocess"]),
    default="inprocess",
    show_default=True,
    help="The engine to probe (the in-process transformers engine).",
)
@click.option(
    "--model-config",
    "model_config",
    default=None,
    help="Built-in shape (tiny, small, llama3-8b), a config.json, or a checkpoint dir.",
)
@click.option("--device", default=None, help="cpu or cuda (default: cuda if available).")
@click.option(
    "--dtype",
    type=opt.DType(ENGINE_DTYPES),
    default=None,
    help="Weights and activations [default: float32 on a CPU, bfloat16 on CUDA].",
)
@click.option(
    "--design",
    type=click.Choice(sorted(DESIGNS)),
    default=None,
    help="Probe shapes: cpu, gpu or smoke (default: gpu on CUDA, cpu otherwise).",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="KV block size of the probed engine.",
)
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Profile JSON to write (the measurements go beside it, .measurements.csv).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
def live_command(
    engine: str,
    model_config: str | None,
    device: str | None,
    dtype: str | None,
    design: str | None,
    block_size: int,
    output: Path,
    as_json: bool,
) -> None:
    """Time designed step shapes on a live engine and fit a step-cost profile.

    Prefill sizes x batch sizes and decode batch sizes x context lengths are run as
    real engine steps (scheduling, forward pass, sampling), each shape exactly, with
    a warm-up and the median of repeats; the rows are written in the `calibrate
    measurements` schema and fitted with the same fit. The profile's provenance
    names the engine, torch and transformers versions, device and dtype.

    Example:

    \b
        tracereplay calibrate live --engine inprocess --model-config tiny -o tiny-cpu.json
    """
    if engine != "inprocess":
        raise ConfigError(f"--engine {engine}: only inprocess can be probed")
    from pipeline.live.model import load_model, resolve_device

    dev = resolve_device(device)
    loaded = load_model(model_config, device=dev, dtype=dtype)
    chosen = design or ("gpu" if dev.startswith("cuda") else "cpu")
    cal = calibrate_live(output, design=chosen, block_size=block_size, loaded=loaded)
    errors = cal.profile["provenance"]["fit_error"]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "output": str(output),
                    "fit_error": errors,
                    "coefficients": cal.profile["coefficients"],
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"probed {cal.rows.height} shapes on {loaded.name} ({loaded.device}, {loaded.dtype})"
    )
    from pipeline.cli.calibrate import error_table, pct

    figures = cal.fit.errors()  # over the rows of the measurements file, as profile check
    columns = {"start": figures["like"], "fit": figures["fit"]}
    click.echo(error_table(columns, cal.measurements_path))
    if cal.mixed_error is not None:
        e = cal.mixed_error.phases["mixed"]
        click.echo(
            f"fit on the {e.rows} mixed steps of {cal.profile['provenance']['mixed_source_file']}"
            f": median {pct(e.median)}, p90 {pct(e.p90)}"
        )
    click.echo(f"measurements: {cal.measurements_path}")
    click.echo(f"profile written to {output}")


live = live_command
