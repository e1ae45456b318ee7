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


def requests_selection(f: F) -> F:
    """--requests FILE, or --from/--to days of the warehouse: which requests to replay."""
    f = click.option(
        "--to",
        "date_to",
        type=click.DateTime(["%Y-%m-%d"]),
        default=None,
        help="Last request day (UTC, inclusive).",
    )(f)
    f = click.option(
        "--from",
        "date_from",
        type=click.DateTime(["%Y-%m-%d"]),
        default=None,
        help="First request day (UTC, inclusive).",
    )(f)
    return click.option(
        "--requests",
        "requests_file",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="Replay one requests Parquet file instead of the warehouse.",
    )(f)


def parse_sets(pairs: tuple[str, ...]) -> dict[str, Any]:
    """--set KEY=VALUE pairs as a dict, values read as TOML (numbers, booleans, strings)."""
    from pipeline.errors import ScenarioError
    from pipeline.sim.scenario import parse_value

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set watermark=0.01")
        out[key.strip()] = parse_value(value.strip())
    return out


def output(f: F) -> F:
    f = click.option("--quiet", "-q", is_flag=True, help="No progress bar, summary only.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")(f)
    return f


def locked(f: F) -> F:
    """Run the command holding the warehouse lock (``pipeline.lock``); adds --lock-timeout.

    Put it right above the function, below every other option: it reads the
    command's ``warehouse`` and ``config_file`` arguments to find the warehouse.
    """
    import functools

    @functools.wraps(f)
    def wrapper(*args: Any, lock_timeout: float, **kwargs: Any) -> Any:
        from pipeline.config import load_config, warehouse_path
        from pipeline.lock import warehouse_lock

        flag = kwargs.get("warehouse")
        root = warehouse_path(str(flag) if flag else None, load_config(kwargs.get("config_file")))
        with warehouse_lock(root, timeout_s=lock_timeout):
            return f(*args, **kwargs)

    return lock_timeout(wrapper)  # type: ignore[return-value]


def lock_timeout(f: F) -> F:
    """--lock-timeout SECONDS (``lock_timeout``): how long to wait for the warehouse lock."""
    return click.option(
        "--lock-timeout",
        type=click.FloatRange(min=0),
        default=600.0,
        show_default=True,
        envvar="TRACEREPLAY_LOCK_TIMEOUT",
        metavar="SECONDS",
        help="Wait this long for another command writing the warehouse, then give up "
        "[env TRACEREPLAY_LOCK_TIMEOUT].",
    )(f)
