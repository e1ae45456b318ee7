"""Sweep grids: a TOML file that expands into many scenarios, checked before anything runs.

::

    name = "lab"                  # optional: prefix of every scenario name

    [base]                        # scenario keys every point shares (docs/replay.md)
    drop_too_long = true

    [axes]                        # one list per key; the grid is their product
    policy = ["static", "vllm"]
    concurrency = [16, 64, 256]   # the policy's cap: max_batch_size, max_num_seqs, ...
    replicas = [1, 2]
    rate_scale = [1, 2, 4]        # multiply the trace's request rate
    profile = ["llama-3-8b_h100-80gb_tp1", "llama-3-8b_h200_tp1"]

    [axes.sarathi]                # axes for the points of one policy only
    chunk_size = [512, 2048]

    [slo]                         # optional: goodput and met / not met per scenario
    ttft_p99 = "200ms"

An axis is any scenario key (``name`` and ``cost`` excepted) or one of five
derived keys: ``concurrency`` sets the policy's concurrency cap (see
``knobs.py``), ``rate_scale`` multiplies the request rate: the base
``rate`` times it, else ``time_scale`` divided by it, ``sched_overlap``
sets whether the engine's scheduler overlaps the GPU step (``knobs.py``), and
``spec_num_tokens`` / ``spec_acceptance`` set k and the acceptance rate of the
``[base.speculative]`` table. ``swap_space_gb`` (a vllm key) is checked as a knob: some
point must swap (``preemption_mode = "swap"``). A parameter that only some of the grid's
policies have goes under ``[axes.<policy>]``.

Scenario names are the grid's name followed by the value of every axis that
takes more than one value (``lab-vllm-c64-x2``). Values come, by precedence,
from the axes, then ``[base]``, then the config file's ``[replay]`` section.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, ScenarioError
from pipeline.plan.knobs import (
    SPEC_KNOBS,
    SWAP_SPACE_KNOB,
    concurrency_knob,
    overlap_knob,
    spec_knob,
    swap_knob,
)
from pipeline.plan.slo import Slo, parse_slos
from pipeline.sim.policies import POLICIES
from pipeline.sim.scenario import COMMON, Scenario, build_scenario
from pipeline.sim.sched_cpu import OVERLAP_KEYS
from pipeline.sim.speculation import MAX_TOKENS
from pipeline.validation import finite_float, read_toml_file

SECTIONS = ("name", "base", "axes", "slo")
DERIVED = {
    "concurrency": "the policy's concurrency cap (max_num_seqs, max_batch_size, ...)",
    "rate_scale": "multiply the trace's request rate (time_scale / x, or rate * x)",
    "sched_overlap": "the scheduler overlaps the GPU step (vllm async_scheduling, sglang "
    "overlap_schedule; false only for the synchronous engines)",
    "spec_num_tokens": f"speculative decoding's k, 1 to {MAX_TOKENS} (vllm; the rest of the "
    "table in [base.speculative])",
    "spec_acceptance": "speculative decoding's acceptance rate, 0 to 1 (vllm; the rest of the "
    "table in [base.speculative])",
}
SCHED_OVERLAP_AXIS = "sched_overlap"
NOT_AXES = ("name", "cost")
MAX_POINTS = 10_000

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_SHORT = {
    "concurrency": "c",
    "rate_scale": "x",
    "replicas": "r",
    "spec_num_tokens": "k",
    "spec_acceptance": "acc",
    "swap_space_gb": "swap",
}


@dataclass(frozen=True)
class GridPoint:
    """One scenario of the grid and the axis values that made it."""

    scenario: Scenario
    coords: dict[str, Any]  # axis -> value (shared and per-policy axes)


@dataclass(frozen=True)
class Grid:
    """An expanded, validated grid."""

    where: str
    points: list[GridPoint]
    slos: list[Slo] = field(default_factory=list)

    @property
    def scenarios(self) -> list[Scenario]:
        return [p.scenario for p in self.points]


def read_grid_file(path: Path) -> dict[str, Any]:
    """The raw TOML of a grid file.

    Raises:
        ConfigError: unreadable file or invalid TOML.
    """
    return read_toml_file(path, "grid file")


def load_grid(
    path: Path,
    defaults: dict[str, Any] | None = None,
    *,
    extra_slos: list[Slo] | None = None,
) -> Grid:
    """Read, expand and validate a grid file.

    Args:
        path: the grid TOML file.
        defaults: the config file's ``[replay]`` section.
        extra_slos: SLOs from the command line; they replace the file's of the same name.

    Raises:
        ConfigError: a malformed grid (unknown section, empty or non-list axis, unknown
            axis, conflicting axes, bad SLO), naming the file and the key.
        ScenarioError: a point that is not a valid scenario, naming it and the key.
    """
    return build_grid(
        read_grid_file(path), where=str(path), defaults=defaults, extra_slos=extra_slos
    )


def build_grid(
    raw: dict[str, Any],
    *,
    where: str = "grid",
    defaults: dict[str, Any] | None = None,
    extra_slos: list[Slo] | None = None,
) -> Grid:
    """Expand and validate a grid given as a dict (the TOML of a grid file)."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; a grid has: {', '.join(SECTIONS)}"
        )
    prefix = raw.get("name")
    if prefix is not None and (not isinstance(prefix, str) or _BAD_NAME_CHARS.search(prefix)):
        raise ConfigError(f"{where}: name must be letters, digits, '.', '_' or '-'")
    base = _table(raw, "base", where)
    axes_raw = _table(raw, "axes", where)
    slos = parse_slos(_table(raw, "slo", where), where=f"{where} [slo]")
    for slo in extra_slos or []:
        slos = [s for s in slos if s.key != slo.key] + [slo]

    shared = {k: v for k, v in axes_raw.items() if not isinstance(v, dict)}
    per_policy = {k: v for k, v in axes_raw.items() if isinstance(v, dict)}
    if not shared and not per_policy:
        raise ConfigError(
            f"{where}: [axes] is empty; give at least one axis, e.g. concurrency = [16, 64, 256]"
        )
    defaults = dict(defaults or {})
    policies = (
        _check_axis(where, "axes", "policy", shared["policy"])
        if "policy" in shared
        else [base.get("policy", defaults.get("policy", COMMON["policy"][1]))]
    )
    for policy in policies:
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ConfigError(
                f"{where}: [axes] policy: unknown policy {policy!r}; allowed: "
                f"{', '.join(sorted(POLICIES))}"
            )
    for key, values in shared.items():
        _check_axis(where, "axes", key, values)
        _check_key(where, key, policies, section="axes")
    for policy, table in per_policy.items():
        if policy not in POLICIES:
            raise ConfigError(
                f"{where}: [axes.{policy}]: {policy!r} is not a policy; allowed: "
                f"{', '.join(sorted(POLICIES))}"
            )
        if policy not in policies:
            raise ConfigError(
                f"{where}: [axes.{policy}]: the grid has no {policy} points (policies: "
                f"{', '.join(policies)})"
            )
        for key, values in table.items():
            if key == "policy":
                raise ConfigError(f"{where}: [axes.{policy}] cannot have a policy axis")
            _check_axis(where, f"axes.{policy}", key, values)
            _check_key(where, key, [policy], section=f"axes.{policy}")
            if key in shared:
                raise ConfigError(f"{where}: {key} is both in [axes] and in [axes.{policy}]")
    _check_conflicts(where, shared, per_policy, policies, {**defaults, **base})

    shared_keys = list(shared)
    combos = list(itertools.product(*(shared[k] for k in shared_keys))) if shared else [()]
    total = sum(
        _count(per_policy.get(_policy_of(dict(zip(shared_keys, c, strict=True)), policies[0])))
        for c in combos
    )
    if total > MAX_POINTS:
        raise ConfigError(f"{where}: the grid has {total:,} points (at most {MAX_POINTS:,})")

    varying = {k for k in shared_keys if len(set(map(repr, shared[k]))) > 1}
    points: list[GridPoint] = []
    names: set[str] = set()
    for combo in combos:
        coords = dict(zip(shared_keys, combo, strict=True))
        policy = _policy_of(coords, policies[0])
        own = per_policy.get(policy, {})
        own_keys = list(own)
        for own_combo in itertools.product(*(own[k] for k in own_keys)) if own else [()]:
            point = {**coords, **dict(zip(own_keys, own_combo, strict=True))}
            own_varying = {k for k in own_keys if len(set(map(repr, own[k]))) > 1}
            name = _unique(_name(prefix, point, varying | own_varying, policy), names)
            values = _values(defaults, base, point, policy, name)
            scenario = build_scenario(values, where=f"{where} [{name}]")
            points.append(GridPoint(scenario=scenario, coords=point))
    return Grid(where=where, points=points, slos=slos)


def _table(raw: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a table ([{key}])")
    return value


def _check_axis(where: str, section: str, key: str, values: Any) -> list[Any]:
    if not isinstance(values, list):
        raise ConfigError(
            f"{where}: [{section}] {key} must be a list of values, e.g. {key} = [{values!r}]; "
            "put a fixed value in [base]"
        )
    if not values:
        raise ConfigError(f"{where}: [{section}] {key} is empty; give it at least one value")
    if any(isinstance(v, dict | list) for v in values):
        raise ConfigError(f"{where}: [{section}] {key}: values must be numbers, strings or bools")
    return values


def _check_key(where: str, key: str, policies: list[str], *, section: str) -> None:
    if key in NOT_AXES:
        raise ConfigError(f"{where}: [{section}] {key} cannot be an axis")
    if key in COMMON or key in DERIVED:
        return
    owners = [p for p in sorted(POLICIES) if key in POLICIES[p].param_help()]
    if not owners:
        allowed = sorted({*COMMON, *DERIVED} - set(NOT_AXES)) + sorted(
            {k for p in POLICIES.values() for k in p.param_help()}
        )
        raise ConfigError(
            f"{where}: [{section}] unknown axis {key!r}; allowed: {', '.join(allowed)}"
        )
    lacking = [p for p in policies if p not in owners]
    if lacking:
        raise ConfigError(
            f"{where}: [{section}] {key} is not a parameter of {', '.join(lacking)} (it is one "
            f"of {', '.join(owners)}); put it under [axes.{owners[0]}], or use the "
            "concurrency axis for the concurrency cap"
        )


def _check_conflicts(
    where: str,
    shared: dict[str, Any],
    per_policy: dict[str, dict[str, Any]],
    policies: list[str],
    base: dict[str, Any],
) -> None:
    for policy in policies:
        axes = {**shared, **per_policy.get(policy, {})}
        if SWAP_SPACE_KNOB in axes:
            _check_swap(where, policy, axes, base)
        if any(a in axes for a in SPEC_KNOBS):
            _check_spec(where, policy, axes, base)
        if "rate_scale" in axes:
            for other in ("time_scale", "rate"):
                if other in axes:
                    raise ConfigError(f"{where}: give rate_scale or {other} as an axis, not both")
            for v in axes["rate_scale"]:
                if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                    raise ConfigError(f"{where}: rate_scale values must be > 0, got {v!r}")
                finite_float(v, "[axes] rate_scale", where, lo=1e-6, hi=1e6)
        if SCHED_OVERLAP_AXIS in axes:
            _check_overlap(where, policy, axes)
        if "concurrency" in axes:
            knob = _knob(where, policy)
            if knob in axes:
                raise ConfigError(
                    f"{where}: the concurrency axis sets {knob} of {policy}; do not give "
                    f"{knob} as an axis too"
                )


def _check_overlap(where: str, policy: str, axes: dict[str, Any]) -> None:
    values = axes[SCHED_OVERLAP_AXIS]
    if any(not isinstance(v, bool) for v in values):
        raise ConfigError(f"{where}: sched_overlap values must be true or false, got {values!r}")
    if policy not in OVERLAP_KEYS and not any(values):
        return  # a synchronous engine: false is what it does
    try:
        knob = overlap_knob(policy)
    except ScenarioError as exc:
        raise ConfigError(f"{where}: sched_overlap axis: {exc}") from None
    if knob in axes:
        raise ConfigError(
            f"{where}: the sched_overlap axis sets {knob} of {policy}; do not give {knob} "
            "as an axis too"
        )


def _check_swap(where: str, policy: str, axes: dict[str, Any], base: dict[str, Any]) -> None:
    """A swap-space axis: sizes >= 0, on vllm, and some point that swaps."""
    try:
        swap_knob(policy)
    except ScenarioError as exc:
        raise ConfigError(f"{where}: swap_space_gb axis: {exc}") from None
    for v in axes[SWAP_SPACE_KNOB]:  # GiB of host memory per GPU
        finite_float(v, "[axes] swap_space_gb", where, lo=0.0, hi=1e6)
    modes = axes.get("preemption_mode", [base.get("preemption_mode", "recompute")])
    if "swap" not in modes:
        raise ConfigError(
            f"{where}: the swap_space_gb axis does nothing with preemption_mode = "
            f"{modes[0]!r} (every point would replay the same); set preemption_mode = "
            '"swap" in [base]'
        )


def _check_spec(where: str, policy: str, axes: dict[str, Any], base: dict[str, Any]) -> None:
    """The speculation axes: vllm, a [base.speculative] table to complete, values in range."""
    for axis in (a for a in SPEC_KNOBS if a in axes):
        try:
            spec_knob(policy, axis)
        except ScenarioError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    table = base.get("speculative")
    if not isinstance(table, dict) or "method" not in table:
        name = next(a for a in SPEC_KNOBS if a in axes)
        raise ConfigError(
            f"{where}: the {name} axis sets a key of the scenario's [speculative] table; give "
            'the rest in [base.speculative], at least method = "ngram", "eagle" or '
            '"draft_model"'
        )
    for v in axes.get("spec_num_tokens", []):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
            raise ConfigError(
                f"{where}: spec_num_tokens values must be whole numbers 1 to {MAX_TOKENS} "
                f"(draft tokens per step), got {v!r}"
            )
    for v in axes.get("spec_acceptance", []):
        finite_float(v, "[axes] spec_acceptance", where, lo=0.0, hi=1.0)
    if (
        "spec_num_tokens" in axes
        and "spec_acceptance" not in axes
        and isinstance(table.get("acceptance"), list)
    ):
        raise ConfigError(
            f"{where}: the spec_num_tokens axis changes k, but [base.speculative] acceptance is "
            "a list of one rate per position; give one rate, or a spec_acceptance axis"
        )


def _knob(where: str, policy: str) -> str:
    try:
        return concurrency_knob(policy)
    except ScenarioError as exc:
        raise ConfigError(f"{where}: concurrency axis: {exc}") from None


def _policy_of(coords: dict[str, Any], default: str) -> str:
    return str(coords.get("policy", default))


def _count(own: dict[str, list[Any]] | None) -> int:
    n = 1
    for values in (own or {}).values():
        n *= len(values)
    return n


def _values(
    defaults: dict[str, Any], base: dict[str, Any], point: dict[str, Any], policy: str, name: str
) -> dict[str, Any]:
    values = {**defaults, **base, "name": name, "policy": policy}
    for key, value in point.items():
        if key == "concurrency":
            values[concurrency_knob(policy)] = value
        elif key == SCHED_OVERLAP_AXIS:
            if policy in OVERLAP_KEYS:  # (a synchronous engine takes false: checked)
                values[overlap_knob(policy)] = value
        elif key in SPEC_KNOBS:  # (vllm only, a [base.speculative] table: checked)
            values["speculative"] = {**values["speculative"], spec_knob(policy, key): value}
        elif key != "rate_scale":
            values[key] = value
    if "rate_scale" in point:
        scale = float(point["rate_scale"])
        if values.get("rate") is not None:
            values["rate"] = float(values["rate"]) * scale
        else:
            values["time_scale"] = float(values.get("time_scale") or 1.0) / scale
    return values


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _part(key: str, value: Any) -> str:
    if key in ("policy", "profile"):
        return Path(str(value)).stem if key == "profile" else str(value)
    if isinstance(value, bool):
        return f"{key}-{'on' if value else 'off'}"
    if key in _SHORT:
        return f"{_SHORT[key]}{_fmt(value)}"
    return f"{key}-{_fmt(value)}"


def _name(prefix: str | None, point: dict[str, Any], varying: set[str], policy: str) -> str:
    parts = [_part(k, v) for k, v in point.items() if k in varying]
    if prefix:
        parts.insert(0, prefix)
    name = "-".join(parts) or policy
    name = _BAD_NAME_CHARS.sub("_", name)
    return name if name[0].isalnum() else f"s{name}"


def _unique(name: str, names: set[str]) -> str:
    candidate, k = name, 2
    while candidate in names:
        candidate, k = f"{name}-{k}", k + 1
    names.add(candidate)
    return candidate
