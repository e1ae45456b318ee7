"""The per-class tables of the replay, sweep and capacity output (``pipeline.sim.classes``).

A kind (tenant, model) gets a table only when it has more than one class: one class
would repeat the whole traffic's figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.sim.classes import shown_kinds
from pipeline.text import number, render_table, seconds


def slo_cells(entry: Mapping[str, Any]) -> list[str]:
    """Goodput and the SLOs met (``2/3``, naming the missed ones), for a class with SLOs."""
    verdicts = entry.get("slo") or {}
    missed = [k for k, v in verdicts.items() if not v["met"]]
    met = f"{len(verdicts) - len(missed)}/{len(verdicts)}"
    return [
        number(entry.get("goodput")),
        met + (f" (missed {', '.join(missed)})" if missed else ""),
    ]


def class_lines(summary: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """One table per kind with more than one class: each class's requests, completed,
    TTFT, TPOT, E2E and queue percentiles, and goodput and SLOs met where SLOs were given."""
    classes = summary.get("classes") or {}
    lines: list[str] = []
    for kind in shown_kinds(classes):
        by_class = classes[kind]
        with_slo = any("slo" in e for e in by_class.values())
        headers = [kind, "requests", "completed", "TTFT p50", "TTFT p90", "TTFT p99",
                   "TPOT p50", "TPOT p99", "E2E p99", "queue p99"]  # fmt: skip
        if with_slo:
            headers += ["goodput", "SLOs met"]
        rows = []
        for name, e in by_class.items():
            label = name + (f" ({e['num_classes']} classes)" if "num_classes" in e else "")
            row = [
                label,
                f"{e['num_requests']:,}",
                f"{e['completed']:,}",
                *(seconds(e[f"ttft_p{q}_s"]) for q in (50, 90, 99)),
                seconds(e["tpot_p50_s"]),
                seconds(e["tpot_p99_s"]),
                seconds(e["e2e_p99_s"]),
                seconds(e["queue_p99_s"]),
            ]
            if with_slo:
                row += slo_cells(e)
            rows.append(row)
        lines.append(f"{indent}per {kind}:")
        lines += [indent + "  " + line for line in render_table(headers, rows).splitlines()]
    return lines


def sweep_class_lines(runs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """For a sweep: per kind, one row per scenario and class (p99s, goodput, SLOs met)."""
    runs = list(runs)
    kinds: list[str] = []
    for _, s in runs:
        kinds += [k for k in shown_kinds(s.get("classes") or {}) if k not in kinds]
    lines: list[str] = []
    for kind in kinds:
        with_slo = any(
            "slo" in e for _, s in runs for e in (s.get("classes") or {}).get(kind, {}).values()
        )
        headers = ["scenario", kind, "requests", "TTFT p50", "TTFT p99", "TPOT p99", "E2E p99",
                   "queue p99"]  # fmt: skip
        if with_slo:
            headers += ["goodput", "SLOs met"]
        rows = []
        for name, s in runs:
            for cls, e in (s.get("classes") or {}).get(kind, {}).items():
                row = [
                    name,
                    cls,
                    f"{e['num_requests']:,}",
                    seconds(e["ttft_p50_s"]),
                    seconds(e["ttft_p99_s"]),
                    seconds(e["tpot_p99_s"]),
                    seconds(e["e2e_p99_s"]),
                    seconds(e["queue_p99_s"]),
                ]
                if with_slo:
                    row += slo_cells(e) if "slo" in e else ["-", "-"]
                rows.append(row)
        lines += ["", f"per {kind}:", render_table(headers, rows)]
    return lines
