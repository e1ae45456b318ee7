"""What a deployment costs: a price per GPU-hour, per GPU kind.

Prices come from the config file's ``[gpu_prices]`` table (GPU kind as the
profiles name it, dollars per GPU-hour)::

    [gpu_prices]
    h100-80gb = 2.49
    a100-80gb = 1.79

or from ``--gpu-hour-price`` (one price for every GPU, over the table). A
scenario runs ``replicas x tensor_parallel`` GPUs of its profile's kind (read
from the profile name, ``<model>_<gpu>_tp<N>``); a profile whose kind has no
price gets no cost. From the price and a replay's throughput:

- $/hour of the deployment = GPUs x price;
- $ per 1M output tokens = $/hour / (output tokens/s x 3600) x 1e6;
- $ per 1M total tokens: the same with prompt + output tokens/s.

The same arithmetic is in ``sql/cost.sql`` and ``sql/capacity_answers.sql``
(the report), which get the prices as a JSON object (``prices_json``).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from pipeline.config import Config

if TYPE_CHECKING:
    from pipeline.sim.scenario import Scenario
from pipeline.errors import ConfigError

ANY_GPU = "*"  # the key --gpu-hour-price sets: every kind
_PROFILE_RE = re.compile(r"_(?P<gpu>[a-z0-9][a-z0-9-]*)_tp(?P<tp>\d+)$")


def gpu_prices(config: Config, override: float | None = None) -> dict[str, float]:
    """Prices per GPU kind from ``[gpu_prices]``, plus ``--gpu-hour-price`` for any kind.

    Raises:
        ConfigError: a price that is not a positive number (names the file and key).
    """
    out: dict[str, float] = {}
    for kind, value in config.sections.get("gpu_prices", {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(
                f"{config.path}: gpu_prices.{kind} = {value!r}: give dollars per GPU-hour as a "
                "positive number, e.g. 2.49"
            )
        out[str(kind).lower()] = float(value)
    if override is not None:
        out[ANY_GPU] = float(override)
    return out


def gpu_kind(profile: str) -> tuple[str | None, int]:
    """(GPU kind, tensor parallel) from a profile name like llama-3-8b_h100-80gb_tp1."""
    m = _PROFILE_RE.search(profile or "")
    if not m:
        return None, 1
    return m["gpu"], int(m["tp"])


def price_of(prices: dict[str, float], profile: str) -> float | None:
    kind, _ = gpu_kind(profile)
    if kind is not None and kind in prices:
        return prices[kind]
    return prices.get(ANY_GPU)


def deployment_cost(
    prices: dict[str, float], profile: str, replicas: float, summary: dict[str, Any]
) -> dict[str, Any] | None:
    """$/hour and $ per 1M output and total tokens of one replayed scenario (None: no price);
    ``replicas`` may be a mean (an autoscaled pool's)."""
    price = price_of(prices, profile)
    if price is None:
        return None
    kind, tp = gpu_kind(profile)
    gpus = replicas * tp
    per_hour = gpus * price

    def per_million(tokens_per_s: float | None) -> float | None:
        if not tokens_per_s or not math.isfinite(tokens_per_s):
            return None
        return per_hour / (tokens_per_s * 3600.0) * 1e6

    return {
        "gpu": kind,
        "gpus": gpus,
        "usd_per_gpu_hour": price,
        "usd_per_hour": per_hour,
        "usd_per_1m_output_tokens": per_million(summary.get("output_token_throughput")),
        "usd_per_1m_total_tokens": per_million(summary.get("total_token_throughput")),
    }


def scenario_cost(
    prices: dict[str, float], sc: Scenario, summary: dict[str, Any]
) -> dict[str, Any] | None:
    """``deployment_cost`` of a scenario; of a fleet, the sum of its pools' (each at its
    own GPU kind and replicas, ``pools`` per pool), None when a pool has no price."""
    if not sc.pools:
        return deployment_cost(prices, sc.profile, _billed(sc, summary), summary)
    from pipeline.sim.pools import pool_replicas

    per_pool: dict[str, dict[str, Any]] = {}
    for p in sc.pools:
        mine = (summary.get("pools") or {}).get(p.name) or {}
        n = _billed(p.scenario, mine) if mine.get("autoscale") else pool_replicas(p.scenario)
        cost = deployment_cost(prices, p.scenario.profile, n, mine)
        if cost is None:
            return None
        per_pool[p.name] = cost
    kinds = sorted({str(c["gpu"]) for c in per_pool.values()})
    gpus = sum(int(c["gpus"]) for c in per_pool.values())
    per_hour = sum(float(c["usd_per_hour"]) for c in per_pool.values())

    def per_million(tokens_per_s: float | None) -> float | None:
        if not tokens_per_s or not math.isfinite(tokens_per_s):
            return None
        return per_hour / (tokens_per_s * 3600.0) * 1e6

    return {
        "gpu": kinds[0] if len(kinds) == 1 else " + ".join(kinds),
        "gpus": gpus,
        "usd_per_gpu_hour": per_hour / gpus if gpus else None,  # the fleet's mean
        "usd_per_hour": per_hour,
        "usd_per_1m_output_tokens": per_million(summary.get("output_token_throughput")),
        "usd_per_1m_total_tokens": per_million(summary.get("total_token_throughput")),
        "pools": per_pool,
    }


def _billed(sc: Scenario, summary: dict[str, Any]) -> float:
    """Replicas paid for: the scenario's, or an autoscaled one's mean over its replay
    (starting, serving or draining; ``autoscale.autoscale_summary``)."""
    auto = summary.get("autoscale")
    if auto and auto.get("mean_billed") is not None:
        return float(auto["mean_billed"])
    return sc.replicas


def _count(gpus: float) -> str:
    """GPUs as a count, or a mean (an autoscaled pool's) to 3 figures."""
    return f"{int(gpus):,}" if float(gpus).is_integer() else f"{gpus:,.3g} (mean)"


def format_cost(cost: dict[str, Any] | None) -> str | None:
    """'cost: $4.98/hour (2 x h100-80gb at $2.49), $1.23 per 1M output tokens, ...'."""
    if cost is None:
        return None

    def usd(x: float | None) -> str:
        return "\u2014" if x is None else f"${x:,.4g}" if x < 1000 else f"${x:,.0f}"

    pools = cost.get("pools")
    if pools:  # a fleet: each pool's GPUs at its price
        gpus = ", ".join(
            f"{n}: {_count(c['gpus'])} x {c['gpu'] or 'GPU'} at {usd(c['usd_per_gpu_hour'])}"
            for n, c in pools.items()
        )
    else:
        gpus = f"{_count(cost['gpus'])} x {cost['gpu'] or 'GPU'} at {usd(cost['usd_per_gpu_hour'])}"
    return (
        f"cost: {usd(cost['usd_per_hour'])}/hour ({gpus}), "
        f"{usd(cost['usd_per_1m_output_tokens'])} per 1M "
        f"output tokens, {usd(cost['usd_per_1m_total_tokens'])} per 1M total tokens"
    )


def prices_json(prices: dict[str, float]) -> str | None:
    """The prices as the JSON object the SQL queries read (None: no price known)."""
    return json.dumps(prices, sort_keys=True) if prices else None


__all__ = [
    "deployment_cost",
    "format_cost",
    "scenario_cost",
    "gpu_kind",
    "gpu_prices",
    "price_of",
    "prices_json",
]
