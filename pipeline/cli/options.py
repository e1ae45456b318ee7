"""Click options shared by several commands."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

F = TypeVar("F", bound=Callable[..., Any])

# Where a renamed option's deprecated spelling leaves its value until the option itself is
# processed (Click processes the options given on the command line first, in their order).
_ALIASED = "tracereplay.deprecated_values"


def deprecation_line(old: str, use: str) -> str:
    """The one line a deprecated spelling prints to stderr."""
    return f"warning: {old} is deprecated; use {use}"


class RenamedOption(click.Option):
    """An option with deprecated spellings beside it (``DeprecatedOption``, hidden): a
    value given with one of them becomes this option's value."""

    def handle_parse_result(
        self, ctx: click.Context, opts: Any, args: list[str]
    ) -> tuple[Any, list[str]]:
        value, args = super().handle_parse_result(ctx, opts, args)
        given = ctx.meta.get(_ALIASED, {}).pop(self.name, None)
        if given is not None:
            old, value = given
            if self.name in opts:
                raise click.UsageError(f"give {self.opts[0]} or the deprecated {old}, not both")
            assert self.name is not None
            ctx.params[self.name] = value
            ctx.set_parameter_source(self.name, ParameterSource.COMMANDLINE)
        return value, args


class DeprecatedOption(click.Option):
    """A spelling kept for one release: hidden from --help, it still works and prints one
    line to stderr (``deprecation_line``) when used. With ``replacement`` (a
    ``RenamedOption``) it is that option's old name and its value goes there; without, the
    command reads it itself (``use`` says what to give instead)."""

    def __init__(
        self,
        param_decls: list[str],
        *,
        use: str,
        replacement: click.Option | None = None,
        **attrs: Any,
    ) -> None:
        attrs["hidden"] = True
        if replacement is not None:
            attrs["expose_value"] = False
        super().__init__(param_decls, **attrs)
        self.use = use
        self.replacement = replacement

    def handle_parse_result(
        self, ctx: click.Context, opts: Any, args: list[str]
    ) -> tuple[Any, list[str]]:
        value, args = super().handle_parse_result(ctx, opts, args)
        if self.name not in opts:  # not on the command line
            return value, args
        if not ctx.resilient_parsing:  # not while a shell completes a word
            click.echo(deprecation_line(self.opts[0], self.use), err=True)
        target = self.replacement
        if target is not None and target.name is not None:
            if target.name in ctx.params:  # processed already: given before this, or not at all
                if ctx.get_parameter_source(target.name) is ParameterSource.COMMANDLINE:
                    raise click.UsageError(
                        f"give {target.opts[0]} or the deprecated {self.opts[0]}, not both"
                    )
                ctx.params[target.name] = value
                ctx.set_parameter_source(target.name, ParameterSource.COMMANDLINE)
            else:
                ctx.meta.setdefault(_ALIASED, {})[target.name] = (self.opts[0], value)
        return value, args


def option(*param_decls: str, deprecated: tuple[str, ...] = (), **attrs: Any) -> Callable[[F], F]:
    """``click.option``, and its ``deprecated`` spellings (old names kept for one release:
    hidden, still working, one line on stderr when used)."""

    def decorator(f: F) -> F:
        f = click.option(*param_decls, cls=RenamedOption if deprecated else click.Option, **attrs)(
            f
        )
        new = f.__click_params__[-1]  # type: ignore[attr-defined]
        for old in deprecated:
            alias = DeprecatedOption(
                [old, f"{new.name}__{old.lstrip('-').replace('-', '_')}"],
                use=new.opts[0],
                replacement=new,
                type=new.type,
                is_flag=new.is_flag,
                multiple=new.multiple,
                nargs=new.nargs,
                default=None,
            )
            f.__click_params__.append(alias)  # type: ignore[attr-defined]
        return f

    return decorator


class WarehouseLocation(click.ParamType):
    """A warehouse directory, or an ``s3://bucket/prefix`` URI (kept as text: a Path would
    fold its ``//``)."""

    name = "directory"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            return value
        return click.Path(file_okay=False, path_type=Path).convert(value, param, ctx)


class RequestsFile(click.ParamType):
    """A Parquet file of requests, or ``s3://bucket/key.parquet`` (fetched for the command,
    ``pipeline.objectstore.fetch``)."""

    name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            from pipeline import objectstore
            from pipeline.errors import PipelineError

            try:
                found = objectstore.fetch(value)
            except PipelineError as exc:
                self.fail(str(exc), param, ctx)
            if len(found) != 1:
                self.fail(f"{value}: names {len(found)} objects; give one Parquet file", param, ctx)
            return found[0]
        return click.Path(dir_okay=False, exists=True, path_type=Path).convert(value, param, ctx)


def warehouse(f: F) -> F:
    return click.option(
        "--warehouse",
        "warehouse",
        type=WarehouseLocation(),
        default=None,
        help="Warehouse directory or s3://bucket/prefix [env TRACEREPLAY_WAREHOUSE; config "
        "warehouse.path; default ./warehouse].",
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
    FORMATS = (
        "%Y-%m-%d",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M:%S",
    )

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


class Duration(click.ParamType):
    """A duration: a number of seconds, or with a unit (500ms, 90s, 15m, 1h, 1d), as seconds
    (``pipeline.busiest.parse_duration``): more than 0, or 0 too with ``zero``; ``inf``
    (none) only with ``inf``."""

    name = "DURATION"

    def __init__(self, *, zero: bool = False, inf: bool = False) -> None:
        self.zero, self.inf = zero, inf

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pipeline.busiest import parse_duration

        try:
            return parse_duration(value, zero=self.zero, inf=self.inf)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


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


# The short dtype spellings some commands took before vLLM's names (--dtype bfloat16,
# --kv-cache-dtype fp8); kept for one release.
DTYPE_SHORT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class DType(click.Choice):
    """A --dtype value by vLLM's names (float32, bfloat16, float16, fp8, ...); the short
    spellings of ``DTYPE_SHORT`` still work and print a deprecation line."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        new = DTYPE_SHORT.get(str(value).lower()) if isinstance(value, str) else None
        if new is not None and new in self.choices:
            flag = param.opts[0] if param is not None and param.opts else "--dtype"
            if ctx is None or not ctx.resilient_parsing:
                click.echo(deprecation_line(f"{flag} {value}", f"{flag} {new}"), err=True)
            value = new
        return super().convert(value, param, ctx)


def _check_where(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--where is checked as it is read, before the command takes the warehouse lock or
    reads anything (``pipeline.predicate``); a refusal is one line, exit 1. A blank one
    keeps every request, as no --where does."""
    if value is None or not value.strip():
        return None
    from pipeline.predicate import check_predicate

    return check_predicate(value, "--where")


@dataclass(frozen=True)
class Requests:
    """Which requests a command reads (``selection``): a Parquet file or the warehouse's
    days, and the filters on them."""

    file: Path | None = None
    date_from: Moment | None = None
    date_to: Moment | None = None
    models: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    where: str | None = None
    busiest: Any = None  # a pipeline.busiest.Busiest: the busiest window of the rest

    def kwargs(self) -> dict[str, Any]:
        """requests_file, date_from, date_to and selection, as the library functions take
        them (``selection_kwargs``)."""
        chosen = selection_kwargs(
            self.date_from, self.date_to, self.models, self.tenants, self.where, self.busiest
        )
        return {"requests_file": self.file, **chosen}


_REQUESTS_KEYS = ("requests_file", "date_from", "date_to", "models", "tenants", "where")
_BUSIEST_KEYS = ("busiest", "busiest_by", "busiest_warmup")


def _busiest(ctx: click.Context, chosen: dict[str, Any]) -> Any:
    """The ``Busiest`` of --busiest, --busiest-by and --busiest-warmup (None without
    --busiest; the other two alone are refused)."""
    from pipeline.busiest import Busiest

    if chosen["busiest"] is None:
        for key in ("busiest_by", "busiest_warmup"):
            if ctx.get_parameter_source(key) is ParameterSource.COMMANDLINE:
                flag = "--" + key.replace("_", "-")
                raise click.UsageError(f"{flag} needs --busiest DURATION, e.g. --busiest 1h")
        return None
    return Busiest(chosen["busiest"], chosen["busiest_by"], chosen["busiest_warmup"])


def selection(f: F) -> F:
    """--requests FILE, or --from/--to days (optionally with a time of day) of the warehouse,
    --model, --tenant, --where, and --busiest (with --busiest-by, --busiest-warmup): which
    requests to read. The command gets them as one argument, ``requests`` (a
    ``Requests``)."""
    return _selection(f, busiest=True)


def plain_selection(f: F) -> F:
    """``selection`` without --busiest: for commands that replay or fit every selected
    request alike (``calibrate observed``, ``live``)."""
    return _selection(f, busiest=False)


def _selection(f: F, *, busiest: bool) -> F:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        chosen = {key: kwargs.pop(key) for key in _REQUESTS_KEYS}
        window = None
        if busiest:
            window = _busiest(
                click.get_current_context(), {key: kwargs.pop(key) for key in _BUSIEST_KEYS}
            )
        requests = Requests(
            chosen["requests_file"],
            chosen["date_from"],
            chosen["date_to"],
            tuple(chosen["models"]),
            tuple(chosen["tenants"]),
            chosen["where"],
            window,
        )
        return f(*args, requests=requests, **kwargs)

    g: Any = wrapper
    if busiest:
        g = click.option(
            "--busiest-warmup",
            "busiest_warmup",
            type=Duration(zero=True),
            default="5m",
            show_default=True,
            metavar="DURATION",
            help="With --busiest: also replay the requests of this span before the window, "
            "so the engine is not empty at its start; they are left out of every figure "
            "(0: none).",
        )(g)
        g = click.option(
            "--busiest-by",
            "busiest_by",
            type=click.Choice(["arrivals", "tokens"]),
            default="arrivals",
            show_default=True,
            help="With --busiest: the window with the most arrivals, or the most prompt + "
            "output tokens.",
        )(g)
        g = click.option(
            "--busiest",
            "busiest",
            type=Duration(),
            default=None,
            metavar="DURATION",
            help="Only the busiest window of this length (15m, 1h, 90s) of the requests the "
            "other filters select (and its warm-up); it starts at a request's arrival, the "
            "earliest of equally busy ones.",
        )(g)
    g = click.option(
        "--where",
        "where",
        default=None,
        metavar="PREDICATE",
        callback=_check_where,
        help="Only requests matching this SQL predicate on the requests columns, e.g. "
        "\"prompt_tokens > 4000 AND tenant <> 'batch'\": one boolean expression with "
        "operators, CASE, CAST and scalar string, math, date and list functions; no "
        "subqueries, table functions or statements.",
    )(g)
    g = click.option(
        "--tenant", "tenants", multiple=True, help="Only this tenant's requests (repeatable)."
    )(g)
    g = click.option(
        "--model", "models", multiple=True, help="Only this model's requests (repeatable)."
    )(g)
    g = click.option(
        "--to",
        "date_to",
        type=MomentType(),
        default=None,
        help="Last request day (UTC, inclusive), or a time (exclusive), e.g. 2024-05-01T19:00.",
    )(g)
    g = click.option(
        "--from",
        "date_from",
        type=MomentType(),
        default=None,
        help="First request day (UTC), or a time of day, e.g. 2024-05-01T18:00.",
    )(g)
    g = click.option(
        "--requests",
        "requests_file",
        type=RequestsFile(),
        default=None,
        help="Replay one Parquet file (or s3://bucket/key) with the requests columns instead "
        "of the warehouse "
        "(e.g. written by `tracereplay sql --format parquet`).",
    )(g)
    return g  # type: ignore[no-any-return]


def selection_kwargs(
    date_from: Moment | None,
    date_to: Moment | None,
    models: tuple[str, ...] = (),
    tenants: tuple[str, ...] = (),
    where: str | None = None,
    busiest: Any = None,
) -> dict[str, Any]:
    """date_from, date_to (the days whose partitions are read) and selection (the rest;
    ``busiest``: a ``pipeline.busiest.Busiest``)."""
    from pipeline.selection import RequestFilter

    start = date_from.at if date_from is not None and date_from.has_time else None
    end = date_to.at if date_to is not None and date_to.has_time else None
    if start is not None and end is not None and not start < end:
        from pipeline.errors import ConfigError

        raise ConfigError(f"--from {start:%Y-%m-%dT%H:%M} is not before --to {end:%Y-%m-%dT%H:%M}")
    last_day = date_to.at.date() if date_to is not None else None
    if end is not None and end.time() == datetime.min.time():  # up to midnight: the day before
        last_day = (end - timedelta(days=1)).date()
    selection = RequestFilter(
        tuple(models), tuple(tenants), where or None, start, end, busiest=busiest
    )
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


def sets(f: F) -> F:
    """--set KEY=VALUE (``sets``, repeatable): any scenario key (``parse_sets``)."""
    return click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="Any scenario key (repeatable), e.g. --set drop_too_long=true.",
    )(f)


def scenario_flags(f: F) -> F:
    """The flags that set one scenario key each (--policy, --replicas, --max-num-seqs, ...)
    and --set: what ``replay`` builds its scenario from and ``capacity`` its base. The
    command gets the flags as one argument, ``scenario_flags`` (key -> value, None where
    not given), and the --set pairs as ``sets``."""
    from pipeline.sim.policies import POLICIES
    from pipeline.sim.routing import ROUTERS
    from pipeline.sim.scenario import ARRIVALS

    flags: list[click.Option] = [
        click.Option(
            ["--policy"],
            type=click.Choice(sorted(POLICIES)),
            default=None,
            help="Scheduler policy [default: vllm].",
        ),
        click.Option(["--profile"], default=None, help="Step-cost profile name or JSON file."),
        click.Option(
            ["--replicas"], type=SCENARIO_INT, default=None, help="Engine replicas [default: 1]."
        ),
        click.Option(
            ["--router"],
            type=click.Choice(sorted(ROUTERS)),
            default=None,
            help="How requests are spread over replicas [default: round_robin].",
        ),
        click.Option(
            ["--arrivals"],
            type=click.Choice(ARRIVALS),
            default=None,
            help="Trace timestamps, or drawn poisson/gamma arrivals [default: trace].",
        ),
        click.Option(
            ["--rate"], type=SCENARIO_FLOAT, default=None, help="Target request rate (req/s)."
        ),
        click.Option(
            ["--time-scale"],
            type=SCENARIO_FLOAT,
            default=None,
            help="Multiply the trace's inter-arrival times (0.5 = twice as fast).",
        ),
        click.Option(
            ["--burstiness"], type=SCENARIO_FLOAT, default=None, help="Gamma shape (1 = poisson)."
        ),
        click.Option(
            ["--num-requests"], type=SCENARIO_INT, default=None, help="Requests to replay."
        ),
        click.Option(
            ["--seed"], type=SCENARIO_INT, default=None, help="Seed of the scenario's generator."
        ),
        click.Option(
            ["--max-output-tokens"],
            type=SCENARIO_INT,
            default=None,
            help="Cap every output length.",
        ),
        click.Option(
            ["--max-model-len"], type=SCENARIO_INT, default=None, help="Longest prompt + output."
        ),
        click.Option(
            ["--num-gpu-blocks"], type=SCENARIO_INT, default=None, help="KV blocks per replica."
        ),
        click.Option(
            ["--gpu-memory-utilization"],
            type=SCENARIO_FLOAT,
            default=None,
            help="Share of GPU memory for weights + KV [default: 0.9].",
        ),
        click.Option(
            ["--block-size"],
            type=SCENARIO_INT,
            default=None,
            help="Tokens per KV block [default: 16; 1 for sglang and tgi].",
        ),
        click.Option(
            ["--max-num-seqs"], type=SCENARIO_INT, default=None, help="vllm, orca, sarathi."
        ),
        click.Option(
            ["--max-num-batched-tokens"],
            type=SCENARIO_INT,
            default=None,
            help="vllm token budget.",
        ),
        click.Option(
            ["--enable-chunked-prefill/--no-enable-chunked-prefill"],
            default=None,
            help="vllm chunked prefill [default: on].",
        ),
        click.Option(
            ["--long-prefill-token-threshold"], type=SCENARIO_INT, default=None, help="vllm."
        ),
        click.Option(["--watermark"], type=SCENARIO_FLOAT, default=None, help="vllm, sarathi."),
        click.Option(
            ["--chunk-size"], type=SCENARIO_INT, default=None, help="sarathi token budget."
        ),
        click.Option(["--max-batch-size"], type=SCENARIO_INT, default=None, help="static."),
        click.Option(["--max-wait-s"], type=SCENARIO_FLOAT, default=None, help="static."),
    ]
    keys = [p.name for p in flags]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        chosen = {key: kwargs.pop(key) for key in keys}
        return f(*args, scenario_flags=chosen, **kwargs)

    g: Any = sets(wrapper)
    g.__click_params__.extend(reversed(flags))  # click lists them in reverse, as decorators do
    return g  # type: ignore[no-any-return]


def quiet(f: F) -> F:
    """--quiet/-q (``quiet``)."""
    return click.option(
        "--quiet", "-q", is_flag=True, help="No progress bar or notes, the summary only."
    )(f)


def as_json(f: F) -> F:
    """--json (``as_json``): what the command prints, as one JSON document."""
    return click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")(f)


def output(f: F) -> F:
    """--json and --quiet: the summary as JSON; the summary alone."""
    return as_json(quiet(f))


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


def pairing(f: F) -> F:
    """--by name|position and --pair A=B (``pair_by``, ``pairs``): how two runs' scenarios
    pair (``pipeline.compare.pair_scenarios``)."""
    f = click.option(
        "--pair",
        "pairs",
        multiple=True,
        metavar="SCENARIO_A=SCENARIO_B",
        help="Pair this scenario of run A with this one of run B (repeatable; the rest "
        "pair by name).",
    )(f)
    return click.option(
        "--by",
        "pair_by",
        type=click.Choice(["name", "position"]),
        default="name",
        show_default=True,
        help="Pair scenarios by name (when no name is in both runs and they have as many "
        "scenarios: by position, said so) or by position (first with first, ...).",
    )(f)


def locked(f: F) -> F:
    """Run the command holding the warehouse lock (``pipeline.lock``); adds --lock-timeout-s.

    Put it right above the function, below every other option: it reads the
    command's ``warehouse`` and ``config_file`` arguments to find the warehouse.
    """

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
    """--lock-timeout-s SECONDS (``lock_timeout``): how long to wait for the warehouse lock."""
    return option(
        "--lock-timeout-s",
        "lock_timeout",
        deprecated=("--lock-timeout",),
        type=BoundedFloat(0.0, 1e7),
        default=600.0,
        show_default=True,
        envvar="TRACEREPLAY_LOCK_TIMEOUT",
        metavar="SECONDS",
        help="Wait this long for another command writing the warehouse, then give up "
        "[env TRACEREPLAY_LOCK_TIMEOUT].",
    )(f)


jobs = click.option(
    "--jobs",
    "-j",
    type=BoundedInt(1, 4096),
    default=None,
    help="Local worker processes [default: every core; 1 runs in this process].",
)


def shards(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--shards N`` and ``--shard-warmup DURATION`` (``pipeline.sim.shard``)."""
    f = click.option(
        "--shard-warmup",
        "shard_warmup_s",
        type=Duration(zero=True),
        default=None,
        metavar="DURATION",
        help="Cut by time, each window replayed after this much of the traffic before it "
        "[default for a load-aware router: 60s].",
    )(f)
    return click.option(
        "--shards",
        type=BoundedInt(1, 1 << 20),
        default=None,
        metavar="N",
        help="Replay each scenario in N parts, one at a time, to bound memory: replica "
        "groups under round_robin (exact), else time windows with a warm-up (approximate).",
    )(f)


ray = click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    default=None,
    help="Run on the Ray cluster at ADDRESS (what `ray start --head` prints; 'auto' for a "
    "local one). Needs pip install 'tracereplay[ray]' on every node.",
)
