"""The ``tracereplay`` command line: thin commands over the library."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from pipeline import __version__
from pipeline.errors import PipelineError


@dataclass
class CliState:
    debug: bool = False


class PipelineGroup(click.Group):
    """Expected failures (PipelineError) print one line and exit 1; bugs keep their traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            if ctx.obj is not None and ctx.obj.debug:
                raise
            raise click.ClickException(str(exc)) from exc


@click.group(cls=PipelineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="TRACEREPLAY_DEBUG", help="Show full tracebacks.")
@click.version_option(__version__, prog_name="tracereplay")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Ingest LLM serving logs, replay them through scheduler models, report on them."""
    ctx.obj = CliState(debug=debug)


def _register() -> None:
    from pipeline.cli.ingest import ingest
    from pipeline.cli.replay import replay
    from pipeline.cli.run import run

    for command in (ingest, replay, run):
        cli.add_command(command)


_register()
