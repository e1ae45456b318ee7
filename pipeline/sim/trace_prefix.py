"""What the trace itself says about prefixes: which requests carry prefix hashes, and how
many prompt tokens the logged engine served from its cache (``cached_tokens``).

A replay with prefix caching on can only find hits where the trace has hashes;
gateway and OTel logs have none unless token ids were hashed at ingest, and
then every simulated hit rate is 0 whatever the scenario. The summary says so,
and puts the logged engine's cached share beside the simulated one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl


def trace_prefix_facts(frame: pl.DataFrame, rows: npt.NDArray[np.int64]) -> dict[str, Any]:
    """For the replayed ``rows`` of ``frame``: requests with hashes, and the logged cache use.

    Keys: prefix_hashed_requests, observed_cached_requests (requests whose log gives
    cached_tokens), observed_cached_tokens, observed_cached_share (cached / prompt tokens
    of those requests; None when no request logs it).
    """
    out: dict[str, Any] = {
        "prefix_hashed_requests": 0,
        "observed_cached_requests": 0,
        "observed_cached_tokens": 0,
        "observed_cached_share": None,
    }
    take = pl.Series(rows)
    if "prefix_hashes" in frame.columns:
        lengths = frame["prefix_hashes"].list.len().fill_null(0).gather(take)
        out["prefix_hashed_requests"] = int((lengths > 0).sum())
    if "cached_tokens" in frame.columns:
        cached = frame["cached_tokens"].gather(take)
        logged = cached.is_not_null()
        n = int(logged.sum())
        if n:
            prompt = frame["prompt_tokens"].gather(take).filter(logged).cast(pl.Int64).sum()
            tokens = int(cached.filter(logged).cast(pl.Int64).sum())
            out.update(
                observed_cached_requests=n,
                observed_cached_tokens=tokens,
                observed_cached_share=tokens / prompt if prompt else None,
            )
    return out


def no_hashes_warning(prefix_caching: bool, summary: dict[str, Any]) -> str | None:
    """The warning when caching is on but no replayed request has a prefix hash."""
    if not prefix_caching or summary.get("prefix_hashed_requests", 1):
        return None
    return (
        "warning: prefix caching is on but the trace has no prefix hashes, so no hit can be "
        "simulated (0% whatever the cache); ingest token ids (token_ids format, --tokenizer) "
        "or a log with hash_ids to simulate prefix caching"
    )


def observed_line(summary: dict[str, Any]) -> str | None:
    """'logged engine cache: 16.0% of prompt tokens (cached_tokens of 4,812 requests)'."""
    share = summary.get("observed_cached_share")
    if share is None:
        return None
    simulated = summary.get("prefix_token_hit_rate")
    sim = f"; simulated here {simulated:.1%}" if simulated is not None else ""
    return (
        f"logged engine cache: {share:.1%} of prompt tokens (cached_tokens of "
        f"{summary['observed_cached_requests']:,} requests){sim}"
    )


__all__ = ["no_hashes_warning", "observed_line", "trace_prefix_facts"]
