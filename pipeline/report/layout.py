"""How a run's scenarios are ordered and grouped on the page.

A run holds 1 to 100 scenarios. Charts with one line per scenario stay readable
up to about ten; past that they become small multiples: one panel per value of
the run's policy or of one of its sweep axes (the configuration keys whose value
differs between scenarios, read from the ``scenarios`` table), and, inside a
panel, one colour per combination of the other axes. The same combination has
the same colour in every panel, so a legend entry names one series everywhere.

Names sort naturally: ``vllm-2, vllm-16, vllm-128``, never ``vllm-128, vllm-16``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_LINES = 10  # one colour per scenario up to this many
MAX_SERIES = 20  # colours a panel may use (tableau20)
# configuration keys that name or describe a scenario rather than set it, and those derived
# from others (the profile's cost and frontend tables, the KV blocks from the GPU blocks):
# run_scenarios.sql and slo_capacity.sql leave out the same
_NOT_AXES = {"name", "description", "num_kv_blocks", "cost", "frontend", "cost_uncertainty_source"}
# the knobs a concurrency sweep varies (its lines join scenarios equal but for these)
CONCURRENCY_KNOBS = ("max_num_seqs", "max_batch_size")
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")


def natural_key(text: Any) -> tuple[Any, ...]:
    """A sort key that orders the numbers inside names by value: 1, 2, 10, not 1, 10, 2."""
    parts = _NUMBER.split("" if text is None else str(text))
    return tuple((0, float(p), p) if i % 2 else (1, 0.0, p.lower()) for i, p in enumerate(parts))


def natural_sorted(names: Iterable[Any]) -> list[Any]:
    return sorted(names, key=natural_key)


@dataclass(frozen=True)
class Layout:
    """Per scenario: its panel (small multiple) and its series (colour) label."""

    scenarios: tuple[str, ...] = ()  # naturally sorted
    axes: tuple[str, ...] = ()  # the keys panels and colours split on (faceted runs)
    # per scenario, each key that varies across the run and its value (None: unset)
    varying: dict[str, dict[str, str | None]] = field(default_factory=dict)
    facet_by: str | None = None  # the axis the panels split on; None: one panel
    panel: dict[str, str] = field(default_factory=dict)
    series: dict[str, str] = field(default_factory=dict)

    @property
    def panels(self) -> list[str]:
        return natural_sorted(set(self.panel.values()))

    @property
    def series_names(self) -> list[str]:
        return natural_sorted(set(self.series.values()))

    @property
    def faceted(self) -> bool:
        return self.facet_by is not None

    def label(self, scenario: str, without: Iterable[str] = ()) -> str:
        """The keys that vary across the run at ``scenario``'s values, ``without`` some
        (``max_num_batched_tokens=2048, policy=vllm``); '' when none is left."""
        left_out = set(without)
        values = self.varying.get(scenario, {})
        return ", ".join(_label(k, v) for k, v in values.items() if k not in left_out)


def _flat(config: dict[str, Any]) -> dict[str, str | None]:
    """The top-level keys that set a scenario, each value as its JSON text (a string as it
    is, a float to four significant digits, null as None), as run_scenarios.sql reads them
    from config_json."""
    return {key: _text(value) for key, value in config.items() if key not in _NOT_AXES}


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value)


def sweep_axes(configs: dict[str, dict[str, Any]]) -> list[str]:
    """The configuration keys whose values differ between the scenarios that have them,
    policy first, then by name (a key only some policies have, at one value, follows from
    the policy)."""
    flat = [_flat(cfg) for cfg in configs.values()]
    keys = {k for cfg in flat for k in cfg}
    varying = [k for k in keys if len({cfg[k] for cfg in flat if k in cfg}) > 1]
    return sorted(varying, key=lambda k: (k != "policy", k))


def _label(key: str, value: str | None) -> str:
    """``key=value``, or ``key unset`` for a null (never ``key=None``)."""
    return f"{key}={value}" if value is not None else f"{key} unset"


def build_layout(
    scenarios: Sequence[str], configs: dict[str, dict[str, Any]], policies: dict[str, str]
) -> Layout:
    """Panels and series for a run's scenarios (``configs``: name -> resolved config)."""
    names = natural_sorted(scenarios)
    full = {
        n: {**configs.get(n, {}), "policy": policies.get(n) or configs.get(n, {}).get("policy")}
        for n in names
    }
    axes = sweep_axes(full) if len(names) > 1 else []
    flat = {n: _flat(full[n]) for n in names}
    varying = {n: {k: flat[n][k] for k in axes if k in flat[n]} for n in names}
    if len(names) <= MAX_LINES or not axes:
        return Layout(scenarios=tuple(names), series={n: n for n in names}, varying=varying)

    def distinct(key: str) -> int:
        return len({flat[n].get(key) for n in names})

    # policy when it varies; else the axis with the fewest values (the coarsest split)
    facet = "policy" if "policy" in axes else min(axes, key=lambda k: (distinct(k), k))
    panel = {n: _label(facet, flat[n].get(facet)) for n in names}

    # the other axes are those that vary inside a panel: keys one policy has and another
    # lacks (chunk_size against max_num_batched_tokens) vary only across panels
    def varies_inside(key: str) -> bool:
        return any(
            len({flat[n].get(key) for n in names if panel[n] == p}) > 1 for p in set(panel.values())
        )

    others = [k for k in axes if k != facet and varies_inside(k)]
    series = {n: ", ".join(_label(k, flat[n].get(k)) for k in others) or n for n in names}
    if len(set(series.values())) > MAX_SERIES:
        series = {n: n for n in names}
    return Layout(tuple(names), tuple([facet, *others]), varying, facet, panel, series)


__all__ = ["Layout", "build_layout", "natural_key", "natural_sorted", "sweep_axes"]
