"""Scenarios: what to replay the requests through, validated before anything runs.

A scenario is a flat TOML table (one file, one scenario); command-line flags
and the config file's ``[replay]`` section use the same keys. Precedence:
flag > scenario file > ``[replay]`` in the config file > default::

    name = "vllm-8k"              # names the output files; default: file stem or policy
    policy = "vllm"               # static | orca | vllm | sarathi | sglang | tgi
    profile = "llama-3-8b_h100-80gb_tp1"   # step-cost profile (name or JSON path)
    replicas = 1
    router = "round_robin"        # round_robin | least_outstanding | prefix_aware
    cache_threshold = 0.3         # prefix_aware router (and balance_abs_threshold,
                                  # balance_rel_threshold)
    seed = 0                      # the one random generator of the scenario

    arrivals = "trace"            # trace | poisson | gamma
    time_scale = 1.0              # trace: multiply the trace's inter-arrival times
    rate = 20.0                   # req/s: trace rescaled to it, or the poisson/gamma rate
    burstiness = 1.0              # gamma shape (vLLM's --burstiness); 1 = poisson
    num_requests = 1000           # how many requests (poisson/gamma draw lengths from the trace)

    max_output_tokens = 1024      # cap every request's output length
    max_model_len = 8192          # longest prompt + output; default: the profile's
    drop_too_long = false         # leave out prompts >= max_model_len instead of failing
    block_size = 16               # tokens per KV block; default: the policy's (sglang, tgi: 1)
    num_gpu_blocks = 0            # KV blocks per replica; 0 = from GPU memory
    gpu_memory_utilization = 0.9  # share of GPU memory for weights + KV

    enable_prefix_caching = true  # default: on for vllm, sglang and tgi, as in the engines
    prefix_warmup_requests = 0    # the first N requests fill the caches instead of running
    prefix_partial_blocks = true  # a hashed partial last trace block can hit (prefix.py)

    max_num_seqs = 256            # ... and the policy's own parameters (policies/*.py)
    cost_uncertainty = 0.08       # sd of log step time for intervals; default: the profile's

    [tenant_priority]             # vllm scheduling_policy = "priority": tenant -> priority
    batch = 10                    # (lower first; others keep the trace's priority, else 0)

    frontend_request_s = 0.006    # the front end a client sees on top of the engine
    frontend_prompt_token_s = 1e-6  # (frontend.py); default: the profile's, 0 with [cost];
    frontend_output_token_s = 0.0   # all three 0 replays engine time only

    [autoscale]                   # the replica count follows the load (autoscale.py):
    max_replicas = 8              # min_replicas, max_replicas, target, interval_s,
    target = 16                   # cooldown_s, startup_s (or load_gbps, warmup_s);
                                  # replicas is then the initial count

    [cost]                        # instead of a profile: explicit step-cost coefficients
    fixed_s = 0.004               # (every StepCost field; the v2 and v3 ones default to 0;
                                  #  needs num_gpu_blocks)

A scenario with ``[[pool]]`` tables is a fleet: each pool takes the traffic its
match keys select and runs on replicas of its own, its keys overriding the
fleet's (``pools.py``)::

    [[pool]]
    name = "chat"
    tenants = ["chat"]            # or models, priorities, min/max_prompt_tokens, where
    replicas = 4
    [[pool]]
    name = "batch"                # no match keys: the rest
    profile = "llama-3-8b_a100-80gb_tp1"
    replicas = 2

Every key is checked: an unknown key, a parameter of another policy, a bad
value or an impossible memory configuration raises ScenarioError naming the
key and the allowed values.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline import validation
from pipeline.errors import PipelineError, ScenarioError
from pipeline.sim import autoscale as scaling
from pipeline.sim import cost_uncertainty, sched_cpu
from pipeline.sim import speculation as spec
from pipeline.sim.autoscale import Autoscale
from pipeline.sim.cost_model import OPTIONAL_COEFFICIENTS, StepCost
from pipeline.sim.disagg import DECODE_ROUTERS, DEFAULT_LINK, LINKS, Disagg, policy_error
from pipeline.sim.frontend import SCENARIO_KEYS as FRONTEND_KEYS
from pipeline.sim.frontend import Frontend
from pipeline.sim.kv_tiers import Tiers
from pipeline.sim.kv_tiers import resolve as resolve_tiers
from pipeline.sim.policies import MODULES, POLICIES, Memory
from pipeline.sim.policies.dispatch import hooks_of
from pipeline.sim.pools import MATCH_KEYS, Pool, check_pool_tables, parse_match, replicas_of
from pipeline.sim.routing import ROUTER_PARAMS, ROUTERS
from pipeline.sim.state import (
    C_BAL_ABS,
    C_BLOCK_SIZE,
    C_CACHING,
    C_HOOKS,
    C_NUM_BLOCKS,
    C_POLICY,
    C_QUEUE,
    C_REPLICAS,
    C_ROUTER,
    C_SEED,
    CF_BAL_REL,
    CF_CACHE_THRESHOLD,
    NCFG,
    NCFGF,
    Q_PRIORITY,
    EngineConfig,
)
from pipeline.sim.swap import Swap, refusal
from pipeline.sim.swap import resolve as resolve_swap
from pipeline.validation import MAX_COUNT, MAX_SEED

ARRIVALS = ("trace", "poisson", "gamma")
CACHING_POLICIES = {name for name, p in POLICIES.items() if p.prefix_caching is not None}
CUSTOM_PROFILE = "custom"  # the profile name recorded for an explicit [cost] table
DEFAULT_MAX_MODEL_LEN = 8192  # with an explicit [cost] table and no max_model_len

# key -> (type, default, help). Policy parameters come from policies/*.py.
COMMON: dict[str, tuple[type, Any, str]] = {
    "name": (str, None, "scenario name (output file stem); default: file stem or policy"),
    "policy": (str, "vllm", "scheduler policy: " + " | ".join(POLICIES)),
    "profile": (str, None, "step-cost profile name or JSON path; default: the default profile"),
    "replicas": (int, 1, "number of engine replicas"),
    "router": (str, "round_robin", "replica router: " + " | ".join(ROUTERS)),
    "seed": (int, 0, "seed of the scenario's random generator"),
    "arrivals": (str, "trace", "arrival process: " + " | ".join(ARRIVALS)),
    "time_scale": (float, None, "trace: multiply inter-arrival times (0.5 = twice as fast)"),
    "rate": (float, None, "target request rate (req/s): rescales the trace, or drives poisson"),
    "burstiness": (float, 1.0, "gamma: shape of the inter-arrival distribution (1 = poisson)"),
    "num_requests": (int, None, "requests to replay (poisson/gamma draw lengths from the trace)"),
    "max_output_tokens": (int, None, "cap on every request's output tokens"),
    "max_model_len": (int, None, "longest prompt + output; default: the profile's"),
    "drop_too_long": (bool, False, "leave out requests whose prompt reaches max_model_len"),
    "block_size": (int, None, "tokens per KV block; default: the policy's (16; sglang, tgi: 1)"),
    "num_gpu_blocks": (int, 0, "KV blocks per replica; 0 = derive from GPU memory"),
    "gpu_memory_utilization": (float, 0.9, "share of GPU memory for weights and KV cache"),
    "enable_prefix_caching": (
        bool,
        None,
        "prefix caching; default: on for " + ", ".join(sorted(CACHING_POLICIES)),
    ),
    "prefix_warmup_requests": (
        int,
        0,
        "the first N requests are not replayed: their prompts fill every replica's cache first",
    ),
    "prefix_partial_blocks": (
        bool,
        None,
        "the engine blocks inside a prompt's partial last trace block can hit (its hash names "
        "the whole prompt); false: only whole trace blocks. Default true",
    ),
    "tenant_priority": (dict, None, "vllm priority policy: table tenant -> priority"),
    "autoscale": (dict, None, "replica autoscaler: table of " + ", ".join(scaling.KEYS)),
    "speculative": (dict, None, "speculative decoding (vllm): table of " + ", ".join(spec.KEYS)),
    "frontend_request_s": (float, None, "front end per request, s; default: the profile's"),
    "frontend_prompt_token_s": (float, None, "front end per prompt token, s (tokenisation)"),
    "frontend_output_token_s": (float, None, "front end per streamed token, s"),
    # the scheduler's CPU time per step (sched_cpu.py): the profile's unless given
    "sched_cpu_s": (float, None, "scheduler CPU time per step, s; default: the profile's"),
    "sched_cpu_per_seq_s": (
        float,
        None,
        "scheduler CPU time per scheduled sequence, s; default: the profile's",
    ),
    "cost_uncertainty": (
        float,
        None,
        "sd of log step time the intervals assume; default: the profile's (cost_uncertainty.py)",
    ),
    **{k: (float if isinstance(d, float) else int, None, h) for k, (d, h) in ROUTER_PARAMS.items()},
    # disaggregated prefill and decode (disagg.py): all of them need prefill_replicas
    "prefill_replicas": (int, 0, "prefill workers (vllm; with decode_replicas); 0 = aggregated"),
    "decode_replicas": (int, 0, "decode workers, fed over the KV link by the prefill workers"),
    "kv_link": (str, None, "KV link preset: " + " | ".join(LINKS) + f"; default {DEFAULT_LINK}"),
    "kv_link_gbps": (float, None, "KV link bandwidth, Gb/s one way; default: the preset's"),
    "kv_link_latency_s": (float, None, "KV link latency per transfer, s; default: the preset's"),
    "kv_bytes_per_token": (int, None, "KV bytes per token sent; default: the profile's"),
    "decode_router": (str, None, "decode worker router: " + " | ".join(DECODE_ROUTERS)),
    "prefill_num_gpu_blocks": (int, None, "KV blocks per prefill worker; default num_gpu_blocks"),
    "decode_num_gpu_blocks": (int, None, "KV blocks per decode worker; default num_gpu_blocks"),
}
DISAGG_KEYS = tuple(k for k in COMMON if k.startswith(("prefill_", "decode_", "kv_")))

# The documented range of every number (checked after the usual mistakes, zero or a
# negative, get their own words): rates and scales a replay can finish in a sane span,
# counts the int64 state arrays hold with room for their sums.
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "time_scale": (1e-6, 1e6),
    "rate": (1e-6, 1e6),  # req/s
    "burstiness": (1e-3, 1e3),
    "gpu_memory_utilization": (1e-6, 1.0),
    "frontend_request_s": (0.0, 1e3),
    "frontend_prompt_token_s": (0.0, 1e3),
    "frontend_output_token_s": (0.0, 1e3),
    "sched_cpu_s": (0.0, 1e3),
    "sched_cpu_per_seq_s": (0.0, 1e3),
    "cost_uncertainty": (0.0, 10.0),
    "cache_threshold": (0.0, 1.0),
    "balance_rel_threshold": (1.0, 1e6),
    "kv_link_gbps": (1e-3, 1e6),
    "kv_link_latency_s": (0.0, 1e3),
}
INT_RANGES: dict[str, tuple[int, int]] = {
    "replicas": (1, 4096),
    "seed": (0, MAX_SEED),
    "num_requests": (1, MAX_COUNT),
    "max_output_tokens": (1, MAX_COUNT),
    "max_model_len": (2, MAX_COUNT),
    "block_size": (1, 1 << 16),
    "num_gpu_blocks": (0, MAX_COUNT),
    "prefix_warmup_requests": (0, MAX_COUNT),
    "balance_abs_threshold": (0, MAX_COUNT),
    "prefill_replicas": (0, 4096),
    "decode_replicas": (0, 4096),
    "kv_bytes_per_token": (1, 1 << 40),
    "prefill_num_gpu_blocks": (2, MAX_COUNT),
    "decode_num_gpu_blocks": (2, MAX_COUNT),
}
POLICY_FLOAT_RANGE = (-1e6, 1e6)  # the policy's own check() says which sign it takes
COST_SECONDS_MAX = 1e3  # [cost] coefficients in seconds; token counts up to MAX_COUNT

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ArrivalSpec:
    """How arrival times are made (see ``arrivals.py``)."""

    process: str  # trace | poisson | gamma
    time_scale: float  # trace only
    rate: float | None  # req/s; None: the trace's own
    burstiness: float  # gamma shape
    num_requests: int | None  # None: every selected request


@dataclass(frozen=True)
class Scenario:
    """One fully resolved, validated scenario."""

    name: str
    policy: str
    params: Any  # the policy's Params dataclass
    profile: str  # profile name, or "custom" for an explicit [cost] table
    cost: StepCost
    memory: Memory
    gpu_memory_utilization: float
    replicas: int
    router: str
    arrivals: ArrivalSpec
    max_output_tokens: int | None
    drop_too_long: bool
    seed: int
    prefix_caching: bool = False
    prefix_warmup_requests: int = 0  # leading requests that warm the caches instead
    prefix_partial_blocks: bool = True  # a prompt's tail unit (prefix.py); False: whole units
    tenant_priority: dict[str, int] | None = None  # vllm priority policy: tenant -> priority
    router_params: dict[str, float] | None = None  # prefix_aware: ROUTER_PARAMS, resolved
    frontend: Frontend = Frontend()  # what a client sees on top of the engine (frontend.py)
    # the profile term of intervals: sd of log step time and where it came from
    cost_uncertainty: cost_uncertainty.CostUncertainty = cost_uncertainty.DEFAULT
    # a fleet's pools (``pools.py``): each with its match and its replicas' scenario;
    # empty for one pool of identical replicas (this scenario's own settings)
    pools: tuple[Pool, ...] = ()
    # disaggregated prefill and decode (disagg.py; replicas is then their sum); None: aggregated
    disagg: Disagg | None = None
    # swap preemption (swap.py): vllm's host swap space; None: recompute preemption
    swap: Swap | None = None
    # KV offloading tiers (kv_tiers.py): vllm's CPU (and disk) tiers; None: off
    kv_tiers: Tiers | None = None

    @property
    def is_fleet(self) -> bool:
        return bool(self.pools)

    # the replica count follows the load (autoscale.py); replicas is then the initial count
    autoscale: Autoscale | None = None
    # speculative decoding (speculation.py); None: off
    speculative: spec.Speculation | None = None

    @property
    def num_kv_blocks(self) -> int:
        """Usable KV blocks per replica."""
        return POLICIES[self.policy].num_blocks(self.memory, self.params)

    @property
    def by_priority(self) -> bool:
        """Whether requests are ordered by priority (vLLM's priority policy)."""
        return POLICIES[self.policy].queue(self.params) == Q_PRIORITY

    @property
    def sched_overlap(self) -> bool:
        """Whether the engine schedules the next step while the GPU runs this one."""
        return sched_cpu.overlaps(self.policy, self.params)

    def engine(self) -> EngineConfig:
        """The packed configuration the loops read."""
        pol = POLICIES[self.policy]
        cfg = np.zeros(NCFG, dtype=np.int64)
        cfgf = np.zeros(NCFGF, dtype=np.float64)
        cfg[C_POLICY] = pol.code
        cfg[C_REPLICAS] = self.autoscale.max_replicas if self.autoscale else self.replicas
        cfg[C_ROUTER] = ROUTERS[self.router]
        cfg[C_BLOCK_SIZE] = self.memory.block_size
        cfg[C_NUM_BLOCKS] = self.num_kv_blocks
        cfg[C_CACHING] = int(self.prefix_caching)
        cfg[C_QUEUE] = pol.queue(self.params)
        cfg[C_SEED] = self.seed
        rparams = self.router_params or {}
        cfg[C_BAL_ABS] = int(rparams.get("balance_abs_threshold", 0))
        cfgf[CF_BAL_REL] = float(rparams.get("balance_rel_threshold", 0.0))
        cfgf[CF_CACHE_THRESHOLD] = float(rparams.get("cache_threshold", 0.0))
        ints, floats = pol.pack(self.params, self.memory)
        cfg[C_HOOKS] = hooks_of(next(m for m in MODULES if m.POLICY is pol))
        for k, iv in (pol.traits() | ints).items():
            cfg[k] = iv
        for k, fv in floats.items():
            cfgf[k] = fv
        if self.swap is not None:
            self.swap.pack(cfg, cfgf)
        if self.kv_tiers is not None:
            self.kv_tiers.pack(cfg, cfgf)
        if self.speculative is not None:
            self.speculative.pack(cfg, cfgf, self.memory.max_model_len)
        return EngineConfig(
            cfg=cfg,
            cfgf=cfgf,
            cost=self.cost.as_array(self.sched_overlap),
            frontend=self.frontend.as_array(),
            autoscale=self.autoscale.as_array() if self.autoscale else np.zeros(0),
        )

    def to_dict(self) -> dict[str, Any]:
        """Every resolved parameter (the scenarios table's config_json)."""
        return {
            "name": self.name,
            "policy": self.policy,
            **asdict(self.params),
            "profile": self.profile,
            "cost": self.cost.to_dict(),
            "frontend": self.frontend.to_dict(),
            "replicas": self.replicas,
            "router": self.router,
            "seed": self.seed,
            "arrivals": self.arrivals.process,
            "time_scale": self.arrivals.time_scale,
            "rate": self.arrivals.rate,
            "burstiness": self.arrivals.burstiness,
            "num_requests": self.arrivals.num_requests,
            "max_output_tokens": self.max_output_tokens,
            "max_model_len": self.memory.max_model_len,
            "drop_too_long": self.drop_too_long,
            "block_size": self.memory.block_size,
            "num_gpu_blocks": self.memory.num_gpu_blocks,
            "num_kv_blocks": self.num_kv_blocks,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.prefix_caching,
            "prefix_warmup_requests": self.prefix_warmup_requests,
            "prefix_partial_blocks": self.prefix_partial_blocks,
            "tenant_priority": self.tenant_priority,
            **(self.router_params or {}),
            "cost_uncertainty": self.cost_uncertainty.log_sd,
            "cost_uncertainty_source": self.cost_uncertainty.source,
            **({"pools": [p.to_dict() for p in self.pools]} if self.pools else {}),
            **(self.disagg.to_dict() if self.disagg is not None else {}),
            **(self.swap.to_dict() if self.swap is not None else {}),
            **(self.kv_tiers.to_dict() if self.kv_tiers is not None else {}),
            **({"autoscale": self.autoscale.to_dict()} if self.autoscale else {}),
            **({"speculative": self.speculative.to_dict()} if self.speculative else {}),
        }

    def cap_lengths(
        self,
        prompt: npt.NDArray[np.int64],
        output: npt.NDArray[np.int64],
        max_tokens: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Apply every length cap; return (prompt, output, keep) and check memory.

        ``max_tokens`` is the request's own cap (<= 0 where it has none). The
        output is capped at max_tokens, max_output_tokens and, as the engines do,
        ``max_model_len - prompt``; at least one token is generated. A prompt of
        ``max_model_len`` tokens or more cannot be served: such requests are left
        out (``drop_too_long``) or fail the scenario.

        Raises:
            ScenarioError: a prompt too long for max_model_len, or a request that
                can never fit in the KV cache even with the replica to itself.
        """
        mem = self.memory
        # copies of their own (astype copies), capped in place: at millions of requests
        # each temporary array is a fresh allocation and its page faults
        prompt = prompt.astype(np.int64)
        np.maximum(prompt, 1, out=prompt)
        output = output.astype(np.int64)
        np.maximum(output, 1, out=output)
        np.minimum(output, max_tokens, out=output, where=max_tokens > 0)
        if self.max_output_tokens is not None:
            np.minimum(output, self.max_output_tokens, out=output)
        keep = prompt < mem.max_model_len
        every = bool(keep.all())
        if not every and not self.drop_too_long:
            bad = int((~keep).sum())
            raise ScenarioError(
                f"scenario {self.name!r}: {bad} request(s) have a prompt of max_model_len "
                f"({mem.max_model_len}) tokens or more (longest {int(prompt.max())}); raise "
                "max_model_len or set drop_too_long = true"
            )
        room = mem.max_model_len - prompt
        np.minimum(output, room, out=output)
        np.maximum(output, 1, out=output)
        del room
        pol = POLICIES[self.policy]
        kept_p, kept_o = (prompt, output) if every else (prompt[keep], output[keep])
        need = pol.blocks_alone(self.params, mem, kept_p, kept_o)
        if self.speculative is not None:  # its drafts' slots too
            need = self.speculative.blocks_alone(mem.block_size, mem.max_model_len, kept_p, kept_o)
        usable = pol.num_blocks(mem, self.params)
        most = int(need.max()) if len(need) else 0
        if most > usable:
            worst = int(np.argmax(need))
            raise ScenarioError(
                f"scenario {self.name!r}: a request ({int(kept_p[worst])} prompt + "
                f"{int(kept_o[worst])} output tokens) needs {most} KV blocks "
                f"on its own under {self.policy} but a replica has {usable}; raise "
                "num_gpu_blocks (or gpu_memory_utilization), lower max_model_len or "
                "max_output_tokens"
            )
        return prompt, output, keep


def allowed_keys(policy: str) -> list[str]:
    return [*COMMON, "cost", *POLICIES[policy].param_help()]


def _convert(key: str, value: Any, typ: type, where: str) -> Any:
    """One key's value as ``typ``: finite, and within what the simulator can hold
    (``pipeline.validation``); the key's own range is checked by ``_check_ranges``."""
    if value is None:
        return None
    if key == scaling.KEY:
        return scaling.check_table(value, where)
    if key == spec.KEY:
        return spec.check_table(value, where)
    if typ is dict:
        if not isinstance(value, dict):
            raise ScenarioError(f"{where}: {key} must be a table, got {value!r}")
        return {
            str(k): validation.integer(
                v, f"{key}.{k}", where, lo=-MAX_COUNT - 1, hi=MAX_COUNT, error=ScenarioError
            )
            for k, v in value.items()
        }
    if typ is bool:
        return validation.boolean(value, key, where, strings=True, error=ScenarioError)
    if typ is int:
        return validation.integer(
            value,
            key,
            where,
            lo=None,  # the key's own range: _check_ranges
            hi=None,
            strings=True,
            integral_floats=True,
            error=ScenarioError,
        )
    if typ is float:
        return validation.finite_float(value, key, where, strings=True, error=ScenarioError)
    return validation.string(value, key, where, error=ScenarioError)


def _check_ranges(got: dict[str, Any], params: Any, where: str) -> None:
    """Every number within its documented range (FLOAT_RANGES, INT_RANGES; policy
    parameters within POLICY_FLOAT_RANGE and [0 or their ``lo``, MAX_COUNT]), after the checks that
    explain the usual mistakes (zero, negative) in their own words."""
    _check_common_ranges(got, where)
    for f in fields(params):
        v = getattr(params, f.name)
        if not isinstance(v, bool | str):
            _check_param(f.name, v, type(v), where, f.metadata.get("lo", 0))


def _check_common_ranges(got: dict[str, Any], where: str) -> None:
    """The keys of FLOAT_RANGES and INT_RANGES that are given, each within its range."""
    for key, (lo, hi) in FLOAT_RANGES.items():
        if got.get(key) is not None:
            validation.finite_float(got[key], key, where, lo=lo, hi=hi, error=ScenarioError)
    for key, (ilo, ihi) in INT_RANGES.items():
        if got.get(key) is not None:
            validation.integer(got[key], key, where, lo=ilo, hi=ihi, error=ScenarioError)


def _check_param(key: str, value: Any, typ: type, where: str, lo: int = 0) -> None:
    """A policy parameter within what the simulator holds: an integer in [0, MAX_COUNT],
    or from its field's ``lo`` where the engine gives a negative a meaning (SGLang's
    ``chunked_prefill_size = -1``: no chunking)."""
    if typ is int:
        validation.integer(value, key, where, lo=lo, hi=MAX_COUNT, error=ScenarioError)
    elif typ is float:
        flo, fhi = POLICY_FLOAT_RANGE
        validation.finite_float(value, key, where, lo=flo, hi=fhi, error=ScenarioError)


def check_scenario_keys(values: dict[str, Any], where: str) -> None:
    """Each key of a partial scenario (a config's ``[replay]`` defaults) on its own: of
    the right type, finite and in its range. Keys of policy parameters get the checks
    of every policy that has them; unknown keys and the checks across keys wait until a
    scenario is built, when the policy is known.

    Raises:
        ScenarioError: naming ``where``, the key and what is allowed.
    """
    if not isinstance(values, dict):
        raise ScenarioError(f"{where}: must be a table of scenario keys")
    got: dict[str, Any] = {}
    for key, value in values.items():
        if key in COMMON:
            got[key] = _convert(key, value, COMMON[key][0], where)
        elif key == "cost":
            validation.table(value, "cost", where, error=ScenarioError)
        else:
            for pol in POLICIES.values():
                for f in fields(pol.Params):
                    if f.name == key:
                        typ = {"int": int, "float": float, "bool": bool, "str": str}[
                            f.type if isinstance(f.type, str) else f.type.__name__
                        ]
                        value_ = _convert(key, value, typ, where)
                        _check_param(key, value_, typ, where, f.metadata.get("lo", 0))
    _check_common_ranges(got, where)


def _choice(key: str, value: str, allowed: Any, where: str) -> None:
    if value not in allowed:
        raise ScenarioError(
            f"{where}: unknown {key} {value!r}; allowed: {', '.join(sorted(allowed))}"
        )


def build_scenario(values: dict[str, Any], *, where: str = "scenario") -> Scenario:
    """Validate a flat dict of scenario keys and resolve it into a Scenario.

    Args:
        values: keys as in the module docstring (None means "not given").
        where: the file or source named in error messages.

    Raises:
        ScenarioError: naming the key and the allowed values.
    """
    values = {k: v for k, v in values.items() if v is not None}
    if "pool" in values:
        return _build_fleet(values, where)
    policy = _convert("policy", values.get("policy", COMMON["policy"][1]), str, where)
    _choice("policy", policy, POLICIES, where)
    pol = POLICIES[policy]
    param_types = {f.name: f.type for f in fields(pol.Params)}
    for key in values:
        if key in COMMON or key == "cost" or key in param_types:
            continue
        owners = [name for name, p in POLICIES.items() if key in p.param_help()]
        if refusal(policy, key):
            raise ScenarioError(f"{where}: {refusal(policy, key)}")
        hint = f" ({key} is a parameter of {', '.join(owners)})" if owners else ""
        raise ScenarioError(
            f"{where}: unknown key {key!r} for policy {policy}{hint}; allowed: "
            f"{', '.join(sorted(allowed_keys(policy)))}"
        )
    got: dict[str, Any] = {}
    for key, (typ, default, _) in COMMON.items():
        got[key] = _convert(key, values.get(key, default), typ, where)
    type_of = {"int": int, "float": float, "bool": bool, "str": str}
    raw_params = {}
    for f in fields(pol.Params):
        typ = type_of[f.type if isinstance(f.type, str) else f.type.__name__]
        raw_params[f.name] = _convert(f.name, values.get(f.name, f.default), typ, where)
    params = pol.Params(**raw_params)

    name = got["name"] or policy
    if not _NAME_RE.match(name):
        raise ScenarioError(
            f"{where}: name {name!r} must be letters, digits, '.', '_' or '-' (it names files)"
        )
    _choice("router", got["router"], ROUTERS, where)
    _choice("arrivals", got["arrivals"], ARRIVALS, where)
    if got["replicas"] < 1:
        raise ScenarioError(f"{where}: replicas must be >= 1, got {got['replicas']}")
    if got["time_scale"] is not None and got["rate"] is not None:
        raise ScenarioError(f"{where}: give time_scale or rate, not both")
    if got["time_scale"] is None:
        got["time_scale"] = 1.0
    if got["time_scale"] <= 0:
        raise ScenarioError(f"{where}: time_scale must be > 0, got {got['time_scale']}")
    if got["rate"] is not None and not got["rate"] > 0:
        raise ScenarioError(f"{where}: rate must be > 0 (requests per second), got {got['rate']}")
    if not got["burstiness"] > 0:
        raise ScenarioError(f"{where}: burstiness must be > 0, got {got['burstiness']}")
    if got["arrivals"] != "trace" and got["time_scale"] != 1.0:
        raise ScenarioError(f"{where}: time_scale applies to arrivals = 'trace'; use rate")
    if got["arrivals"] == "poisson" and got["burstiness"] != 1.0:
        raise ScenarioError(f"{where}: burstiness applies to arrivals = 'gamma', not 'poisson'")
    if got["num_requests"] is not None and got["num_requests"] < 1:
        raise ScenarioError(f"{where}: num_requests must be >= 1, got {got['num_requests']}")
    if got["max_output_tokens"] is not None and got["max_output_tokens"] < 1:
        raise ScenarioError(
            f"{where}: max_output_tokens must be >= 1, got {got['max_output_tokens']}"
        )
    if got["block_size"] is None:
        got["block_size"] = pol.block_size
    if got["block_size"] < 1:
        raise ScenarioError(f"{where}: block_size must be >= 1, got {got['block_size']}")
    if got["num_gpu_blocks"] < 0:
        raise ScenarioError(f"{where}: num_gpu_blocks must be >= 0, got {got['num_gpu_blocks']}")
    if not 0 < got["gpu_memory_utilization"] <= 1:
        raise ScenarioError(
            f"{where}: gpu_memory_utilization must be in (0, 1], got "
            f"{got['gpu_memory_utilization']}"
        )
    if got["max_model_len"] is not None and got["max_model_len"] < 2:
        raise ScenarioError(f"{where}: max_model_len must be >= 2, got {got['max_model_len']}")

    _check_ranges(got, params, where)

    cost, profile_name, max_model_len, num_gpu_blocks, frontend = _resolve_cost(got, values, where)
    cost = sched_cpu.with_overrides(cost, got, where)
    frontend = _frontend_overrides(frontend, got, where)
    memory = Memory(
        block_size=got["block_size"], num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len
    )
    try:
        pol.check(params, memory)
    except ScenarioError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    if pol.num_blocks(memory, params) < 1:
        raise ScenarioError(f"{where}: num_gpu_blocks ({num_gpu_blocks}) leaves no usable block")
    caching, router_params = _check_caching_and_routing(got, policy, params, where)
    swap = None
    tiers = None
    if policy == "vllm":
        custom = "cost" in values
        swap = resolve_swap(
            params,
            profile=None if custom else got["profile"] or "",
            block_size=got["block_size"],
            caching=caching,
            where=where,
        )
        tiers = resolve_tiers(
            params,
            profile=None if custom else got["profile"] or "",
            block_size=got["block_size"],
            caching=caching,
            where=where,
        )
    disagg = _resolve_disagg(got, values, policy, where)
    if disagg is not None:  # the prefill workers, then the decode workers
        got["replicas"] = disagg.prefill_replicas + disagg.decode_replicas
    uncertainty = cost_uncertainty.resolve(
        got["cost_uncertainty"], got["profile"], custom="cost" in values, where=where
    )
    autoscale = _autoscale(got, values, where)
    if autoscale is not None:
        got["replicas"] = autoscale.initial_replicas
    speculative = got["speculative"]
    if speculative is not None:
        spec.refuse(policy, where)
        if params.async_scheduling:
            raise ScenarioError(
                f"{where}: speculative is modelled on vLLM's synchronous engine loop only (async "
                "scheduling's placeholders for draft tokens are not); set async_scheduling = false"
            )
        if disagg is not None:
            raise ScenarioError(
                f"{where}: speculative with prefill_replicas/decode_replicas is not modelled; "
                "drop one of them"
            )
        if swap is not None:
            raise ScenarioError(
                f"{where}: speculative with preemption_mode = 'swap' is not modelled (vLLM V0's "
                "swap and V1's spec-decode path never ran together); drop one of them"
            )
        speculative.check(params.max_num_batched_tokens, where)
    if tiers is not None:  # KV offloading tiers: what they are not modelled with
        for other, what in (
            (speculative is not None, "speculative"),
            (disagg is not None, "prefill_replicas/decode_replicas"),
            (autoscale is not None, "[autoscale]"),
        ):
            if other:
                raise ScenarioError(
                    f"{where}: kv_offloading_size_gb with {what} is not modelled; drop one of them"
                )
    return Scenario(
        name=name,
        policy=policy,
        params=params,
        profile=profile_name,
        cost=cost,
        memory=memory,
        gpu_memory_utilization=got["gpu_memory_utilization"],
        replicas=got["replicas"],
        router=got["router"],
        arrivals=ArrivalSpec(
            process=got["arrivals"],
            time_scale=got["time_scale"],
            rate=got["rate"],
            burstiness=got["burstiness"],
            num_requests=got["num_requests"],
        ),
        max_output_tokens=got["max_output_tokens"],
        drop_too_long=got["drop_too_long"],
        seed=got["seed"],
        prefix_caching=caching,
        prefix_warmup_requests=got["prefix_warmup_requests"],
        prefix_partial_blocks=got["prefix_partial_blocks"] is not False,
        tenant_priority=got["tenant_priority"],
        router_params=router_params,
        frontend=frontend,
        cost_uncertainty=uncertainty,
        disagg=disagg,
        autoscale=autoscale,
        swap=swap,
        speculative=speculative,
        kv_tiers=tiers,
    )


def _resolve_disagg(
    got: dict[str, Any], values: dict[str, Any], policy: str, where: str
) -> Disagg | None:
    """The scenario's disaggregation (disagg.py) after checking its keys; None: aggregated."""
    x, y = got["prefill_replicas"], got["decode_replicas"]
    if not x and not y:
        given = [
            k
            for k in DISAGG_KEYS
            if got[k] is not None and k not in ("prefill_replicas", "decode_replicas")
        ]
        if given:
            raise ScenarioError(
                f"{where}: {', '.join(given)} applies to a disaggregated scenario; set "
                "prefill_replicas and decode_replicas (both >= 1)"
            )
        return None
    if x < 1 or y < 1:
        raise ScenarioError(
            f"{where}: prefill_replicas and decode_replicas must both be >= 1 to disaggregate "
            f"(both 0: aggregated), got {x} and {y}"
        )
    if policy != "vllm":
        raise ScenarioError(f"{where}: {policy_error(policy)}")
    if "replicas" in values:
        raise ScenarioError(
            f"{where}: replicas: give replicas (aggregated) or prefill_replicas and "
            "decode_replicas (disaggregated), not both"
        )
    link = got["kv_link"] or DEFAULT_LINK
    _choice("kv_link", link, LINKS, where)
    decode_router = got["decode_router"] or "round_robin"
    _choice("decode_router", decode_router, DECODE_ROUTERS, where)
    kv_bytes = got["kv_bytes_per_token"]
    if kv_bytes is None:
        if "cost" in values:
            raise ScenarioError(
                f"{where}: kv_bytes_per_token is required with a [cost] table and "
                "prefill_replicas (there is no model to derive it from)"
            )
        from pipeline.sim import profiles

        kv_bytes = profiles.load_profile(
            got["profile"] or profiles.DEFAULT_PROFILE
        ).kv_bytes_per_token
    return Disagg(
        prefill_replicas=x,
        decode_replicas=y,
        link=link,
        link_gbps=got["kv_link_gbps"] if got["kv_link_gbps"] is not None else LINKS[link].gbps,
        link_latency_s=(
            got["kv_link_latency_s"]
            if got["kv_link_latency_s"] is not None
            else LINKS[link].latency_s
        ),
        kv_bytes_per_token=int(kv_bytes),
        decode_router=decode_router,
        prefill_num_gpu_blocks=got["prefill_num_gpu_blocks"] or 0,
        decode_num_gpu_blocks=got["decode_num_gpu_blocks"] or 0,
    )


def _build_fleet(values: dict[str, Any], where: str) -> Scenario:
    """A scenario with ``[[pool]]`` tables: the fleet's own keys, and each pool's scenario
    (the fleet's keys overridden by the pool's; see ``pools.py``)."""
    tables = check_pool_tables(values["pool"], where)
    top = {k: v for k, v in values.items() if k != "pool"}
    fleet = build_scenario(top, where=where)
    top_policy = fleet.policy
    pools: list[Pool] = []
    for table in tables:
        pname = table["name"]
        pwhere = f"{where} [pool {pname}]"
        match = parse_match(table, pwhere)
        own = {k: v for k, v in table.items() if k not in MATCH_KEYS and k != "name"}
        policy = own.get("policy", top_policy)
        inherited = top
        if policy != top_policy:  # the fleet's policy parameters are not this pool's
            theirs = set(POLICIES[top_policy].param_help()) if top_policy in POLICIES else set()
            inherited = {k: v for k, v in top.items() if k not in theirs}
        psc = build_scenario({**inherited, **own, "name": f"{fleet.name}.{pname}"}, where=pwhere)
        # the client sees the fleet's front end, whichever GPU serves it
        pools.append(Pool(pname, match, replace(psc, frontend=fleet.frontend)))
    return replace(fleet, pools=tuple(pools), replicas=replicas_of(pools))


def _autoscale(got: dict[str, Any], values: dict[str, Any], where: str) -> Autoscale | None:
    """The [autoscale] table resolved (its startup default needs the profile's weights)."""
    if got["autoscale"] is None:
        return None
    if got["prefill_replicas"] or got["decode_replicas"]:
        raise ScenarioError(
            f"{where}: autoscale applies to aggregated replicas, not to prefill_replicas and "
            "decode_replicas; leave one of them out"
        )
    weights = None
    if "cost" not in values:
        from pipeline.sim import profiles

        weights = profiles.load_profile(got["profile"] or profiles.DEFAULT_PROFILE).weight_bytes
    return scaling.resolve(got["autoscale"], got["replicas"], weights, where)


def _frontend_overrides(fe: Frontend, got: dict[str, Any], where: str) -> Frontend:
    """The profile's front end with the scenario's frontend_* keys in place of its terms."""
    values = fe.to_dict()
    for key, name in FRONTEND_KEYS.items():
        if got[key] is not None:
            v = got[key]
            if not math.isfinite(v) or v < 0:
                raise ScenarioError(f"{where}: {key} must be a finite number >= 0, got {v}")
            values[name] = v
    return Frontend(**values)


def _check_caching_and_routing(
    got: dict[str, Any], policy: str, params: Any, where: str
) -> tuple[bool, dict[str, float] | None]:
    """(prefix caching on, prefix_aware router parameters) after checking the keys."""
    pol = POLICIES[policy]
    caching = got["enable_prefix_caching"]
    if caching is None:
        caching = bool(pol.prefix_caching)
    if caching and pol.prefix_caching is None:
        raise ScenarioError(
            f"{where}: enable_prefix_caching: policy {policy} has no prefix-cache model; "
            f"allowed with: {', '.join(sorted(CACHING_POLICIES))}"
        )
    if got["prefix_warmup_requests"] < 0:
        raise ScenarioError(
            f"{where}: prefix_warmup_requests must be >= 0, got {got['prefix_warmup_requests']}"
        )
    if got["prefix_warmup_requests"] and not caching:
        raise ScenarioError(f"{where}: prefix_warmup_requests needs enable_prefix_caching = true")
    if got["prefix_partial_blocks"] is not None and not caching:
        raise ScenarioError(f"{where}: prefix_partial_blocks needs enable_prefix_caching = true")
    if got["tenant_priority"] is not None and pol.queue(params) != Q_PRIORITY:
        raise ScenarioError(
            f"{where}: tenant_priority applies to policy vllm with scheduling_policy = 'priority'"
        )
    given = {k: got[k] for k in ROUTER_PARAMS if got[k] is not None}
    if got["router"] != "prefix_aware":
        if given:
            raise ScenarioError(
                f"{where}: {', '.join(sorted(given))} applies to router = 'prefix_aware'"
            )
        return caching, None
    if not caching:
        raise ScenarioError(f"{where}: router prefix_aware needs enable_prefix_caching = true")
    resolved = {k: float(given.get(k, default)) for k, (default, _) in ROUTER_PARAMS.items()}
    if not 0.0 <= resolved["cache_threshold"] <= 1.0:
        raise ScenarioError(
            f"{where}: cache_threshold must be in [0, 1], got {resolved['cache_threshold']}"
        )
    if resolved["balance_abs_threshold"] < 0 or resolved["balance_rel_threshold"] < 1.0:
        raise ScenarioError(
            f"{where}: balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1, got "
            f"{resolved['balance_abs_threshold']} and {resolved['balance_rel_threshold']}"
        )
    return caching, resolved


def _resolve_cost(
    got: dict[str, Any], values: dict[str, Any], where: str
) -> tuple[StepCost, str, int, int, Frontend]:
    """(cost, profile name, max_model_len, num_gpu_blocks, front end) from the profile or
    [cost] (which has no front end)."""
    if "cost" in values:
        if got["profile"] is not None:
            raise ScenarioError(f"{where}: give either profile or a [cost] table, not both")
        table = values["cost"]
        names = [f.name for f in fields(StepCost)]
        if not isinstance(table, dict):
            raise ScenarioError(f"{where}: cost must be a table of {', '.join(names)}")
        unknown = sorted(set(table) - set(names))
        missing = [n for n in names if n not in table and n not in OPTIONAL_COEFFICIENTS]
        if unknown or missing:
            raise ScenarioError(
                f"{where}: [cost] takes these keys: {', '.join(names)}"
                + f" ({', '.join(OPTIONAL_COEFFICIENTS)} optional)"
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                + (f"; missing: {', '.join(missing)}" if missing else "")
            )
        coeffs = {n: _convert(f"cost.{n}", table.get(n, 0.0), float, where) for n in names}
        for n, v in coeffs.items():
            if v < 0:
                raise ScenarioError(f"{where}: cost.{n} must be >= 0, got {v}")
            hi = float(MAX_COUNT) if n.endswith("_tokens") or n.endswith("_half") else None
            validation.finite_float(
                v, f"cost.{n}", where, lo=0.0, hi=hi or COST_SECONDS_MAX, error=ScenarioError
            )
        for n in ("overlap", "separate_attention"):
            if coeffs[n] > 1:
                raise ScenarioError(f"{where}: cost.{n} must be in [0, 1], got {coeffs[n]}")
        if not got["num_gpu_blocks"]:
            raise ScenarioError(
                f"{where}: num_gpu_blocks is required with a [cost] table (there is no GPU "
                "memory to derive it from)"
            )
        max_model_len = got["max_model_len"] or DEFAULT_MAX_MODEL_LEN
        return StepCost(**coeffs), CUSTOM_PROFILE, max_model_len, got["num_gpu_blocks"], Frontend()

    try:
        from pipeline.sim import profiles
    except ImportError:
        raise ScenarioError(
            f"{where}: step-cost profiles are not available in this installation; "
            "give a [cost] table of coefficients instead"
        ) from None
    name = got["profile"] or profiles.DEFAULT_PROFILE
    try:
        prof = profiles.load_profile(name)
    except PipelineError as exc:
        raise ScenarioError(f"{where}: profile: {exc}") from None
    except (OSError, KeyError, ValueError):
        raise ScenarioError(
            f"{where}: unknown profile {name!r}; allowed: {', '.join(profiles.list_profiles())} "
            "or the path of a profile JSON file"
        ) from None
    max_model_len = got["max_model_len"] or int(prof.max_model_len)
    num_gpu_blocks = got["num_gpu_blocks"]
    if not num_gpu_blocks:
        try:
            num_gpu_blocks = int(
                prof.num_gpu_blocks(got["block_size"], got["gpu_memory_utilization"])
            )
        except ValueError as exc:
            raise ScenarioError(
                f"{where}: gpu_memory_utilization: {exc}; or set num_gpu_blocks"
            ) from None
    return prof.cost, prof.name, max_model_len, num_gpu_blocks, prof.frontend


def read_scenario_file(path: Path) -> dict[str, Any]:
    """The raw keys of a scenario TOML file (name defaults to the file stem)."""
    data = validation.read_toml_file(path, "scenario file", error=ScenarioError)
    data.setdefault("name", Path(path).stem)
    return data


def parse_value(text: str) -> Any:
    """A --set value as TOML (numbers, booleans, quoted strings), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text


def resolve_scenarios(
    files: list[Path] | list[Path | dict[str, Any]],
    flags: dict[str, Any],
    defaults: dict[str, Any] | None = None,
) -> list[Scenario]:
    """Scenarios from files and flags: one per file, or one from the flags alone.

    Flags override the values of every file; ``defaults`` (the config file's
    ``[replay]`` section) fill what neither gives. An item of ``files`` may also be
    a dict of scenario keys, read as a file's keys would be (``pipeline.api``).

    Raises:
        ScenarioError: an invalid scenario, or two scenarios with the same name.
    """
    defaults = defaults or {}
    flags = {k: v for k, v in flags.items() if v is not None}
    layers: list[tuple[str, dict[str, Any]]] = []
    if files:
        for i, item in enumerate(files, 1):
            if isinstance(item, dict):
                layers.append((f"scenario {i}", {**defaults, **item, **flags}))
            else:
                layers.append((str(item), {**defaults, **read_scenario_file(item), **flags}))
    else:
        layers.append(("flags", {**defaults, **flags}))
    scenarios = [build_scenario(values, where=where) for where, values in layers]
    seen: dict[str, str] = {}
    for (where, _), sc in zip(layers, scenarios, strict=True):
        if sc.name in seen:
            raise ScenarioError(
                f"{where}: scenario name {sc.name!r} is also used by {seen[sc.name]}; "
                "give each scenario its own name"
            )
        seen[sc.name] = where
    return scenarios
