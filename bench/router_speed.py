"""Router speed: round_robin, least_outstanding and prefix_aware at 1, 4, 16 and 64 replicas.

Workload: 1M requests with the Azure conversation trace's lengths (drawn with
replacement, seed 1) and Poisson arrivals at 16.8 req/s per replica (75% of
what one Llama-3-8B/H100 replica of the ``vllm`` scenario sustains, see the
Simulator section of RESULTS.md), so each replica sees the same load at every
replica count. Scenario ``vllm`` with chunked prefill, every step recorded
(runs of identical decode steps as one row).

Two families:
- caching off: round_robin and least_outstanding (the issue's measurement);
- caching on, with synthetic prefix keys (256-token units; each request's
  first 1 to 3 units shared with its group, one of 2,000 groups drawn with a
  skew, the rest its own): all three routers, prefix_aware needing the cache.

Figures: simulated requests per second of ``simulate`` alone (one fresh
process per family and replica count, a warm-up that loads the compiled loop,
then the routers' runs interleaved; medians of ``--repeats`` rounds, of
``--cached-repeats`` with caching, whose runs take a minute each), timeline
rows, steps, and the ratio to round_robin at the same replica count (the
target: >= 0.5 at 64 replicas).

Run from the repository root:

    .venv/bin/python bench/router_speed.py            # 1M requests, writes bench/RESULTS.md
    .venv/bin/python bench/router_speed.py --quick    # 100k, 1 round; prints only
    .venv/bin/python bench/router_speed.py --replicas 64 --cached-only   # one part; prints only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _measure import child, record  # noqa: E402

OUT = ROOT / "bench" / "out" / "routers"
AZURE = ROOT.parent / "shared" / "traces_raw" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
RATE_PER_REPLICA = 16.8
UNIT = 256
GROUPS = 2000
REPLICAS = (1, 4, 16, 64)

RUN = """
import numpy as np
from pipeline.sim.simulate import simulate
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import PrefixKeys, SimInput
d = np.load({data!r})
n = {n}
routers = {routers!r}
scenarios = [build_scenario({{"policy": "vllm", "enable_chunked_prefill": True,
                              "max_model_len": 16384, "replicas": {replicas}, "router": name,
                              "enable_prefix_caching": {caching}}}) for name in routers]
prefix = None
if {caching}:
    off = d["offsets"][: n + 1]
    prefix = PrefixKeys(off, d["keys"][: off[-1]], d["unit_tokens"][:n])
arrival = np.cumsum(d["gaps"][:n]) / ({rate} * {replicas})
inp = SimInput(arrival, d["prompt"][:n], d["output"][:n], prefix=prefix)
tiny = SimInput(np.zeros(2), np.array([300, 300]), np.array([3, 3]),
                prefix=None if prefix is None else prefix.slice(0, 2))
simulate(tiny, scenarios[-1].engine())
times = {{name: [] for name in routers}}
out = {{}}
for _ in range({repeats}):  # interleaved: each router's runs and its baseline's share the minutes
    for name, sc in zip(routers, scenarios):
        t = time.perf_counter()
        res = simulate(inp, sc.engine())
        times[name].append(time.perf_counter() - t)
        out[name + ".rows"] = len(res.st)
        out[name + ".steps"] = res.num_steps
        del res
for name in routers:
    loop_s = sorted(times[name])[len(times[name]) // 2]
    out[name + ".loop_s"] = loop_s
    out[name + ".requests_per_s"] = n / loop_s
"""


def make_data(n: int) -> Path:
    """Lengths, unit-rate gaps and prefix keys of n requests, saved once."""
    import numpy as np
    import polars as pl

    path = OUT / f"requests_{n}.npz"
    if path.exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    df = pl.read_csv(AZURE)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(df), n)
    prompt = df["ContextTokens"].to_numpy()[idx].astype(np.int64)
    output = df["GeneratedTokens"].to_numpy()[idx].astype(np.int64)
    gaps = rng.exponential(1.0, n)
    units = prompt // UNIT
    group = (GROUPS * rng.random(n) ** 2).astype(np.int64)  # skewed: low groups are popular
    shared = np.minimum(units, 1 + group % 3)
    offsets = np.concatenate([[0], np.cumsum(units)]).astype(np.int64)
    owner = np.repeat(np.arange(n), units)
    j = np.arange(int(offsets[-1])) - offsets[:-1][owner]  # unit index within its request
    base = np.where(j < shared[owner], group[owner], GROUPS + owner).astype(np.uint64)
    with np.errstate(over="ignore"):  # splitmix64 of (source, unit): wraps by design
        x = base * np.uint64(1 << 20) + j.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        keys = x ^ (x >> np.uint64(31))
    unit_tokens = np.where(units > 0, UNIT, 0).astype(np.int64)
    np.savez(path, prompt=prompt, output=output, gaps=gaps, offsets=offsets, keys=keys,
             unit_tokens=unit_tokens)  # fmt: skip
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k requests, 1 run; print only")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, caching off")
    parser.add_argument("--cached-repeats", type=int, default=1, help="timed runs, caching on")
    parser.add_argument(
        "--replicas", type=int, nargs="+", default=list(REPLICAS), help="replica counts; print only"
    )
    parser.add_argument("--cached-only", action="store_true", help="caching on only (print only)")
    args = parser.parse_args()
    partial = args.quick or args.cached_only or sorted(args.replicas) != sorted(REPLICAS)
    sys.path.insert(0, str(ROOT))
    n = 100_000 if args.quick else 1_000_000
    repeats = 1 if args.quick else args.repeats
    cached_repeats = 1 if args.quick else args.cached_repeats
    data = make_data(1_000_000)
    families = {
        False: ("round_robin", "least_outstanding"),
        True: ("round_robin", "least_outstanding", "prefix_aware"),
    }
    if args.cached_only:
        del families[False]
    results: dict[tuple[bool, str, int], dict[str, float]] = {}
    for replicas in args.replicas:
        for caching, routers in families.items():
            reps = repeats if not caching else cached_repeats
            code = RUN.format(data=str(data), n=n, replicas=replicas, routers=routers,
                              caching=caching, rate=RATE_PER_REPLICA, repeats=reps)  # fmt: skip
            m = child(code, repeats=1)
            for router in routers:
                results[(caching, router, replicas)] = {
                    k.split(".", 1)[1]: v for k, v in m.items() if k.startswith(router + ".")
                }
                r = results[(caching, router, replicas)]
                rr = results[(caching, "round_robin", replicas)]["requests_per_s"]
                print(
                    f"cache {'on ' if caching else 'off'} {router:18s} x{replicas:<3d}"
                    f" {r['requests_per_s']:>10,.0f} req/s  loop {r['loop_s']:6.2f} s"
                    f"  rows {r['rows']:>11,.0f}  steps {r['steps']:>11,.0f}"
                    f"  vs round_robin {r['requests_per_s'] / rr:.2f}x",
                    flush=True,
                )
            print(f"  peak RSS {m['peak_rss_mb']:,.0f} MB", flush=True)
    lines = [
        "| prefix cache | router | replicas | req/s | loop s | timeline rows | steps "
        "| / round_robin |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for caching, routers in families.items():
        for router, replicas in [(x, y) for x in routers for y in args.replicas]:
            m = results[(caching, router, replicas)]
            rr = results[(caching, "round_robin", replicas)]["requests_per_s"]
            lines.append(
                f"| {'on' if caching else 'off'} | {router} | {replicas} "
                f"| {m['requests_per_s']:,.0f} | {m['loop_s']:.2f} | {m['rows']:,.0f} "
                f"| {m['steps']:,.0f} | {m['requests_per_s'] / rr:.2f}x |"
            )
    table = "\n".join(lines)
    print(table)
    if partial:
        return
    head = (
        f"{n:,} requests (Azure conversation lengths), Poisson arrivals at "
        f"{RATE_PER_REPLICA} req/s per replica; `vllm` with chunked prefill on Llama-3-8B/H100 "
        "replicas; with caching, synthetic prefix keys (256-token units, the first 1-3 shared "
        "within one of 2,000 skewed groups). Loop only (`simulate`); one fresh process per "
        "replica count and family, the routers' runs interleaved with round_robin's in it; "
        f"medians of {repeats} runs (caching off) and {cached_repeats} (caching on).\n"
    )
    record("Routers", ".venv/bin/python bench/router_speed.py", head + "\n" + table + "\n")


if __name__ == "__main__":
    main()
