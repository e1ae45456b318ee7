"""``tracereplay live``: requests -> a real engine (in-process or over HTTP), timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.errors import ConfigError
from pipeline.live.http import CLIENTS, KINDS
from pipeline.live.replay import ENGINES, MAX_WAIT_S, LiveRun, Selection, run_live

# the --dtype values of the in-process engine (pipeline.live.model.resolve_dtype)
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _fmt(x: float | None, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x * scale:,.{digits}f} {unit}"


def format_live(run: LiveRun) -> str:
    s, info = run.summary, run.engine_info
    if run.engine == "http":
        what = f"{info.get('server_kind', '?')} at {info.get('base_url', '?')}"
    else:
        what = f"{info.get('model', '?')}, {info.get('device', '?')} {info.get('dtype', '')}"
    lines = [
        f"live {run.engine} ({what.strip()}): {s['num_requests']:,} requests, "
        f"{s['completed']:,} completed, {s['failed']:,} failed",
        f"  completed in {_fmt(s['duration_s'], digits=1)}: "
        f"{_fmt(s['request_throughput'], 'req/s', digits=2)}, "
        f"{_fmt(s['output_token_throughput'], 'output tok/s', digits=0)}, "
        f"{_fmt(s['total_token_throughput'], 'total tok/s', digits=0)}",
        f"  TTFT p50 {_fmt(s['ttft_p50_s'])}  p90 {_fmt(s['ttft_p90_s'])}  "
        f"p99 {_fmt(s['ttft_p99_s'])}   TPOT p50 {_fmt(s['tpot_p50_s'], 'ms', 1e3, 1)}  "
        f"p99 {_fmt(s['tpot_p99_s'], 'ms', 1e3, 1)}   E2E p50 {_fmt(s['e2e_p50_s'])}  "
        f"p99 {_fmt(s['e2e_p99_s'])}",
        f"  sent late p50 {_fmt(s['late_p50_s'], 'ms', 1e3, 2)}  "
        f"max {_fmt(s['late_max_s'], 'ms', 1e3, 2)}",
    ]
    for reason, count in s["failure_reasons"].items():
        lines.append(f"  failed x{count}: {reason}")
    return "\n".join(lines)


@click.command(name="live")
@opt.warehouse
@opt.config_file
@opt.plain_selection
@click.option(
    "--engine", type=click.Choice(ENGINES), required=True, help="In-process or over HTTP."
)
@opt.option(
    "--num-requests",
    "sample",
    deprecated=("--sample",),
    type=int,
    default=None,
    help="Replay this many requests (a slice).",
)
@click.option("--skip", type=int, default=0, show_default=True, help="Leave out the first N.")
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Multiply the trace's inter-arrival times (0.5 = twice as fast).",
)
@opt.option(
    "--max-gap-s",
    "max_wait_s",
    deprecated=("--max-wait",),
    type=opt.Duration(inf=True),
    default=f"{MAX_WAIT_S:g}",
    show_default=True,
    metavar="SECONDS",
    help="Refuse a replay that would sleep longer than this at once (a gap in the trace); "
    "a unit is taken too (5m, 1h).",
)
@click.option("--max-prompt-tokens", type=int, default=None, help="Cap every prompt.")
@click.option("--max-output-tokens", type=int, default=None, help="Cap every output.")
@opt.option(
    "--timeout-s",
    "timeout_s",
    deprecated=("--timeout",),
    type=float,
    default=None,
    metavar="SECONDS",
    help="Give up on a request after this long.",
)
@click.option("--base-url", default=None, help="http: the server, e.g. http://localhost:8000.")
@click.option(
    "--server-kind",
    type=click.Choice(KINDS),
    default="auto",
    show_default=True,
    help="http: what the server accepts (auto: detect).",
)
@click.option(
    "--served-model-name", "served_model", default=None, help="http: the model name to send."
)
@click.option(
    "--tokenizer",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="http: the served model's tokenizer.json (servers that take text prompts).",
)
@click.option(
    "--max-model-len",
    type=int,
    default=None,
    help="http: prompt + output tokens the engine takes (default: the server's "
    "/v1/models max_model_len); a request past it is refused before it is built.",
)
@click.option("--max-in-flight", type=int, default=256, show_default=True, help="http.")
@opt.option(
    "--metrics-interval-s",
    "metrics_interval",
    deprecated=("--metrics-interval",),
    type=float,
    default=0.5,
    show_default=True,
    metavar="SECONDS",
    help="http: how often /metrics is scraped.",
)
@click.option(
    "--client",
    type=click.Choice(CLIENTS),
    default="asyncio",
    show_default=True,
    help="http: the requests' HTTP client (httpx: slower, for comparison).",
)
@click.option(
    "--model-config",
    default=None,
    help="inprocess: built-in shape (tiny, small, llama3-8b), config.json or checkpoint dir.",
)
@click.option("--device", default=None, help="inprocess: cpu or cuda.")
@click.option(
    "--dtype",
    type=opt.DType(ENGINE_DTYPES),
    default=None,
    help="inprocess: weights and activations [default: float32 on a CPU, bfloat16 on CUDA].",
)
@opt.option(
    "--num-gpu-blocks",
    "num_blocks",
    deprecated=("--num-blocks",),
    type=int,
    default=None,
    help="inprocess: KV blocks.",
)
@click.option("--block-size", type=int, default=None, help="inprocess: tokens per KV block.")
@opt.option(
    "--max-num-batched-tokens",
    "max_batch_tokens",
    deprecated=("--max-batch-tokens",),
    type=int,
    default=None,
    help="inprocess: tokens per step.",
)
@click.option(
    "--scheduler",
    type=click.Choice(["fifo", "prefill_first"]),
    default=None,
    help="inprocess: transformers' continuous-batching scheduler.",
)
@opt.output
@opt.locked
def live_command(
    warehouse: Path | None,
    config_file: Path | None,
    requests: opt.Requests,
    engine: str,
    sample: int | None,
    skip: int,
    time_scale: float,
    max_wait_s: float,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    timeout_s: float | None,
    base_url: str | None,
    server_kind: str,
    served_model: str | None,
    tokenizer: Path | None,
    max_model_len: int | None,
    max_in_flight: int,
    metrics_interval: float,
    client: str,
    model_config: str | None,
    quiet: bool,
    as_json: bool,
    **inprocess: Any,
) -> None:
    """Replay requests through a real engine; write live_requests and live_metrics.

    --engine http sends each request at its (time-scaled) arrival time to an
    OpenAI-compatible server (vLLM, SGLang, TGI, transformers serve) as a
    streaming /v1/completions of the logged prompt and output lengths, and
    scrapes its /metrics. --engine inprocess runs transformers' continuous
    batching in this process on a model built from a config (random weights)
    or loaded from a local checkpoint. See docs/live.md.

    Example:

    \b
        tracereplay live --engine http --base-url http://localhost:8000 \\
            --num-requests 300 --time-scale 0.5
        tracereplay live --engine inprocess --model-config tiny --num-requests 50 \\
            --max-prompt-tokens 256 --max-output-tokens 64
    """
    cfg = load_config(config_file)
    wh = warehouse_path(str(warehouse) if warehouse else None, cfg)
    options: dict[str, Any]
    if engine == "http":
        if base_url is None:
            raise ConfigError("--engine http needs --base-url, e.g. http://localhost:8000")
        options = {
            "base_url": base_url,
            "server_kind": server_kind,
            "model": served_model,
            "max_in_flight": max_in_flight,
            "tokenizer": tokenizer,
            "metrics_interval_s": metrics_interval,
            "client": client,
            "max_model_len": max_model_len,
            "max_wait_s": max_wait_s,
        }
        if timeout_s is not None:
            options["timeout_s"] = timeout_s
    else:
        options = {k: v for k, v in inprocess.items() if v is not None}
        if model_config is not None:
            options["model"] = model_config
        if timeout_s is not None:
            options["timeout_s"] = timeout_s
    chosen = requests.kwargs()
    selection = Selection(
        sample=sample,
        skip=skip,
        time_scale=time_scale,
        max_wait_s=max_wait_s,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
    )
    run = run_live(
        wh,
        engine,
        options,
        selection=selection,
        requests_file=chosen["requests_file"],
        date_from=chosen["date_from"],
        date_to=chosen["date_to"],
        selection_filter=chosen["selection"],
        quiet=quiet,
    )
    if as_json:
        out = {
            "run_id": run.run_id,
            "warehouse": str(wh),
            "engine": run.engine,
            "engine_info": run.engine_info,
            "summary": run.summary,
        }
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(format_live(run))
    click.echo(f"run {run.run_id} written to {wh}")


live = live_command
