"""The front end: what a client sees on top of what the engine core does.

Logs and benchmark clients time a request from outside the engine core: the HTTP server
takes the request in, tokenises the prompt and hands it to the engine; every generated
token is detokenised and streamed back. The simulator's clock covers the engine core
only (a request reaches the scheduler at its arrival; its first token is ready at the end
of the step that computes its last prompt token). A profile's ``frontend`` adds the rest:

    client TTFT = engine TTFT + request_s + prompt_token_s * prompt_tokens
    client E2E  = engine E2E  + request_s + prompt_token_s * prompt_tokens
                  + output_token_s * (output_tokens - 1)
    client TPOT = engine TPOT + output_token_s

``request_s`` is the fixed part (HTTP intake, request validation, handing the request to
the engine process and the first chunk back to the client), ``prompt_token_s`` the
tokenisation of the prompt, ``output_token_s`` a delay per streamed token that adds up
over the stream (a front end whose per-chunk work, detokenising, SSE framing, a client's
own parsing, falls behind the engine). The front end is taken as latency on top of the
engine's: requests reach the scheduler in the order the log has them, and the front end
never slows the engine. All three are 0 for an in-process engine timed at its core, and
for profiles that predate the front end: then client and engine times are the same.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

NAMES = ("request_s", "prompt_token_s", "output_token_s")
SCENARIO_KEYS = {f"frontend_{n}": n for n in NAMES}  # scenario key -> Frontend field


@dataclass(frozen=True)
class Frontend:
    """Seconds a client sees on top of the engine core (see the module docstring)."""

    request_s: float = 0.0
    prompt_token_s: float = 0.0
    output_token_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"frontend {f.name} must be a finite number >= 0, got {v!r}")
            if v < 0:
                raise ValueError(f"frontend {f.name} must be a finite number >= 0, got {v!r}")

    @property
    def is_zero(self) -> bool:
        return not any(getattr(self, n) for n in NAMES)

    def as_array(self) -> npt.NDArray[np.float64]:
        return np.array([getattr(self, n) for n in NAMES], dtype=np.float64)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Frontend:
        """From a profile's ``frontend`` object (other keys, e.g. ``source``, are ignored);
        missing names are 0.

        Raises:
            ValueError: not an object, or a value that is not a finite number >= 0.
        """
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"frontend must be an object of {', '.join(NAMES)}, got {d!r}")
        return cls(**{n: d.get(n, 0.0) for n in NAMES})


def ttft_offset(
    fe: npt.NDArray[np.float64], prompt_tokens: npt.NDArray[Any]
) -> npt.NDArray[np.float64]:
    """Per request: what the front end adds to TTFT (``fe`` is ``Frontend.as_array()``)."""
    return fe[0] + fe[1] * prompt_tokens.astype(np.float64)


def e2e_offset(
    fe: npt.NDArray[np.float64],
    prompt_tokens: npt.NDArray[Any],
    output_tokens: npt.NDArray[Any],
) -> npt.NDArray[np.float64]:
    """Per request: what the front end adds to E2E."""
    streamed = np.maximum(output_tokens.astype(np.float64) - 1.0, 0.0)
    return ttft_offset(fe, prompt_tokens) + fe[2] * streamed
