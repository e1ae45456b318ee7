"""Every command's flags, checked together: --help renders with an example, one name per
concept across the commands, the unit in a duration's name, and each deprecated spelling
hidden, still working and saying so on stderr."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.cli.options import DeprecatedOption, RenamedOption


def _commands() -> dict[str, click.Command]:
    """Every command and subcommand of the group, by its path ("" for the group)."""
    ctx = click.Context(cli)
    out: dict[str, click.Command] = {}

    def walk(cmd: click.Command, path: str) -> None:
        out[path] = cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, f"{path} {name}".strip())

    walk(cli, "")
    return out


COMMANDS = _commands()
LEAVES = {path: cmd for path, cmd in COMMANDS.items() if path}


def _options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option)]


def _visible_flags(cmd: click.Command) -> set[str]:
    return {o for p in _options(cmd) if not p.hidden for o in p.opts + p.secondary_opts}


# concept -> (the canonical flag, the spellings no command may show for it). The
# canonical names are vLLM's where it has one.
CONCEPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "KV blocks": ("--num-gpu-blocks", ("--num-blocks", "--kv-blocks")),
    "tokens per KV block": ("--block-size", ("--kv-block-size",)),
    "tokens per prefix-hash block": ("--prefix-block-tokens", ("--hash-block-size",)),
    "requests replayed": ("--num-requests", ("--sample", "--num-prompts")),
    "tokens per engine step": (
        "--max-num-batched-tokens",
        ("--max-batch-tokens", "--max-tokens-per-step"),
    ),
    "weights dtype": ("--dtype", ("--torch-dtype",)),
    "KV cache dtype": ("--kv-cache-dtype", ("--kv-dtype",)),
    "tensor parallel GPUs": ("--tensor-parallel-size", ("--tp",)),
    "per-request timeout": ("--timeout-s", ("--timeout", "--request-timeout")),
    "metrics scrape interval": ("--metrics-interval-s", ("--metrics-interval",)),
    "warehouse lock wait": ("--lock-timeout-s", ("--lock-timeout",)),
    "longest sleep between arrivals": ("--max-gap-s", ("--max-wait",)),
    "input log format": ("--log-format", ()),
    "output format": ("--format", ()),
    "general config file": ("--config", ("--config-file",)),
    "summary as JSON": ("--json", ("--as-json",)),
    "model name in a profile": ("--model-name", ()),
}

# flags that name one concept in every command that has them, and the commands where a
# flag of that spelling would mean something else (so it must not be there)
SAME_MEANING = {
    "--format": ("sql",),  # the output format; ingest's log format is --log-format
    "--block-size": ("replay", "capacity", "live", "calibrate live"),  # the KV block
    "--config": tuple(p for p in LEAVES if p != "nightly"),  # the general config file
    "--name": ("replay",),  # the scenario's name
}

# every deprecated spelling: command -> old flag -> what to use
DEPRECATED = {
    "live": {
        "--sample": "--num-requests",
        "--num-blocks": "--num-gpu-blocks",
        "--max-batch-tokens": "--max-num-batched-tokens",
        "--timeout": "--timeout-s",
        "--metrics-interval": "--metrics-interval-s",
        "--max-wait": "--max-gap-s",
    },
    "ingest": {"--block-size": "--prefix-block-tokens", "--format": "--log-format"},
    "profile new": {
        "--tp": "--tensor-parallel-size",
        "--kv-dtype": "--kv-cache-dtype",
        "--name": "--model-name",
    },
    "nightly": {"--config": "the NIGHTLY_FILE argument"},
    "sql": {"--json": "--format json"},
    "report": {"--slo-ttft-ms": "--slo ttft_p99=<N>ms"},
}
for _path, _cmd in LEAVES.items():  # every command that takes the warehouse lock
    if any("--lock-timeout-s" in p.opts for p in _options(_cmd)):
        DEPRECATED.setdefault(_path, {})["--lock-timeout"] = "--lock-timeout-s"


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_help_renders_with_an_example(path: str) -> None:
    """--help exits 0 and has an Example paragraph: lines that run this very command,
    each on its own line (a line never holds two commands run together)."""
    result = CliRunner().invoke(cli, [*path.split(), "--help"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    if not path:  # the group itself lists the commands
        return
    assert "  Example:" in lines, f"{path} --help has no Example paragraph"
    block = lines[lines.index("  Example:") + 1 :]
    block = block[: next(i for i, line in enumerate(block) if line.startswith("Options:"))]
    runs = [line.strip() for line in block if line.strip().startswith("tracereplay ")]
    assert any(line.startswith(f"tracereplay {path}") for line in runs), (path, runs)
    for line in block:
        assert line.count("tracereplay ") <= 1, f"{path}: example lines run together: {line}"


def test_replay_help_lists_every_policy() -> None:
    from pipeline.sim.policies import POLICIES

    text = " ".join(CliRunner().invoke(cli, ["replay", "--help"]).output.split())
    assert f"Policies: {', '.join(POLICIES)};" in text


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_one_name_per_concept(path: str) -> None:
    flags = _visible_flags(LEAVES[path])
    for concept, (canonical, others) in CONCEPTS.items():
        shown = flags & set(others)
        assert not shown, f"{path}: {sorted(shown)} for {concept}; the name is {canonical}"
    for flag, where in SAME_MEANING.items():
        if flag in flags:
            assert path in where, f"{path}: {flag} means something else here"


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_durations_carry_their_unit(path: str) -> None:
    """A flag in seconds says so in its name: --timeout-s, not --timeout."""
    for p in _options(LEAVES[path]):
        if p.hidden or p.is_flag:
            continue
        name = p.opts[0]
        seconds = p.metavar == "SECONDS" or re.search(r"(timeout|interval|wait|gap)", name)
        if seconds:
            assert name.endswith("-s"), f"{path}: {name} is in seconds; call it {name}-s"


def test_deprecated_spellings_are_all_listed() -> None:
    """Every hidden option is a deprecated spelling, and the table above names each one."""
    found: dict[str, dict[str, str]] = {}
    for path, cmd in LEAVES.items():
        for p in _options(cmd):
            if p.hidden:
                assert isinstance(p, DeprecatedOption), f"{path}: {p.opts} is hidden"
                found.setdefault(path, {})[p.opts[0]] = p.use
    assert found == DEPRECATED


# what each command needs besides the flag under test, to parse (files made in tmp_path)
def _required(path: str, tmp: Path) -> list[str]:
    f = tmp / "f.toml"
    f.write_text("")
    return {
        "live": ["--engine", "http"],
        "ingest": [str(f)],
        "sweep": [str(f)],
        "calibrate observed": ["--scenario", str(f), "-o", str(tmp / "o.json")],
        "calibrate measurements": [str(f), "--like", "x", "-o", str(tmp / "o.json")],
        "calibrate live": ["-o", str(tmp / "o.json")],
        "profile new": ["--model-config", str(f), "-o", str(tmp / "o.json")],
        "profile check": ["x", str(f)],
        "validate": ["RUN"],
        "compare": ["RUN_A", "RUN_B"],
    }.get(path, [])


def _sample(p: click.Option, tmp: Path) -> tuple[list[str], Any]:
    """Command-line words giving ``p`` a value, and the value it parses to."""
    if p.is_flag:
        return [], True
    if isinstance(p.type, click.Choice):
        word = str(p.type.choices[-1])
    elif isinstance(p.type, click.Path):
        (tmp / "v.toml").write_text("")
        word = str(tmp / "v.toml")
    elif p.type.name.upper() == "INTEGER":
        word = "3"
    else:
        word = "2.5"
    return [word], p.type.convert(word, p, None)


@pytest.mark.parametrize(
    "path,old", [(path, old) for path, olds in sorted(DEPRECATED.items()) for old in olds]
)
def test_deprecated_spelling_works_and_warns(
    path: str, old: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = LEAVES[path]
    (alias,) = [p for p in _options(cmd) if p.opts[0] == old]
    assert isinstance(alias, DeprecatedOption) and alias.hidden
    words, value = _sample(alias, tmp_path)
    ctx = cmd.make_context(path, [*_required(path, tmp_path), old, *words])
    err = capsys.readouterr().err
    assert err.splitlines() == [f"warning: {old} is deprecated; use {alias.use}"]
    target = alias.replacement
    if target is None:  # the command reads it itself
        assert ctx.params[alias.name] == value
        return
    assert isinstance(target, RenamedOption) and not target.hidden
    assert alias.use == target.opts[0]
    assert ctx.params[target.name] == value
    # the new name alone: no line; both: refused
    cmd.make_context(path, [*_required(path, tmp_path), target.opts[0], *words])
    assert capsys.readouterr().err == ""
    for order in ([old, *words, target.opts[0], *words], [target.opts[0], *words, old, *words]):
        with pytest.raises(click.UsageError, match="not both"):
            cmd.make_context(path, [*_required(path, tmp_path), *order])


def test_deprecated_dtype_spelling(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--dtype takes vLLM's names everywhere; the short ones still work, and say so."""
    ctx = LEAVES["profile new"].make_context(
        "new", [*_required("profile new", tmp_path), "--dtype", "bf16", "--kv-cache-dtype", "fp8"]
    )
    assert ctx.params["dtype"] == "bfloat16" and ctx.params["kv_dtype"] == "fp8"
    assert capsys.readouterr().err.strip() == (
        "warning: --dtype bf16 is deprecated; use --dtype bfloat16"
    )
    for path in ("live", "calibrate live"):
        ctx = LEAVES[path].make_context(path, [*_required(path, tmp_path), "--dtype", "fp32"])
        assert ctx.params["dtype"] == "float32"


def test_nightly_file_is_an_argument(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["nightly"])
    assert result.exit_code == 2 and "NIGHTLY_FILE" in result.output
