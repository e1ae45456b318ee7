"""The ``tracereplay`` command line: thin commands over the library."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import click

from pipeline import __version__, allocator
from pipeline.errors import PipelineError


@dataclass
class CliState:
    debug: bool = False


# Commands are imported when used, so `tracereplay ingest` does not pay for
# compiling the simulator.
COMMANDS = {
    "calibrate": "pipeline.cli.calibrate:calibrate",
    "capacity": "pipeline.cli.capacity:capacity",
    "check": "pipeline.cli.check:check",
    "compare": "pipeline.cli.compare:compare",
    "ingest": "pipeline.cli.ingest:ingest",
    "profile": "pipeline.cli.profile:profile",
    "live": "pipeline.cli.live:live",
    "nightly": "pipeline.cli.nightly:nightly",
    "replay": "pipeline.cli.replay:replay",
    "report": "pipeline.cli.report:report",
    "run": "pipeline.cli.run:run",
    "sql": "pipeline.cli.sql:sql",
    "sweep": "pipeline.cli.sweep:sweep",
    "validate": "pipeline.cli.validate:validate",
}
# The allocator setting of a command that is not a replay's (see pipeline/allocator.py);
# chosen before the command's module imports polars.
ALLOCATOR = {"ingest": "ingest"}


class PipelineGroup(click.Group):
    """Expected failures (PipelineError, and an OSError of the file system such as a full
    disk: ``pipeline.storage``) print one line and exit 1; bugs keep their traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        if cmd_name in ALLOCATOR:
            allocator.configure(ALLOCATOR[cmd_name])
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The summaries come from the commands' sources, so --help imports none of them.
        from pipeline.cli.summaries import short_help

        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = []
        for name in names:
            text = short_help(COMMANDS[name], limit)
            if text is None:
                command = self.get_command(ctx, name)
                text = command.get_short_help_str(limit) if command else ""
            rows.append((name, text))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            if ctx.obj is not None and ctx.obj.debug:
                raise
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            # a full disk, a read-only mount, a missing permission, ... where no command
            # said what it writes (pipeline.storage): by errno only, and only with a path;
            # any other OSError may be a bug and keeps its traceback
            from pipeline.storage import storage_error

            err = storage_error(exc)
            if err is None or (ctx.obj is not None and ctx.obj.debug):
                raise
            raise click.ClickException(str(err)) from exc


@click.group(cls=PipelineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="TRACEREPLAY_DEBUG", help="Show full tracebacks.")
@click.version_option(__version__, prog_name="tracereplay")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Ingest LLM serving logs, replay them through scheduler models, report on them."""
    ctx.obj = CliState(debug=debug)
    if debug:  # tracebacks of errors the commands catch and report in one line
        import logging  # here: --help and most commands never log

        logging.basicConfig(format="%(name)s: %(message)s")
        logging.getLogger("pipeline").setLevel(logging.DEBUG)
