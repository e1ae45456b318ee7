"""One-line command summaries for ``tracereplay --help``, read without importing the commands.

Importing a command module pulls in what the command uses (polars, numba, the
simulator, altair), which takes seconds; the top-level help only needs the first
line of each command's docstring. This module reads it from the module's source
with ``ast``: the function decorated with ``@click.command`` or ``@click.group``
(the one named as the command's attribute where a module holds several; its
``short_help=`` if given, else its docstring, shortened by click).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import click


def short_help(target: str, limit: int = 45) -> str | None:
    """The short help of the command at ``"module:attr"``, or None when it cannot be read."""
    module = target.split(":")[0]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text())
    except (OSError, SyntaxError):
        return None
    attr = target.split(":")[1]
    found = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and _command_call(f)]
    named = [f for f in found if f.name == attr]  # a group and its subcommands: the group
    found = named or found
    if len(found) != 1:  # none, or several commands in one module: let the caller import it
        return None
    func = found[0]
    call = _command_call(func)
    assert call is not None
    for kw in call.keywords:
        if kw.arg == "short_help" and isinstance(kw.value, ast.Constant):
            return inspect.cleandoc(str(kw.value.value))
        if kw.arg == "help":  # help= given: click would use it, and we cannot always read it
            return None
    # a stand-in command with the same help text shortens it exactly as click would
    return click.Command(func.name, help=ast.get_docstring(func)).get_short_help_str(limit)


def _command_call(func: ast.FunctionDef) -> ast.Call | None:
    """The ``click.command(...)`` (or ``group``) call decorating ``func``, if any."""
    for dec in func.decorator_list:
        node = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(node, ast.Attribute) and node.attr in ("command", "group"):
            return dec if isinstance(dec, ast.Call) else ast.Call(node, [], [])
    return None
