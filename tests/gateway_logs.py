"""Gateway (LiteLLM-style) request logs for the reliability tests: ids, days, latencies."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def gateway_lines(
    ids: range, *, day: int = 0, spacing_s: float = 0.5, seed: int = 0, prefix: str = "req"
) -> str:
    """One request per id, ``spacing_s`` apart from midnight of ``T0 + day``; lengths and
    observed latencies are a function of the id (and ``seed``), so a log is reproducible."""
    lines = []
    base = T0 + timedelta(days=day)
    for k, i in enumerate(ids):
        start = base + timedelta(seconds=k * spacing_s)
        out = 1 + (i * 7 + seed) % 200
        ttft = 0.05 + ((i * 31 + seed) % 100) / 400
        lines.append(
            json.dumps(
                {
                    "request_id": f"{prefix}-{i}",
                    "startTime": _iso(start),
                    "completionStartTime": _iso(start + timedelta(seconds=ttft)),
                    "endTime": _iso(start + timedelta(seconds=ttft + out * 0.02)),
                    "prompt_tokens": 10 + (i * 13 + seed) % 900,
                    "completion_tokens": out,
                    "model": "m",
                    "status": "success",
                }
            )
        )
    return "\n".join(lines) + "\n"
