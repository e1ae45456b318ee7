"""Prefix caching on the Mooncake conversation trace: replay speed and the hit-rate curve.

The trace (12,031 requests, one hour of Kimi chat traffic, 512-token prefix
hashes) is ingested once. The scenario is one Llama-3-70B on 8 H200s
(``llama-3-70b_h200_tp8``) with Llama-3.1's 131,072-token context (the longest
prompt is 126,195 tokens), the trace replayed at a quarter of its rate
(``time_scale = 4``) so that the replica keeps up; vLLM with 16-token KV
blocks, SGLang with token-granular KV (page size 1), both at their defaults.

Figures:
- speed: simulated requests per second of ``simulate`` alone, prefix
  caching on and off, the profile's KV cache (medians of 3 fresh processes,
  compiled loop loaded first); the ratio is the cost of caching;
- the hit-rate curve: token and request hit rates and evictions with a KV
  cache of 1k, 5k and 20k blocks of 512 tokens, and unbounded;
- partial last trace blocks: a synthetic trace in Mooncake's format (512-token
  hash ids, the last one of a partial block; 40% of the prompts shorter than
  one block, many of them repeated), unbounded cache, whole blocks only
  (``prefix_partial_blocks = false``) against the default, beside the ceilings
  counted straight from the ids.

Run from the repository root:

    .venv/bin/python bench/prefix_cache.py           # writes "## Prefix caching" to RESULTS.md
    .venv/bin/python bench/prefix_cache.py --quick   # prints only

Targets: caching costs at most 2x the no-cache replay speed (issue 20), at most
1.5x (issue 26).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import RESULTS, child, record  # noqa: E402

OUT = ROOT / "bench" / "out" / "prefix"
MOONCAKE = ROOT.parent / "shared" / "traces_raw" / "mooncake" / "conversation_trace.jsonl"
BASE = {"profile": "llama-3-70b_h200_tp8", "max_model_len": 131072, "time_scale": 4.0}
SIZES = [1_000, 5_000, 20_000, None]  # KV blocks of 512 tokens; None: unbounded
# the most KV blocks a scenario takes (int32), more than the trace's requests ever hold
# at once: an unbounded cache, it never evicts
UNBOUNDED_BLOCKS = 2**31 - 1

SPEED = """
import numpy as np
from pathlib import Path
from pipeline.contracts import REQUESTS
from pipeline.sim.simulate import simulate, warm_up
from pipeline.sim.replay_input import prepare, read_requests
from pipeline.sim.scenario import build_scenario
from pipeline.sim.summary import summarize
from pipeline.warehouse import Warehouse
sc = build_scenario({scenario!r})
warm_up(sc.engine())
frame = read_requests(Warehouse(Path({wh!r})).files(REQUESTS))
prep = prepare(frame, sc)
t = time.perf_counter()
res = simulate(prep.inp, sc.engine())
loop_s = time.perf_counter() - t
s = summarize(res)
out = {{"loop_s": loop_s, "requests_per_s": len(prep.inp) / loop_s, "steps": s["num_steps"],
        "hit_rate": s["prefix_token_hit_rate"] or 0.0}}
"""


def warehouse() -> Path:
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.warehouse import Warehouse

    wh = OUT / "wh_mooncake_conv"
    if not (wh / "requests").exists():
        ingest_logs([str(MOONCAKE)], Warehouse(wh), IngestOptions(quiet=True))
    return wh


def block_size(policy: str) -> int:
    return 16 if policy == "vllm" else 1


def curve(wh: Path, policy: str) -> list[dict[str, float]]:
    """Hit rates and evictions for each cache size (one replay each, in this process)."""
    from pipeline.contracts import REQUESTS
    from pipeline.sim.replay_input import prepare, read_requests
    from pipeline.sim.scenario import build_scenario
    from pipeline.sim.simulate import simulate
    from pipeline.sim.summary import summarize
    from pipeline.warehouse import Warehouse

    frame = read_requests(Warehouse(wh).files(REQUESTS))
    rows = []
    bs = block_size(policy)
    for size in SIZES:
        extra = 1 if policy == "vllm" else 0  # vLLM's null block
        blocks = UNBOUNDED_BLOCKS if size is None else size * 512 // bs + extra
        sc = build_scenario({**BASE, "policy": policy, "block_size": bs, "num_gpu_blocks": blocks})
        s = summarize(simulate(prepare(frame, sc).inp, sc.engine()))
        rows.append(
            {
                "size": -1 if size is None else size,
                "token_hit_rate": s["prefix_token_hit_rate"],
                "request_hit_rate": s["prefix_request_hit_rate"],
                "evicted_blocks": s["prefix_evicted_blocks"] * bs / 512,
                "preemptions": s["num_preemptions"],
                "ttft_p50_s": s["ttft_p50_s"],
            }
        )
    return rows


def synthetic_partial(n: int = 12_000, seed: int = 7) -> Any:
    """A Mooncake-format requests frame whose short prompts repeat: 40% of the prompts
    are shorter than 512 tokens (one partial block; most of them popular ones asked
    again), the rest a shared system prompt of 1-3 blocks and a question of their own
    (5% retries of an earlier one). Ids are chained over each block's content, its
    length included for a partial block, as Mooncake's are."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    chains: dict[tuple[object, ...], int] = {}
    systems = [(k, int(rng.integers(1, 4))) for k in range(5)]
    shorts: list[tuple[int, int]] = []  # (content, length) of the short prompts so far
    longs: list[tuple[int, list[int]]] = []
    rows: list[tuple[float, int, int, list[int]]] = []
    t = 0.0
    for j in range(n):
        t += float(rng.exponential(0.3))
        if rng.random() < 0.39:
            if shorts and rng.random() < 0.9:  # a popular one again (Zipf)
                content, length = shorts[min(int(rng.zipf(1.5)) - 1, len(shorts) - 1)]
            else:
                content, length = j, int(rng.integers(20, 512))
                shorts.append((content, length))
            ids = [chains.setdefault((-1, "short", content, length), len(chains))]
        elif longs and rng.random() < 0.05:
            length, ids = longs[int(rng.integers(len(longs)))]
        else:
            k, blocks = systems[int(rng.integers(len(systems)))]
            length = blocks * 512 + int(rng.integers(1, 3000))
            ids, parent = [], -1
            for b in range(-(-length // 512)):
                size = min(512, length - 512 * b)
                own = ("system", k, b) if b < blocks else ("own", j, b, size)
                parent = chains.setdefault((parent, *own), len(chains))
                ids.append(parent)
            longs.append((length, ids))
        rows.append((t, length, int(rng.integers(10, 400)), ids))
    return pl.DataFrame(
        {
            "request_id": [f"r{j:06d}" for j in range(n)],
            "arrival_s": [r[0] for r in rows],
            "prompt_tokens": [r[1] for r in rows],
            "output_tokens": [r[2] for r in rows],
            "max_tokens": pl.Series([None] * n, dtype=pl.Int32),
            "block_size": pl.Series([512] * n, dtype=pl.Int32),
            "prefix_hashes": pl.Series([r[3] for r in rows], dtype=pl.List(pl.UInt64)),
        }
    )


def ceilings(frame: Any, engine_block: int) -> dict[str, float]:
    """Token hit rates of an unbounded cache counted from the ids: whole 512-token blocks
    (at most prompt - 1 tokens); a repeated prompt's partial last block too, whole (its
    tokens) or in engine blocks (up to prompt - 1 tokens)."""
    seen: set[int] = set()
    whole = tokens = blocks = total = 0
    for length, ids in zip(frame["prompt_tokens"], frame["prefix_hashes"], strict=True):
        full = list(ids[: length // 512])
        k = 0
        while k < min(len(full), (length - 1) // 512) and full[k] in seen:
            k += 1
        whole += k * 512
        rest = list(ids[len(full) :])
        again = bool(rest) and k == len(full) and rest[0] in seen
        tokens += k * 512 + (length - k * 512 if again else 0)
        blocks += k * 512 + ((length - 1 - k * 512) // engine_block * engine_block if again else 0)
        total += length
        seen.update(int(x) for x in ids)
    return {"whole": whole / total, "tokens": tokens / total, "blocks": blocks / total}


def partial_blocks() -> dict[str, Any]:
    """Hit rates on ``synthetic_partial`` with whole blocks only and with the tails."""
    from pipeline.sim.replay_input import prepare
    from pipeline.sim.scenario import build_scenario
    from pipeline.sim.simulate import simulate
    from pipeline.sim.summary import summarize

    frame = synthetic_partial()
    short = float((frame["prompt_tokens"] < 512).mean())
    rates: dict[tuple[str, bool], float] = {}
    for policy in ("vllm", "sglang"):
        bs = block_size(policy)
        for partial in (False, True):
            sc = build_scenario(
                {**BASE, "policy": policy, "block_size": bs, "prefix_partial_blocks": partial,
                 "num_gpu_blocks": UNBOUNDED_BLOCKS}
            )  # fmt: skip
            s = summarize(simulate(prepare(frame, sc).inp, sc.engine()))
            rates[policy, partial] = float(s["prefix_token_hit_rate"])
    return {
        "short": short,
        "rates": rates,
        "vllm": ceilings(frame, 16),
        "sglang": ceilings(frame, 1),
    }


def core_figure() -> float | None:
    """The loop's requests/s at 100k requests in RESULTS.md's Simulator section."""
    import re

    text = RESULTS.read_text() if RESULTS.exists() else ""
    found = re.search(r"^\| 100,000 \| ([\d,]+) \|", text, re.M)
    return float(found.group(1).replace(",", "")) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run each; print, do not record")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    OUT.mkdir(parents=True, exist_ok=True)
    wh = warehouse()
    repeats = 1 if args.quick else 3
    speed: dict[tuple[str, bool], dict[str, float]] = {}
    for policy in ("vllm", "sglang"):
        for caching in (False, True):
            scenario = {**BASE, "policy": policy, "enable_prefix_caching": caching}
            speed[policy, caching] = m = child(
                SPEED.format(scenario=scenario, wh=str(wh)), repeats=repeats
            )
            print(
                f"{policy:>6} caching {'on ' if caching else 'off'}: {m['requests_per_s']:,.0f} "
                f"req/s ({m['loop_s'] * 1e3:.0f} ms, {m['steps']:,.0f} steps), hit rate "
                f"{m['hit_rate']:.1%}",
                flush=True,
            )
    curves = {policy: curve(wh, policy) for policy in ("vllm", "sglang")}
    for policy, rows in curves.items():
        for row in rows:
            print(policy, row, flush=True)
    tails = partial_blocks()
    print("partial last blocks:", tails, flush=True)
    if args.quick:
        return
    lines = [
        "Trace: Mooncake `conversation_trace.jsonl` (12,031 requests, 512-token prefix hashes), "
        "ingested; replayed at a quarter of its rate (`time_scale = 4`) on one "
        "`llama-3-70b_h200_tp8` replica with `max_model_len = 131072`; vLLM with 16-token "
        "KV blocks, SGLang token-granular; both at their defaults.",
        "",
        "**Speed** (loop only, the profile's KV cache, medians of 3 fresh processes):",
        "",
        "| policy | caching off req/s | caching on req/s | cost of caching | hit rate |",
        "|---|---:|---:|---:|---:|",
    ]
    for policy in ("vllm", "sglang"):
        off, on = speed[policy, False], speed[policy, True]
        lines.append(
            f"| {policy} | {off['requests_per_s']:,.0f} | {on['requests_per_s']:,.0f} | "
            f"{off['requests_per_s'] / on['requests_per_s']:.2f}x | {on['hit_rate']:.1%} |"
        )
    core = core_figure()
    if core:
        ratios = ", ".join(
            f"{p} {core / speed[p, True]['requests_per_s']:.2f}x" for p in ("vllm", "sglang")
        )
        lines += [
            "",
            f"Against the core simulator's no-cache figure (section Simulator: {core:,.0f} "
            f"req/s, 100k requests of Azure conversation lengths, no prefix hashes), the cost "
            f"of replaying Mooncake with caching on is: {ratios}. Mooncake's prompts are ten "
            "times longer than Azure's, so more steps carry prefill and fewer fold into "
            "decode runs.",
        ]
    lines += [
        "",
        "**Hit rate against cache size** (KV blocks of 512 tokens; unbounded = never evicts):",
        "",
        "| KV cache | vllm token hit rate | vllm request hit rate | vllm blocks evicted "
        "| sglang token hit rate | sglang blocks evicted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for v, s in zip(curves["vllm"], curves["sglang"], strict=True):
        size = "unbounded" if v["size"] < 0 else f"{int(v['size']):,} x 512"
        lines.append(
            f"| {size} | {v['token_hit_rate']:.1%} | {v['request_hit_rate']:.1%} | "
            f"{v['evicted_blocks']:,.0f} | {s['token_hit_rate']:.1%} | "
            f"{s['evicted_blocks']:,.0f} |"
        )
    costs = {p: speed[p, False]["requests_per_s"] / speed[p, True]["requests_per_s"]
             for p in ("vllm", "sglang")}  # fmt: skip
    verdict = "; ".join(
        f"{p} {c:.2f}x: 2x {'met' if c <= 2 else '**not met**'}, "
        f"1.5x {'met' if c <= 1.5 else '**not met**'}"
        for p, c in costs.items()
    )
    rates, v, s = tails["rates"], tails["vllm"], tails["sglang"]
    lines += [
        "",
        "Unbounded, the token hit rate equals a direct count over the trace's JSON lines "
        f"(`tests/sim/test_mooncake.py`). Targets: caching costs at most 2x (issue 20) "
        f"and at most 1.5x (issue 26): {verdict}.",
        "",
        "**Partial last trace blocks** (a synthetic trace in Mooncake's format, 12,000 "
        f"requests, {tails['short']:.0%} of the prompts shorter than one 512-token block, "
        "most of them asked again; unbounded cache; `synthetic_partial` in the bench):",
        "",
        "| reading | vllm token hit rate | sglang token hit rate | ceiling (from the ids) |",
        "|---|---:|---:|---:|",
        f"| whole blocks only (`prefix_partial_blocks = false`) | {rates['vllm', False]:.1%} "
        f"| {rates['sglang', False]:.1%} | {v['whole']:.1%} |",
        f"| partial last blocks hit (default) | {rates['vllm', True]:.1%} | "
        f"{rates['sglang', True]:.1%} | {v['blocks']:.1%} in 16-token blocks, "
        f"{s['blocks']:.1%} in tokens less the last, {v['tokens']:.1%} counting whole "
        "partial blocks |",
    ]
    record("Prefix caching", ".venv/bin/python bench/prefix_cache.py", "\n".join(lines))
    print("recorded in bench/RESULTS.md")


if __name__ == "__main__":
    main()
