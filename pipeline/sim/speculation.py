"""Speculative decoding: the scenario table, the acceptance draws and the draft's cost.

A drafter (n-grams of the context, EAGLE heads, or a small draft model) proposes
``num_tokens`` = k tokens after every step that samples a token of a request; the
next step verifies them with the target model: the request computes 1 + k query
tokens over its context, the target accepts a prefix of the drafts and samples
one more token (the bonus token), so a step emits accepted + 1 tokens for each
decode, capped by the output left. The scheduler rules are vLLM's (``policies/
vllm.py``, ``speculative_step``); no other policy takes the key (``refuse``).

Acceptance. ``acceptance`` is one rate for every position or a list of k rates:
entry j is the probability that draft j is accepted given that drafts 0..j-1
were. Whether draft j of the verify step that request i makes after it generated
g tokens is accepted is a counter-based draw, a pure function of
(seed, i, g, j): ``uniform(seed, i, g, j) < acceptance[j]`` with the splitmix64
finaliser (``_mix``) applied twice to the counter, so the fast loop, the
reference loop and the conformance harness (which feeds vLLM's scheduler the
same counts) agree exactly, and a replay is reproducible. i is the request's
index in the replay (arrival order), g its generated tokens before the step (a
preempted request that resumes draws again what it drew before: the same
context), and the accepted count is the number of leading drafts accepted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pipeline import validation
from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import step_time
from pipeline.sim.state import (
    C_SPEC_K,
    C_SPEC_LOOK,
    C_SPEC_MAXLEN,
    C_SPEC_SLOTS,
    C_SPEC_THR,
    CF_SPEC_DRAFT,
    CF_SPEC_RATE,
)

KEY = "speculative"  # the scenario key: a TOML table of the keys below
MAX_TOKENS = 16  # most draft tokens per step (vLLM configurations use 1 to about 8)
METHODS = ("ngram", "eagle", "draft_model")
# The draft's cost per draft token, as a share of a plain decode step of the same
# requests (docs/replay.md, section Speculative decoding): n-gram lookup runs on the
# CPU beside the step; an EAGLE head is one decoder layer plus the LM head (Li et al.,
# "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", ICML 2024),
# about 1/32 of an 8B model's layers, rounded up to 0.05 for the LM head and launches;
# a draft model one tenth of the target's decode step (a ~1B draft of an 8-13B target:
# decode is weight-read bound, so its cost follows the weights).
DRAFT_COST = {"ngram": 0.0, "eagle": 0.05, "draft_model": 0.1}
KEYS: dict[str, str] = {
    "method": "ngram | eagle | draft_model",
    "num_tokens": f"draft tokens per step, 1 to {MAX_TOKENS}",
    "acceptance": "a rate in [0, 1], or a list of num_tokens rates (position j given j - 1)",
    "draft_cost": "draft cost per draft token as a share of a decode step; default by method",
}

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STRIDE = 0xD1B54A32D192ED03  # odd: distinct (generated, position) counters stay distinct


@dataclass(frozen=True)
class Speculation:
    """The resolved ``speculative`` table."""

    method: str
    num_tokens: int
    acceptance: tuple[float, ...]  # one rate per draft position
    draft_cost: float

    @property
    def lookahead(self) -> int:
        """KV slots past the scheduled tokens (vLLM ``VllmConfig.num_lookahead_tokens``:
        the drafter writes KV for its drafts; n-grams write none)."""
        return self.num_tokens if self.method in ("eagle", "draft_model") else 0

    @property
    def draft_slots(self) -> int:
        """Budget slots each scheduled request takes for drafting
        (``SpeculativeConfig.max_num_new_slots_for_drafting``: 1 for a draft model)."""
        return 1 if self.method == "draft_model" else 0

    @property
    def mean_accepted(self) -> float:
        """Expected accepted drafts per verify step of k drafts."""
        total, p = 0.0, 1.0
        for a in self.acceptance:
            p *= a
            total += p
        return total

    def blocks_alone(
        self,
        block_size: int,
        max_model_len: int,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """Blocks a request needs alone: its last decode's drafts and lookahead slots too."""
        top = prompt + output - 1 + self.num_tokens + self.lookahead
        return -(-np.minimum(top, max_model_len) // block_size)  # type: ignore[no-any-return]

    def check(self, max_num_batched_tokens: int, where: str) -> None:
        """A lone decode with its drafts (and drafting slots) must fit one step's budget."""
        least = 1 + self.num_tokens + self.draft_slots
        if max_num_batched_tokens < least:
            raise ScenarioError(
                f"{where}: max_num_batched_tokens ({max_num_batched_tokens}) must be >= {least} "
                f"with {KEY}.num_tokens = {self.num_tokens} (a decode and its drafts"
                + (", and the draft model's slot" if self.draft_slots else "")
                + "); raise it or lower num_tokens"
            )

    def pack(
        self, cfg: npt.NDArray[np.int64], cfgf: npt.NDArray[np.float64], max_model_len: int
    ) -> None:
        cfg[C_SPEC_K] = self.num_tokens
        cfg[C_SPEC_LOOK] = self.lookahead
        cfg[C_SPEC_SLOTS] = self.draft_slots
        cfg[C_SPEC_MAXLEN] = max_model_len
        cfgf[CF_SPEC_DRAFT] = self.draft_cost
        for j, a in enumerate(self.acceptance):
            cfgf[CF_SPEC_RATE + j] = a
        for j, thr in enumerate(thresholds(self.acceptance)):
            cfg[C_SPEC_THR + j] = thr

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["acceptance"] = list(self.acceptance)
        return d


def check_table(value: Any, where: str) -> Speculation:
    """The ``speculative`` table resolved, every key checked.

    Raises:
        ScenarioError: one line naming the key, what it takes and how to fix it.
    """
    if not isinstance(value, dict):
        raise ScenarioError(
            f"{where}: {KEY} must be a table of {', '.join(KEYS)}, got "
            f"{validation.type_name(value)}"
        )
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ScenarioError(f"{where}: unknown key {KEY}.{unknown[0]}; allowed: {', '.join(KEYS)}")
    for key in ("method", "num_tokens", "acceptance"):
        if key not in value:
            raise ScenarioError(f"{where}: {KEY}.{key} is missing ({KEYS[key]})")
    method = validation.string(value["method"], f"{KEY}.method", where, error=ScenarioError)
    if method not in METHODS:
        raise ScenarioError(
            f"{where}: {KEY}.method must be one of {', '.join(METHODS)}, got {method!r}"
        )
    k = validation.integer(
        value["num_tokens"],
        f"{KEY}.num_tokens",
        where,
        lo=1,
        hi=MAX_TOKENS,
        integral_floats=True,
        error=ScenarioError,
    )
    raw = value["acceptance"]
    if isinstance(raw, str) and raw == "measured":
        raise ScenarioError(
            f'{where}: {KEY}.acceptance = "measured" needs a log that records spec-decode '
            "acceptance, and no ingested format does; give the rate (measure it as vLLM's "
            "vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_draft_tokens_total)"
        )
    rates: list[Any] = list(raw) if isinstance(raw, list | tuple) else [raw] * k
    if len(rates) != k:
        raise ScenarioError(
            f"{where}: {KEY}.acceptance has {len(rates)} rates but num_tokens is {k}; give one "
            "rate, or one per draft position"
        )
    acc = tuple(
        validation.finite_float(
            a,
            f"{KEY}.acceptance[{j}]" if len(rates) > 1 else f"{KEY}.acceptance",
            where,
            lo=0.0,
            hi=1.0,
            error=ScenarioError,
        )
        for j, a in enumerate(rates)
    )
    cost = DRAFT_COST[method]
    if value.get("draft_cost") is not None:
        cost = validation.finite_float(
            value["draft_cost"], f"{KEY}.draft_cost", where, lo=0.0, hi=10.0, error=ScenarioError
        )
    return Speculation(method=method, num_tokens=k, acceptance=acc, draft_cost=cost)


def refuse(policy: str, where: str) -> None:
    """Speculative decoding is modelled on vLLM's scheduler only."""
    if policy != "vllm":
        raise ScenarioError(
            f"{where}: {KEY} is modelled for policy vllm only (its scheduler's spec-decode "
            f'path); {policy} has none here yet: drop the [{KEY}] table or use policy = "vllm"'
        )


# --- the draws: one source for the compiled loop, one for Python (same numbers) ---


def thresholds(rates: tuple[float, ...]) -> list[int]:
    """Each rate as the integer the compiled draws compare with: a draw's uniform is
    u = m / 2**53 for its top 53 bits m, and u < rate exactly when m < ceil(rate * 2**53)
    (the scaling by a power of two is exact), so the integer compare draws the same."""
    return [math.ceil(a * 2.0**53) for a in rates]


@njit(cache=True, error_model="numpy", inline="always")
def _mix(x: np.uint64) -> np.uint64:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, error_model="numpy", inline="always")  # one call site, once per verify
def accepted(cfg: npt.NDArray[np.int64], seed: int, i: int, g: int, s: int) -> int:
    """Leading drafts accepted of the s verified by request i after g tokens (the draws,
    compared as integers with ``thresholds``: see there)."""
    h = _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(i))  # GOLDEN
    base = h + np.uint64(g) * np.uint64(0xD1B54A32D192ED03)  # STRIDE
    a = 0
    while a < s:
        m = _mix(base + np.uint64(a + 1)) >> np.uint64(11)
        if not np.int64(m) < cfg[C_SPEC_THR + a]:
            break
        a += 1
    return a


def _mix_py(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def accepted_py(rates: tuple[float, ...], seed: int, i: int, g: int, s: int) -> int:
    """``accepted`` in plain Python (the reference loop and the conformance harness)."""
    h = _mix_py((seed * GOLDEN + i) & MASK64)
    a = 0
    while a < s:
        x = _mix_py((h + g * STRIDE + a + 1) & MASK64)
        if not (x >> 11) * (1.0 / 9007199254740992.0) < rates[a]:
            break
        a += 1
    return a


@njit(cache=True, error_model="numpy", inline="always")  # one call site, once per step
def draft_s(cost: npt.NDArray[np.float64], frac: float, k: int, m: int, ctx: float) -> float:
    """The draft's time in a step: k draft passes, each ``frac`` of a plain decode step of
    the m verifying requests at total context ctx (0 for n-grams)."""
    if frac <= 0.0 or m == 0:
        return 0.0
    return frac * k * step_time(cost, 0.0, 0.0, float(m), float(m), ctx)  # type: ignore[no-any-return]
