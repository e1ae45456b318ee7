"""Click options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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


@dataclass(frozen=True)
class Moment:
    """A --from/--to value: a UTC day, with or without a time of day."""

    at: datetime
    has_time: bool


class MomentType(click.ParamType):
    name = "DAY[THH:MM[:SS]]"
    FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S",
               "%Y-%m-%d %H:%M:%S")  # fmt: skip

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Moment):
            return value
        text = str(value).strip().removesuffix("Z")
        for i, form in enumerate(self.FORMATS):
            try:
                return Moment(datetime.strptime(text, form).replace(tzinfo=UTC), i > 0)
            except ValueError:
                continue
        self.fail(
            f"{value!r} is not a day or a time: write 2024-05-01 or 2024-05-01T18:00 (UTC)",
            param,
            ctx,
        )


class ScenarioNumber(click.ParamType):
    """A flag that sets one scenario key (``--time-scale``, ``--max-num-seqs``): checked as
    it is read with the scenario's own per-key checks (``pipeline.sim.scenario``: finite,
    within the key's documented range), so a bad value is one line naming the flag,
    exit 1, before anything else runs."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = "INTEGER" if kind is int else "FLOAT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipeline.sim.scenario import check_scenario_keys

        if value is None or isinstance(value, self.kind) and not isinstance(value, bool):
            typed = value
        else:
            typed = str(value).strip()
        key = param.name if param is not None and param.name else "value"
        flag = param.opts[0] if param is not None and param.opts else key
        check_scenario_keys({key: typed}, flag)
        from pipeline import validation

        if self.kind is int:
            return validation.integer(typed, key, flag, strings=True)
        return validation.finite_float(typed, key, flag, strings=True)


SCENARIO_INT = ScenarioNumber(int)
SCENARIO_FLOAT = ScenarioNumber(float)


class BoundedFloat(click.ParamType):
    """A finite float in a documented range (``pipeline.validation.finite_float``);
    ``nan``, ``inf`` and values outside the range are one line naming the flag, exit 1."""

    name = "FLOAT"

    def __init__(
        self, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False
    ) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipeline import validation

        flag = param.opts[0] if param is not None and param.opts else "value"
        typed = value if isinstance(value, float) else str(value).strip()
        return validation.finite_float(
            typed, "value", flag, lo=self.lo, hi=self.hi, lo_open=self.lo_open, strings=True
        )


class BoundedInt(click.ParamType):
    """An integer in [lo, hi] (``pipeline.validation.integer``), one line naming the flag."""

    name = "INTEGER"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipeline import validation

        flag = param.opts[0] if param is not None and param.opts else "value"
        typed = value if isinstance(value, int) else str(value).strip()
        return validation.integer(typed, "value", flag, lo=self.lo, hi=self.hi, strings=True)


def _check_where(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--where is checked as it is read, before the command takes the warehouse lock or
    reads anything (``pipeline.predicate``); a refusal is one line, exit 1. A blank one
    keeps every request, as no --where does."""
    if value is None or not value.strip():
        return None
    from pipeline.predicate import check_predicate

    return check_predicate(value, "--where")


def requests_selection(f: F) -> F:
    """--requests FILE, or --from/--to days (optionally with a time of day) of the warehouse,
    and --model, --tenant, --where: which requests to replay."""
    f = click.option(
        "--where",
        "where",
        default=None,
        metavar="PREDICATE",
        callback=_check_where,
        help="Only requests matching this SQL predicate on the requests columns, e.g. "
        "\"prompt_tokens > 4000 AND tenant <> 'batch'\": one boolean expression with "
        "operators, CASE, CAST and scalar string, math, date and list functions; no "
        "subqueries, table functions or statements.",
    )(f)
    f = click.option(
        "--tenant", "tenants", multiple=True, help="Only this tenant's requests (repeatable)."
    )(f)
    f = click.option(
        "--model", "models", multiple=True, help="Only this model's requests (repeatable)."
    )(f)
    f = click.option(
        "--to",
        "date_to",
        type=MomentType(),
        default=None,
        help="Last request day (UTC, inclusive), or a time (exclusive), e.g. 2024-05-01T19:00.",
    )(f)
    f = click.option(
        "--from",
        "date_from",
        type=MomentType(),
        default=None,
        help="First request day (UTC), or a time of day, e.g. 2024-05-01T18:00.",
    )(f)
    return click.option(
        "--requests",
        "requests_file",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="Replay one Parquet file with the requests columns instead of the warehouse "
        "(e.g. written by `tracereplay sql --format parquet`).",
    )(f)


def selection_kwargs(
    date_from: Moment | None,
    date_to: Moment | None,
    models: tuple[str, ...] = (),
    tenants: tuple[str, ...] = (),
    where: str | None = None,
) -> dict[str, Any]:
    """date_from, date_to (the days whose partitions are read) and selection (the rest)."""
    from pipeline.selection import RequestFilter

    start = date_from.at if date_from is not None and date_from.has_time else None
    end = date_to.at if date_to is not None and date_to.has_time else None
    if start is not None and end is not None and not start < end:
        from pipeline.errors import ConfigError

        raise ConfigError(f"--from {start:%Y-%m-%dT%H:%M} is not before --to {end:%Y-%m-%dT%H:%M}")
    last_day = date_to.at.date() if date_to is not None else None
    if end is not None and end.time() == datetime.min.time():  # up to midnight: the day before
        last_day = (end - timedelta(days=1)).date()
    selection = RequestFilter(tuple(models), tuple(tenants), where or None, start, end)
    return {
        "date_from": date_from.at.date() if date_from is not None else None,
        "date_to": last_day,
        "selection": selection if selection.active else None,
    }


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


def intervals(f: F) -> F:
    return click.option(
        "--no-intervals",
        "no_intervals",
        is_flag=True,
        help="Leave out the 90% intervals (the bootstrap, and the replays of the profile "
        "term): the figures as they were before intervals, faster.",
    )(f)


def gpu_hour_price(f: F) -> F:
    return click.option(
        "--gpu-hour-price",
        type=BoundedFloat(0.0, 1e6, lo_open=True),
        default=None,
        metavar="USD",
        help="Dollars per GPU-hour for every GPU kind [default: the config's [gpu_prices]].",
    )(f)


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
        type=BoundedFloat(0.0, 1e7),
        default=600.0,
        show_default=True,
        envvar="TRACEREPLAY_LOCK_TIMEOUT",
        metavar="SECONDS",
        help="Wait this long for another command writing the warehouse, then give up "
        "[env TRACEREPLAY_LOCK_TIMEOUT].",
    )(f)
