"""Replica pools: a fleet's replicas grouped by the traffic each group takes.

A scenario with ``[[pool]]`` tables is a fleet. Every request goes to the first
pool whose match takes it (the pools in file order), else to the default pool,
the one with no match keys (at most one; without it, the last pool takes the
rest). A pool's match keys, all optional and ANDed:

    tenants = ["chat"]                # tenant in the list
    models = ["llama-3-8b"]           # model in the list
    priorities = [0, 1]               # the trace's priority in the list
    min_prompt_tokens = 0             # prompt_tokens >= this
    max_prompt_tokens = 4095          # prompt_tokens <= this
    where = "prompt_tokens < 4096"    # a --where predicate (``pipeline.predicate``)

Every other key of a pool is a scenario key that overrides the fleet's own for
that pool's replicas: its policy, profile (so its GPU), replicas, router, caps,
caching, disaggregation and autoscaling. What a pool may not set is what the
fleet shares: the arrival process (``FLEET_KEYS``, applied to the whole trace
before it is split, so the pools see the trace's own timing) and the front end
(the client sees the fleet's gateway).

The pools run independently: each has its own router and replicas, and a
request's pool is decided by its own columns, so a fleet's replay is its pools'
replays side by side on one clock, and a capacity search can search each pool
on its own (``plan.fleet``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline import sandbox
from pipeline.errors import PipelineError, ScenarioError
from pipeline.predicate import check_predicate, statement
from pipeline.validation import MAX_COUNT

if TYPE_CHECKING:
    from pipeline.sim.scenario import Scenario

MAX_POOLS = 64
MATCH_KEYS: dict[str, str] = {
    "tenants": "tenants the pool takes (a list of strings)",
    "models": "models the pool takes (a list of strings)",
    "priorities": "trace priorities the pool takes (a list of integers)",
    "min_prompt_tokens": "least prompt_tokens the pool takes",
    "max_prompt_tokens": "most prompt_tokens the pool takes",
    "where": "a --where predicate over the requests columns",
}
# keys of the whole fleet, not of a pool: the arrival process and the front end
FLEET_KEYS = (
    "arrivals",
    "time_scale",
    "rate",
    "burstiness",
    "num_requests",
    "seed",
    "frontend_request_s",
    "frontend_prompt_token_s",
    "frontend_output_token_s",
)
_MAX_LIST = 10_000


@dataclass(frozen=True)
class PoolMatch:
    """Which requests a pool takes (every field optional; all must hold)."""

    tenants: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    priorities: tuple[int, ...] = ()
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    where: str | None = None

    @property
    def is_default(self) -> bool:
        return self == PoolMatch()

    def describe(self) -> str:
        parts = []
        if self.tenants:
            parts.append(f"tenant in ({', '.join(self.tenants)})")
        if self.models:
            parts.append(f"model in ({', '.join(self.models)})")
        if self.priorities:
            parts.append(f"priority in ({', '.join(map(str, self.priorities))})")
        if self.min_prompt_tokens is not None:
            parts.append(f"prompt_tokens >= {self.min_prompt_tokens}")
        if self.max_prompt_tokens is not None:
            parts.append(f"prompt_tokens <= {self.max_prompt_tokens}")
        if self.where:
            parts.append(f"({self.where})")
        return " and ".join(parts) or "the rest"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in MATCH_KEYS:
            v = getattr(self, key)
            if v not in ((), None):
                out[key] = list(v) if isinstance(v, tuple) else v
        return out

    def mask(self, frame: pl.DataFrame) -> npt.NDArray[np.bool_]:
        """Which rows of a requests frame this match takes.

        Raises:
            ScenarioError: the predicate fails as it runs (a bad cast, a type mismatch).
        """
        keep = np.ones(frame.height, dtype=np.bool_)
        for key, col in (("tenants", "tenant"), ("models", "model")):
            values = getattr(self, key)
            if values:
                keep &= frame[col].is_in(list(values)).fill_null(False).to_numpy()
        if self.priorities:
            if "priority" in frame.columns:
                prio = frame["priority"].fill_null(0).to_numpy()
            else:  # a trace without priorities: every request has priority 0
                prio = np.zeros(frame.height, dtype=np.int64)
            keep &= np.isin(prio, np.asarray(self.priorities, dtype=np.int64))
        prompt = frame["prompt_tokens"].fill_null(0).to_numpy()
        if self.min_prompt_tokens is not None:
            keep &= prompt >= self.min_prompt_tokens
        if self.max_prompt_tokens is not None:
            keep &= prompt <= self.max_prompt_tokens
        if self.where:
            keep &= _where_mask(frame, self.where)
        return keep


@dataclass(frozen=True)
class Pool:
    """One pool of a fleet: its name, the traffic it takes and its replicas' scenario."""

    name: str
    match: PoolMatch
    scenario: Scenario  # its replicas' settings, resolved (name: "<fleet>.<pool>")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "match": self.match.to_dict(), "config": self.scenario.to_dict()}


def _where_mask(frame: pl.DataFrame, where: str) -> npt.NDArray[np.bool_]:
    """The rows a checked predicate keeps, run on a connection that opens no file."""
    cols = [c for c in frame.columns if not c.startswith("_")]
    table = frame.select(cols).with_row_index("_row").to_arrow()
    con = sandbox.connect(datasets={"_pool_rows": table})
    try:
        rows = con.sql(f"SELECT _row FROM ({statement(where, 'SELECT * FROM _pool_rows')})")
        idx = rows.fetchnumpy()["_row"]
    except Exception as exc:  # a duckdb error as the predicate runs
        first = str(exc).strip().splitlines()[0]
        raise ScenarioError(f"pool predicate {where!r}: {first}") from None
    finally:
        con.close()
    keep = np.zeros(frame.height, dtype=np.bool_)
    keep[np.asarray(idx, dtype=np.int64)] = True
    return keep


def parse_match(raw: Mapping[str, Any], where: str) -> PoolMatch:
    """The match keys of one pool table, checked.

    Raises:
        ScenarioError: a key of the wrong type, an empty or over-long list, a bad
            predicate or an empty prompt range.
    """

    def strings(key: str) -> tuple[str, ...]:
        v = raw.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
            raise ScenarioError(
                f'{where}: {key} must be a non-empty list of names, e.g. {key} = ["chat"]'
            )
        if len(v) > _MAX_LIST:
            raise ScenarioError(f"{where}: {key} lists {len(v):,} names, more than {_MAX_LIST:,}")
        return tuple(v)

    def count(key: str) -> int | None:
        v = raw.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
            raise ScenarioError(
                f"{where}: {key} must be a whole number of tokens in [0, {MAX_COUNT:,}], got {v!r}"
            )
        return v

    prios = raw.get("priorities")
    priorities: tuple[int, ...] = ()
    if prios is not None:
        if isinstance(prios, int) and not isinstance(prios, bool):
            prios = [prios]
        if (
            not isinstance(prios, list)
            or not prios
            or len(prios) > _MAX_LIST
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in prios)
            or not all(abs(x) < 2**63 for x in prios)
        ):
            raise ScenarioError(
                f"{where}: priorities must be a non-empty list of integers, e.g. priorities = [0]"
            )
        priorities = tuple(prios)
    text = raw.get("where")
    pred = None
    if text is not None:
        try:
            pred = check_predicate(text, f"{where}: where")
        except PipelineError as exc:
            raise ScenarioError(str(exc)) from None
    lo, hi = count("min_prompt_tokens"), count("max_prompt_tokens")
    if lo is not None and hi is not None and lo > hi:
        raise ScenarioError(
            f"{where}: min_prompt_tokens ({lo}) is above max_prompt_tokens ({hi}): "
            "no request could match"
        )
    return PoolMatch(
        tenants=strings("tenants"),
        models=strings("models"),
        priorities=priorities,
        min_prompt_tokens=lo,
        max_prompt_tokens=hi,
        where=pred,
    )


def check_pool_tables(raw: Any, where: str) -> list[dict[str, Any]]:
    """The ``pool`` value of a scenario as a list of tables, each with a unique name.

    Raises:
        ScenarioError: not a list of tables, too many, a missing or repeated name, a
            fleet key inside a pool, or more than one default pool.
    """
    if not isinstance(raw, list) or not raw or not all(isinstance(p, dict) for p in raw):
        raise ScenarioError(
            f"{where}: pool must be one or more [[pool]] tables, each with a name and its keys"
        )
    if len(raw) > MAX_POOLS:
        raise ScenarioError(f"{where}: {len(raw)} pools, more than {MAX_POOLS}")
    seen: set[str] = set()
    defaults = 0
    for i, table in enumerate(raw, 1):
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f'{where}: pool {i} needs a name, e.g. name = "chat"')
        if name in seen:
            raise ScenarioError(f"{where}: two pools are named {name!r}; give each its own name")
        seen.add(name)
        for key in FLEET_KEYS:
            if key in table:
                raise ScenarioError(
                    f"{where}: pool {name!r} sets {key}, which the whole fleet shares; "
                    "set it at the top level of the scenario"
                )
        if "pool" in table:
            raise ScenarioError(f"{where}: pool {name!r} holds pools of its own; pools do not nest")
        if not any(k in table for k in MATCH_KEYS):
            defaults += 1
    if defaults > 1:
        raise ScenarioError(
            f"{where}: {defaults} pools have no match keys; only one may take the rest "
            f"(give the others one of: {', '.join(MATCH_KEYS)})"
        )
    return raw


def assign(frame: pl.DataFrame, pools: Sequence[Pool]) -> npt.NDArray[np.int64]:
    """Each row's pool: the first whose match takes it, else the default pool (the
    one with no match keys, else the last)."""
    out = np.full(frame.height, -1, dtype=np.int64)
    default = next((k for k, p in enumerate(pools) if p.match.is_default), len(pools) - 1)
    for k, p in enumerate(pools):
        if p.match.is_default:
            continue
        free = out < 0
        if not free.any():
            break
        out[free & p.match.mask(frame)] = k
    out[out < 0] = default
    return out


def replicas_of(pools: Sequence[Pool]) -> int:
    """The GPUs-worth of replicas a fleet holds (each pool's, disaggregated workers and
    autoscaled peaks included)."""
    return sum(pool_replicas(p.scenario) for p in pools)


def pool_replicas(sc: Scenario) -> int:
    """Replicas of one pool's scenario (prefill + decode workers when disaggregated;
    the largest count when autoscaled)."""
    disagg = getattr(sc, "disagg", None)
    if disagg is not None:
        return int(disagg.prefill_replicas + disagg.decode_replicas)
    auto = getattr(sc, "autoscale", None)
    if auto is not None:
        return int(auto.max_replicas)
    return int(sc.replicas)
