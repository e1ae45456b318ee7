"""Start-up: the top-level help and `sql` import only what they use; lazily loaded modules."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from pipeline.cli import COMMANDS, PipelineGroup, cli
from pipeline.cli.summaries import short_help


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    prog = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True)
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("name", sorted(COMMANDS))
@pytest.mark.parametrize("limit", [45, 60])
def test_summary_read_from_source_is_what_click_shows(name: str, limit: int) -> None:
    group = cli
    assert isinstance(group, PipelineGroup)
    command = group.get_command(click.Context(cli), name)
    assert command is not None
    assert short_help(COMMANDS[name], limit) == command.get_short_help_str(limit)


def test_top_level_help_lists_every_command() -> None:
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0, r.output
    listed = r.output.split("Commands:")[1]
    for name in COMMANDS:
        assert f"  {name} " in listed


def test_help_imports_no_command_and_no_heavy_library() -> None:
    code = (
        "import sys\nfrom pipeline.cli import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit:\n    pass"
    )
    loaded = _modules_after(code)
    heavy = {"polars", "numba", "numpy", "pyarrow", "duckdb", "altair", "pipeline.sim"}
    assert not heavy & loaded
    commands = {m for m in loaded if m.startswith("pipeline.cli.")} - {"pipeline.cli.summaries"}
    assert not commands


def test_sql_select_1_prints_its_table_without_polars(tmp_path) -> None:
    from pipeline.warehouse import Warehouse

    Warehouse(tmp_path).init()
    code = (
        "from pipeline.cli import cli\n"
        f"try:\n    cli(['sql', '--warehouse', {str(tmp_path)!r}, 'select 1 AS one'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code"
    )
    first = _modules_after(code)  # verifies the schema files once (pyarrow) and says so
    assert "pyarrow.lib" in first
    loaded = _modules_after(code)  # reads the verdicts kept beside them
    # polars is there as a lazy module (pipeline.lazy), never loaded
    assert not {"polars.dataframe", "numba", "pipeline.sim", "pipeline.plan"} & loaded
    # nor pyarrow and numpy: the contracts name their types as text, the views need no more
    assert not {"pyarrow.lib", "numpy"} & loaded
    assert "duckdb" in loaded  # it did run the query


def test_sql_command_does_not_load_the_charts() -> None:
    loaded = _modules_after("import pipeline.cli.sql")
    assert "pipeline.report" in loaded
    assert not {"altair", "jinja2", "numba", "pipeline.sim"} & loaded


def test_lazy_module_loads_on_first_attribute() -> None:
    code = (
        "from pipeline.lazy import lazy_import\n"
        "m = lazy_import('pipeline.report.charts')\n"
        "import sys\nassert 'altair' not in sys.modules\n"
        "m.ChartOptions\nassert 'altair' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_submodule_does_not_import_its_package_until_used() -> None:
    code = (
        "from pipeline.lazy import lazy_import\n"
        "pa = lazy_import('pyarrow')\n"
        "pq = lazy_import('pyarrow.parquet')\n"
        "import sys\nassert 'pyarrow.lib' not in sys.modules\n"
        "assert pq.ParquetFile is sys.modules['pyarrow.parquet'].ParquetFile\n"
        "assert pq.read_table is sys.modules['pyarrow.parquet'].read_table\n"
        "assert pa.int32() == sys.modules['pyarrow'].int32()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_module_that_does_not_exist() -> None:
    from pipeline.lazy import lazy_import

    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        lazy_import("pipeline.no_such_module")


@pytest.mark.parametrize(
    ("given", "last"),
    [
        (None, "dirty_decay_ms:100,muzzy_decay_ms:0"),
        # inherited from a parent process that imported polars: polars' own, not the user's
        ("dirty_decay_ms:500,muzzy_decay_ms:1000", "dirty_decay_ms:100,muzzy_decay_ms:0"),
        ("dirty_decay_ms:7", "dirty_decay_ms:7"),
    ],
)
def test_polars_returns_freed_memory_soon_unless_the_user_says_otherwise(
    given: str | None, last: str
) -> None:
    # jemalloc reads the options left to right: the last one given wins
    import os

    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if given is not None:
        env["_RJEM_MALLOC_CONF"] = given
    prog = "import pipeline.sim.replay, os; print(os.environ['_RJEM_MALLOC_CONF'])"
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                       check=True)  # fmt: skip
    assert r.stdout.strip().endswith(last)


_POLARS = "dirty_decay_ms:500,muzzy_decay_ms:1000"
_SOON = "dirty_decay_ms:100,muzzy_decay_ms:0"


@pytest.mark.parametrize(
    ("given", "mark", "last"),
    [
        (None, None, _POLARS),
        # inherited from a tracereplay parent that imported polars: not the user's
        (f"{_POLARS},{_SOON}", _SOON, _POLARS),
        (_SOON, _SOON, _POLARS),
        ("dirty_decay_ms:7", None, "dirty_decay_ms:7"),
        # the user's, equal to the replay setting but not marked as set by a parent
        (_SOON, None, _SOON),
    ],
)
def test_the_ingest_command_keeps_polars_allocator_setting(
    given: str | None, mark: str | None, last: str
) -> None:
    """``tracereplay ingest`` does not return freed pages early (pipeline/allocator.py)."""
    import os

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("_RJEM_MALLOC_CONF", "TRACEREPLAY_RJEM_MALLOC_CONF")
    }
    if given is not None:
        env["_RJEM_MALLOC_CONF"] = given
    if mark is not None:
        env["TRACEREPLAY_RJEM_MALLOC_CONF"] = mark
    prog = (
        "from click.testing import CliRunner; from pipeline.cli import cli; import os, sys; "
        "r = CliRunner().invoke(cli, ['ingest', '--help']); assert r.exit_code == 0, r.output; "
        "assert 'polars' in sys.modules; print(os.environ['_RJEM_MALLOC_CONF'])"
    )
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                       check=True)  # fmt: skip
    assert r.stdout.strip().endswith(last)
    assert not (last == _POLARS and r.stdout.strip().endswith(_SOON))


def test_the_setting_changes_nothing_once_polars_is_imported() -> None:
    prog = (
        "import polars, os; from pipeline import allocator; "
        "before = os.environ.get('_RJEM_MALLOC_CONF'); "
        "print(allocator.configure('ingest'), os.environ.get('_RJEM_MALLOC_CONF') == before)"
    )
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["False", "True"]
