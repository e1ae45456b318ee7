"""``tracereplay ingest``: request logs -> the warehouse."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.cli import options as opt
from pipeline.config import load_config, warehouse_path
from pipeline.ingest import IngestOptions, IngestResult, ingest_logs
from pipeline.ingest.formats import FORMATS
from pipeline.warehouse import Warehouse


def print_summary(result: IngestResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    for f in result.files:
        if f.error:
            click.echo(f"error: {f.error}", err=True)
            continue
        packed = "" if f.compression in (None, "none") else f", {f.compression}"
        click.echo(
            f"{f.path} [{f.format or 'empty'}{packed}]: "
            f"read {f.rows_read:,} = kept {f.rows_kept:,} + quarantined {f.rows_quarantined:,} "
            f"+ duplicates {f.rows_duplicate:,}"
        )
    click.echo(
        f"total: read {result.total('rows_read'):,} = kept {result.total('rows_kept'):,} "
        f"+ quarantined {result.total('rows_quarantined'):,} "
        f"+ duplicates {result.total('rows_duplicate'):,}  (run {result.run_id}, "
        f"warehouse {result.warehouse})"
    )


@click.command()
@click.argument("sources", nargs=-1, required=True)
@opt.warehouse
@opt.config_file
@opt.option(
    "--log-format",
    "fmt",
    deprecated=("--format",),
    type=click.Choice(sorted(FORMATS)),
    default=None,
    help="Force the log format instead of detecting it from the content.",
)
@opt.option(
    "--prefix-block-tokens",
    "block_size",
    deprecated=("--block-size",),
    type=opt.BoundedInt(1, 1 << 16),
    default=None,
    help="Tokens per prefix-hash block (Mooncake 512, Bailian 16, token-id logs 16) "
    "[config ingest.block_size]; not the KV block of replay's --block-size.",
)
@click.option("--hash-salt", default=None, help="Salt mixed into the first block hash.")
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="tokenizer.json (or the model folder holding it, with its chat template): hash "
    "the prompt text of gateway, OTel and token_ids logs into prefix hashes, then drop it.",
)
@click.option(
    "--trace-start",
    default=None,
    help="UTC start time for logs with relative timestamps (default 1970-01-01).",
)
@click.option(
    "--tenant",
    default=None,
    help="Tenant of every record that names none (to mix one tenant's log with others; a "
    "fleet's pools can split them by tenant).",
)
@click.option("--model", default=None, help="Model of every record that names none.")
@opt.output
@opt.locked
def ingest(
    sources: tuple[str, ...],
    warehouse: Path | None,
    config_file: Path | None,
    fmt: str | None,
    block_size: int | None,
    hash_salt: str | None,
    tokenizer: Path | None,
    trace_start: str | None,
    tenant: str | None,
    model: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Ingest request logs (files, globs, directories; gzip/zstd ok) into the warehouse.

    Formats are detected from the content: azure, mooncake, bailian, burstgpt,
    gateway (LiteLLM spend logs), otel (OTLP JSON spans), token_ids. Rejected
    records go to the quarantine table. Exits 1 when any file could not be
    ingested; the other files still land.

    Example:

    \b
        tracereplay ingest logs/2024-05-*.jsonl.gz --warehouse /data/wh
        tracereplay ingest chat.csv --tenant chat
    """
    cfg = load_config(config_file)
    opts = IngestOptions.from_config(
        cfg,
        fmt=fmt,
        block_size=block_size,
        hash_salt=hash_salt,
        tokenizer=tokenizer,
        trace_start=trace_start,
        quiet=quiet,
        tenant=tenant,
        model=model,
    )
    wh = Warehouse(warehouse_path(str(warehouse) if warehouse else None, cfg))
    result = ingest_logs(list(sources), wh, opts)
    print_summary(result, as_json)
    if not result.ok:
        raise SystemExit(1)
