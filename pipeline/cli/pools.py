"""The per-pool tables of the replay and sweep output, for a fleet (``pipeline.sim.fleet``).

A fleet's summary holds ``pools``: each pool's match, policy, profile, replicas and
its own summary figures (``fleet.pool_summary``). A scenario without pools prints
no table: its one pool is the whole traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.cli.classes import slo_cells
from pipeline.text import render_table, seconds

HEADERS = ["pool", "takes", "policy", "profile", "replicas", "requests", "completed",
           "TTFT p50", "TTFT p99", "TPOT p99"]  # fmt: skip


def pool_lines(summary: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """One row per pool, in the fleet's order: what it takes, its policy, profile and
    replicas, its requests and completed, TTFT p50/p99 and TPOT p99; with SLOs (--slo),
    its goodput and the SLOs it met."""
    pools = summary.get("pools") or {}
    if not pools:
        return []
    with_slo = any("slo" in e for e in pools.values())
    headers = HEADERS + (["goodput", "SLOs met"] if with_slo else [])
    rows = []
    for name, e in pools.items():
        row = [
            name,
            str(e.get("match", "")),
            str(e.get("policy", "")),
            str(e.get("profile", "")),
            f"{e.get('replicas', 0):,}",
            f"{e.get('num_requests', 0):,}",
            f"{e.get('completed', 0):,}",
            seconds(e.get("ttft_p50_s")),
            seconds(e.get("ttft_p99_s")),
            seconds(e.get("tpot_p99_s")),
        ]
        if with_slo:
            row += slo_cells(e) if "slo" in e else ["-", "-"]
        rows.append(row)
    lines = [f"{indent}per pool:"]
    lines += [indent + "  " + line for line in render_table(headers, rows).splitlines()]
    return lines


def sweep_pool_lines(runs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """For a sweep: one row per fleet scenario and pool (replicas, requests, TTFT p50/p99,
    TPOT p99, and goodput and SLOs met where SLOs were given); none without a fleet."""
    runs = [(name, s) for name, s in runs if s.get("pools")]
    if not runs:
        return []
    with_slo = any("slo" in e for _, s in runs for e in s["pools"].values())
    headers = ["scenario", "pool", "replicas", "requests", "TTFT p50", "TTFT p99", "TPOT p99"]
    if with_slo:
        headers += ["goodput", "SLOs met"]
    rows = []
    for name, s in runs:
        for pool, e in s["pools"].items():
            row = [
                name,
                pool,
                f"{e.get('replicas', 0):,}",
                f"{e.get('num_requests', 0):,}",
                seconds(e.get("ttft_p50_s")),
                seconds(e.get("ttft_p99_s")),
                seconds(e.get("tpot_p99_s")),
            ]
            if with_slo:
                row += slo_cells(e) if "slo" in e else ["-", "-"]
            rows.append(row)
    return ["", "per pool:", render_table(headers, rows)]
