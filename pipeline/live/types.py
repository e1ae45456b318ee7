"""What every live engine takes and gives back: the contract between engines and the stage.

An engine receives a ``LiveBatch`` (the requests to send, with their arrival times already
scaled, in seconds from the start of the replay) and returns a ``LiveResult``: one entry per
request, in the batch's order, whatever happened to it. A request that failed (timeout, HTTP
error, engine error) is kept with ``error`` set; nothing is ever dropped.

All times are seconds from the replay's start (the engine's clock at t=0 is the moment the
first arrival could have been sent), measured with ``time.perf_counter``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class LiveBatch:
    """Requests to replay, sorted by arrival."""

    request_id: list[str]
    arrival_s: npt.NDArray[np.float64]  # when to send it (already time-scaled)
    prompt_tokens: npt.NDArray[np.int64]  # prompt length to send
    output_tokens: npt.NDArray[np.int64]  # tokens to generate (EOS ignored)
    # Optional, the trace's prefix sharing: per request, the chained hashes of its first full
    # prompt blocks of block_size[i] tokens (empty: none). Engines that make up prompt
    # tokens give equal hashes equal tokens, so a prefix cache hits where the trace's did.
    prefix_hashes: list[list[int]] | None = None
    block_size: npt.NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        n = len(self.request_id)
        for name in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_hashes", "block_size"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"LiveBatch.{name} has {len(value)} rows, not {n}")
        if (self.prefix_hashes is None) != (self.block_size is None):
            raise ValueError("LiveBatch.prefix_hashes and block_size go together")

    def __len__(self) -> int:
        return len(self.request_id)


@dataclass
class LiveResult:
    """Per request, in the batch's order. NaN where a time is unknown (failure, not measured)."""

    sent_s: npt.NDArray[np.float64]  # when the request actually left the client / was added
    first_scheduled_s: npt.NDArray[np.float64]  # engine-side, when known (in-process); else NaN
    first_token_s: npt.NDArray[np.float64]
    finished_s: npt.NDArray[np.float64]
    output_tokens_received: npt.NDArray[np.int64]
    itl_mean_s: npt.NDArray[np.float64]  # mean gap between tokens after the first; NaN if < 2
    itl_max_s: npt.NDArray[np.float64]
    error: list[str | None]  # None: completed; else a one-line reason
    # Scraped server metrics, one row per scrape: time_s, then one column per metric.
    metrics: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)
    # What the engine was: name, versions, device, dtype, settings (num_blocks, ...).
    engine_info: dict[str, str] = field(default_factory=dict)

    @classmethod
    def empty(cls, n: int) -> LiveResult:
        nan = np.full(n, np.nan)
        return cls(
            sent_s=nan.copy(),
            first_scheduled_s=nan.copy(),
            first_token_s=nan.copy(),
            finished_s=nan.copy(),
            output_tokens_received=np.zeros(n, dtype=np.int64),
            itl_mean_s=nan.copy(),
            itl_max_s=nan.copy(),
            error=[None] * n,
        )


def longest_wait(arrival_s: npt.NDArray[np.float64]) -> tuple[float, int]:
    """(the longest sleep of a replay of these arrivals, the request it waits for).

    The sleeps are the first arrival (from the start at 0) and each gap after it; a NaN
    or infinite arrival is an infinite sleep. (0.0, 0) for no requests.
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    if len(a) == 0:
        return 0.0, 0
    with np.errstate(invalid="ignore", over="ignore"):
        gaps = np.diff(a, prepend=0.0)
    gaps[~np.isfinite(gaps)] = np.inf
    k = int(np.argmax(gaps))
    return float(gaps[k]), k
