"""Click options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def warehouse(f: F) -> F:
    return click.option(
        "--warehouse",
        "warehouse",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Warehouse directory [env TRACEREPLAY_WAREHOUSE; config warehouse.path; "
        "default ./warehouse].",
    )(f)


def config_file(f: F) -> F:
    return click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="TOML config file [env TRACEREPLAY_CONFIG; default ./tracereplay.toml if present].",
    )(f)


def output(f: F) -> F:
    f = click.option("--quiet", "-q", is_flag=True, help="No progress bar, summary only.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")(f)
    return f
