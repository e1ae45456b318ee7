"""Does splitting long from short requests protect the short ones? Shared vs split fleets.

The question (the replica-pools issue): on real public traces, does a fleet that
serves long-prompt traffic on pools of its own keep the chat traffic's p99 TTFT
(and TPOT) lower than one shared pool of the same GPUs, what does it cost in
GPUs, and when does it not pay?

Traffic: two real traces mixed into one requests file, each keeping its own
arrival times from its own start:

- tenant ``chat``: the Azure LLM conversation trace (2023), its first
  ``--window-s`` seconds (default: the whole hour);
- tenant ``batch``: the Mooncake conversation trace (Kimi, long prompts, with
  prefix block hashes), the same window, less the requests that do not fit the
  model's context (prompt + output > 32,768 tokens for Mistral-7B).
  ``--control``: the Azure trace's next window instead (nothing long).

Ingest gives these logs no tenant (neither format carries one), so the script
ingests them into a scratch warehouse, reads the rows back, sets ``tenant`` and
writes one requests Parquet file that the replays read (``requests_file``).

Load levels: the mixed trace time-scaled (``time_scale = 1 / load``), so load 2
is both tenants' traffic twice as fast, the same requests.

Layouts, each at a range of GPU counts (Mistral-7B, vLLM policy with chunked
prefill and prefix caching, its defaults; ``least_outstanding`` routers):

- ``shared``: one pool of N H100s;
- ``shared-lpt<T>``: the same with ``long_prefill_token_threshold`` T
  (``--thresholds``);
- ``split``: a chat pool (tenant chat) and a batch pool (tenant batch), H100s;
- ``split-l40s``: the same with the batch pool on L40S GPUs.

The pools of a fleet run independently (``pipeline/sim/pools.py``), so one
split replay with k replicas in each pool gives the chat pool's figures at k
and the batch pool's at k; the fewest GPUs of a split layout is then the
fewest chat replicas meeting chat's SLOs plus the fewest batch replicas
meeting batch's, and the chosen split is replayed once more as a fleet to
check. Figures per tenant are the fleet summary's ``classes``.

Everything prints as markdown tables; nothing is written to the repository
(docs/fleets.md holds the figures and what they say). Run from the repository
root (about 3 minutes on 2 cores):

    .venv/bin/python bench/fleet_split.py               # the study of docs/fleets.md
    .venv/bin/python bench/fleet_split.py --quick       # load x1, 300 s of each trace
    .venv/bin/python bench/fleet_split.py --window-s 1800 --loads 1,4 --control
    .venv/bin/python bench/fleet_split.py --batch-tpot-ms 100 --thresholds 512 --chat-ttft-ms 500
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import api  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces_raw"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"

MODEL_MAX_LEN = 32_768  # Mistral-7B's context (pipeline/sim/profiles/_models.json)
PROFILES = {"h100": "mistral-7b_h100-80gb_tp1", "l40s": "mistral-7b_l40s_tp1"}
# Assumed on-demand prices, dollars per GPU-hour (pipeline/pricing.py ships none;
# the H100 one is its docstring's example). Change them with --price-h100 / --price-l40s.
PRICES = {"h100": 2.49, "l40s": 0.99}
BASE = datetime(2024, 1, 1, tzinfo=UTC)  # the mixed trace's start (any day will do)


@dataclass(frozen=True)
class Slos:
    """The objectives, per tenant (seconds; batch_tpot None: no TPOT objective for batch)."""

    chat_ttft: float
    chat_tpot: float
    batch_ttft: float
    batch_tpot: float | None

    def describe(self) -> str:
        batch = f"p99 TTFT <= {self.batch_ttft:g} s"
        if self.batch_tpot is not None:
            batch += f" and p99 TPOT <= {self.batch_tpot * 1e3:.0f} ms"
        return (
            f"chat: p99 TTFT <= {self.chat_ttft * 1e3:.0f} ms and p99 TPOT <= "
            f"{self.chat_tpot * 1e3:.0f} ms; batch: {batch}"
        )

    def chat_ok(self, fig: dict[str, Any]) -> bool:
        return _le(fig.get("ttft_p99_s"), self.chat_ttft) and _le(
            fig.get("tpot_p99_s"), self.chat_tpot
        )

    def batch_ok(self, fig: dict[str, Any]) -> bool:
        return _le(fig.get("ttft_p99_s"), self.batch_ttft) and (
            self.batch_tpot is None or _le(fig.get("tpot_p99_s"), self.batch_tpot)
        )


def _le(v: float | None, limit: float) -> bool:
    return v is not None and v <= limit


def mixed_trace(out: Path, window_s: float, control: bool = False) -> dict[str, Any]:
    """Ingest both traces into a scratch warehouse, tag the tenants and write the mix.

    ``control``: the batch tenant is the Azure trace's next window instead of Mooncake
    (short prompts on both tenants: what a split does when nothing is long).
    """
    scratch = out / "ingest"
    shutil.rmtree(scratch, ignore_errors=True)
    counts = api.ingest([AZURE, MOONCAKE], warehouse=scratch)
    if not counts.ok:
        raise SystemExit(f"ingest failed: {counts.errors}")
    rows = api.query("SELECT * EXCLUDE (date) FROM requests", warehouse=scratch)
    parts = []
    facts: dict[str, Any] = {}
    sources = [("chat", "azure", 0.0), ("batch", "mooncake", 0.0)]
    if control:
        sources[1] = ("batch", "azure", window_s)
    for tenant, fmt, skip in sources:
        part = rows.filter(pl.col("source_format") == fmt)
        start = part["arrival_time"].min() + timedelta(seconds=skip)  # type: ignore[operator]
        offset = pl.col("arrival_time") - pl.lit(start)
        part = part.filter((offset >= timedelta(0)) & (offset < timedelta(seconds=window_s)))
        n_window = part.height
        fits = (pl.col("prompt_tokens") + pl.col("output_tokens")) <= MODEL_MAX_LEN
        part = part.filter(fits).with_columns(
            (pl.lit(BASE) + offset).alias("arrival_time"),
            pl.lit(tenant).alias("tenant"),
        )
        facts[tenant] = {
            "requests": part.height,
            "left_out_too_long": n_window - part.height,
            "rate": part.height / window_s,
            "prompt_mean": float(part["prompt_tokens"].mean()),  # type: ignore[arg-type]
            "prompt_p50": float(part["prompt_tokens"].median()),  # type: ignore[arg-type]
            "prompt_p99": float(part["prompt_tokens"].quantile(0.99)),  # type: ignore[arg-type]
            "output_mean": float(part["output_tokens"].mean()),  # type: ignore[arg-type]
        }
        parts.append(part)
    mixed = pl.concat(parts).sort("arrival_time", "request_id")
    mixed = mixed.with_columns(
        ((pl.col("arrival_time") - pl.lit(BASE)).dt.total_microseconds() / 1e6).alias("arrival_s")
    )
    path = out / "mixed.parquet"
    mixed.write_parquet(path)
    shutil.rmtree(scratch, ignore_errors=True)
    return {"path": path, **facts}


def scenarios(kind: str, counts: list[int]) -> list[dict[str, Any]]:
    """The scenario dicts of one layout at each replica count.

    ``shared``: one pool; ``shared-lpt<T>``: the same with vLLM's
    ``long_prefill_token_threshold`` = T (a long prompt takes at most T tokens of a
    step while others wait); ``split`` / ``split-l40s``: chat and batch pools of n each.
    """
    base = {"policy": "vllm", "router": "least_outstanding", "profile": PROFILES["h100"]}
    out = []
    for n in counts:
        if kind == "shared":
            out.append({**base, "name": f"shared-{n}", "replicas": n})
        elif kind.startswith("shared-lpt"):
            cap = int(kind.removeprefix("shared-lpt"))
            out.append(
                {**base, "name": f"{kind}-{n}", "replicas": n, "long_prefill_token_threshold": cap}
            )
        else:
            batch_profile = PROFILES["l40s" if kind == "split-l40s" else "h100"]
            out.append(pool_split(f"{kind}-{n}", n, n, batch_profile))
    return out


def pool_split(name: str, n_chat: int, n_batch: int, batch_profile: str) -> dict[str, Any]:
    """A fleet of a chat pool and a batch pool, by tenant."""
    return {
        "name": name,
        "policy": "vllm",
        "router": "least_outstanding",
        "profile": PROFILES["h100"],
        "pool": [
            {"name": "chat", "tenants": ["chat"], "replicas": n_chat},
            {
                "name": "batch",
                "tenants": ["batch"],
                "replicas": n_batch,
                "profile": batch_profile,
            },
        ],
    }


def per_tenant(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each tenant's figures of a replay's summary (its ``classes``)."""
    classes = summary.get("classes", {}).get("tenant", {})
    return {t: classes.get(t, {}) for t in ("chat", "batch")}


def run_load(path: Path, wh: Path, load: float, plan: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Replay every layout at each of its counts at one load; one row per scenario."""
    todo = [sc for kind, counts in plan.items() for sc in scenarios(kind, counts)]
    run = api.replay(todo, warehouse=wh, requests_file=path, intervals=False, time_scale=1.0 / load)
    rows = []
    for sc in todo:
        res = run.scenarios[sc["name"]]
        kind, n = sc["name"].rsplit("-", 1)
        tenants = per_tenant(res.summary.figures)
        rows.append({"load": load, "kind": kind, "n": int(n), **_flat(tenants)})
    return rows


def _flat(tenants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for t, fig in tenants.items():
        for key in ("ttft_p99_s", "tpot_p99_s", "ttft_p50_s", "completed", "num_requests"):
            out[f"{t}_{key}"] = fig.get(key)
    return out


def figures(row: dict[str, Any] | None, tenant: str) -> dict[str, Any]:
    if row is None:
        return {}
    return {k.removeprefix(f"{tenant}_"): v for k, v in row.items() if k.startswith(f"{tenant}_")}


def fewest(rows: list[dict[str, Any]], kind: str, ok: Any) -> int | None:
    """The fewest replicas of ``kind`` whose row passes ``ok``."""
    good = [r["n"] for r in rows if r["kind"] == kind and ok(r)]
    return min(good) if good else None


def answer(
    rows: list[dict[str, Any]], slos: Slos, prices: dict[str, float], kinds: list[str]
) -> list[dict[str, Any]]:
    """Per layout: the fewest GPUs meeting both tenants' SLOs, and their $/h."""
    out = []
    for kind in kinds:
        if kind.startswith("shared"):
            n = fewest(
                rows,
                kind,
                lambda r: slos.chat_ok(figures(r, "chat")) and slos.batch_ok(figures(r, "batch")),
            )
            usd = n * prices["h100"] if n else None
            out.append({"layout": kind, "chat": None, "batch": None, "gpus": n, "usd_h": usd})
            continue
        n1 = fewest(rows, kind, lambda r: slos.chat_ok(figures(r, "chat")))
        n2 = fewest(rows, kind, lambda r: slos.batch_ok(figures(r, "batch")))
        gpus = usd = None
        if n1 is not None and n2 is not None:
            gpus = n1 + n2
            usd = n1 * prices["h100"] + n2 * prices["l40s" if kind == "split-l40s" else "h100"]
        out.append({"layout": kind, "chat": n1, "batch": n2, "gpus": gpus, "usd_h": usd})
    return out


def equal_gpus(rows: list[dict[str, Any]], slos: Slos, totals: list[int]) -> list[dict[str, Any]]:
    """Both tenants' figures at equal H100 counts: each shared layout at N against the
    split of N that gives the batch pool the fewest replicas meeting its SLOs (at most
    N - 1) and chat the rest."""
    by = {(r["kind"], r["n"]): r for r in rows}
    shared = sorted({r["kind"] for r in rows if r["kind"].startswith("shared")})
    n2 = fewest(rows, "split", lambda r: slos.batch_ok(figures(r, "batch")))
    out = []
    for total in totals:
        if total < 2:
            continue
        b = min(n2 if n2 is not None else total - 1, total - 1)
        line: dict[str, Any] = {"gpus": total, "split": f"{total - b}+{b}"}
        for kind in shared:
            line[kind] = (
                figures(by.get((kind, total)), "chat"),
                figures(by.get((kind, total)), "batch"),
            )
        line["split_chat"] = figures(by.get(("split", total - b)), "chat")
        line["split_batch"] = figures(by.get(("split", b)), "batch")
        out.append(line)
    return out


def cell(b: dict[str, Any]) -> str:
    """One layout's fewest GPUs and $/h, as a table cell."""
    if not b["gpus"]:
        return "none in range"
    pools = "" if b["layout"].startswith("shared") else f"{b['chat']}+{b['batch']} = "
    return f"{pools}{b['gpus']} (${b['usd_h']:.2f})"


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:,.0f} ms" if v < 10 else f"{v:,.0f} s"


def table(head: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    out += ["| " + " | ".join(x) + " |" for x in lines]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=3600.0, help="seconds of each trace")
    ap.add_argument("--loads", default="0.25,0.5,1,2,4", help="time-scale multipliers of the mix")
    ap.add_argument(
        "--thresholds",
        default="512,2048",
        help="long_prefill_token_threshold values of the shared-lpt layouts ('' for none)",
    )
    ap.add_argument(
        "--chat-ttft-ms",
        default="500,250",
        help="chat p99 TTFT objectives, ms; the first drives the checks and equal-GPU table",
    )
    ap.add_argument("--chat-tpot-ms", type=float, default=100.0)
    ap.add_argument("--batch-ttft-s", type=float, default=10.0)
    ap.add_argument("--batch-tpot-ms", type=float, default=None, help="[none]")
    ap.add_argument("--price-h100", type=float, default=PRICES["h100"])
    ap.add_argument("--price-l40s", type=float, default=PRICES["l40s"])
    ap.add_argument("--quick", action="store_true", help="load 1 only, a 300 s window")
    ap.add_argument(
        "--control",
        action="store_true",
        help="batch = the Azure trace's next window (no long prompts); window <= 1800 s",
    )
    ap.add_argument("--out", type=Path, default=None, help="scratch folder [a temporary one]")
    args = ap.parse_args()
    loads = [1.0] if args.quick else [float(x) for x in args.loads.split(",")]
    window = 300.0 if args.quick else args.window_s
    tpot = args.batch_tpot_ms / 1e3 if args.batch_tpot_ms is not None else None
    slo_set = [
        Slos(float(x) / 1e3, args.chat_tpot_ms / 1e3, args.batch_ttft_s, tpot)
        for x in args.chat_ttft_ms.split(",")
    ]
    slos = slo_set[0]
    prices = {"h100": args.price_h100, "l40s": args.price_l40s}
    out = args.out or Path(tempfile.mkdtemp(prefix="fleet-split-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mix = mixed_trace(out, window, args.control)
    what = "chat: Azure's first, batch: its next" if args.control else "the first of each trace"
    print(
        f"mixed trace: {window:.0f} s, {what}; Mistral-7B, vllm (chunked "
        "prefill, budget 8192, prefix caching), least_outstanding"
    )
    for t in ("chat", "batch"):
        f = mix[t]
        print(
            f"  {t}: {f['requests']:,} requests ({f['rate']:.2f} req/s at load 1), prompt "
            f"mean/p50/p99 {f['prompt_mean']:,.0f}/{f['prompt_p50']:,.0f}/{f['prompt_p99']:,.0f}"
            f", output mean {f['output_mean']:,.0f}; {f['left_out_too_long']} left out as "
            f"longer than {MODEL_MAX_LEN:,} tokens"
        )
    for one in slo_set:
        print(f"SLOs: {one.describe()}")
    print(f"prices ($/GPU-h, assumed): {prices}")
    lpt = [f"shared-lpt{int(x)}" for x in args.thresholds.split(",") if x.strip()]
    kinds = ["shared", *lpt, "split", "split-l40s"]
    wh = out / "warehouse"
    headline: list[list[str]] = []
    for load in loads:
        top = max(8, math.ceil(3 * load) + 4)
        h100 = list(range(1, top + 1))
        plan = {k: h100 for k in kinds if k != "split-l40s"}
        plan["shared"] = list(range(1, 2 * top + 1))  # plain chunking needs many more
        plan["split-l40s"] = list(range(1, 3 * top + 1))  # an L40S prefills ~2.7x slower
        t1 = time.perf_counter()
        rows = run_load(mix["path"], wh, load, plan)
        print(f"\n## load x{load:g}: {len(rows)} replays in {time.perf_counter() - t1:.0f} s")
        print(
            table(
                [
                    "layout",
                    "replicas",
                    "chat TTFT p99",
                    "chat TPOT p99",
                    "batch TTFT p99",
                    "batch TPOT p99",
                ],
                [
                    [
                        r["kind"],
                        str(r["n"]) if r["kind"].startswith("shared") else f"{r['n']}+{r['n']}",
                        ms(r["chat_ttft_p99_s"]),
                        ms(r["chat_tpot_p99_s"]),
                        ms(r["batch_ttft_p99_s"]),
                        ms(r["batch_tpot_p99_s"]),
                    ]
                    for r in rows
                    if r["n"] <= top or r["n"] % 2 == 0
                ],
            )
        )
        for one in slo_set:
            headline.append(
                [f"x{load:g}", ms(one.chat_ttft)]
                + [cell(b) for b in answer(rows, one, prices, kinds)]
            )
        best = answer(rows, slos, prices, kinds)
        print(f"\nfewest GPUs meeting both tenants' SLOs ({slos.describe()}):")
        print(
            table(
                ["layout", "chat pool", "batch pool", "GPUs", "$/h"],
                [
                    [
                        b["layout"],
                        "-" if b["layout"].startswith("shared") else str(b["chat"] or "none"),
                        "-" if b["layout"].startswith("shared") else str(b["batch"] or "none"),
                        str(b["gpus"]) if b["gpus"] else "none in range",
                        f"{b['usd_h']:.2f}" if b["usd_h"] else "-",
                    ]
                    for b in best
                ],
            )
        )
        check = [b for b in best if not b["layout"].startswith("shared") and b["gpus"]]
        if check:
            verify(mix["path"], wh, load, check, slos)
        eq = equal_gpus(rows, slos, h100)
        shared = [k for k in kinds if k.startswith("shared")]
        print(
            "\nat equal H100 counts, p99 TTFT chat / batch (split: batch the fewest meeting "
            "its SLO):"
        )
        print(
            table(
                ["GPUs", *shared, "split", "split chat", "split batch", "split chat TPOT p99"],
                [
                    [
                        str(e["gpus"]),
                        *(
                            f"{ms(e[k][0].get('ttft_p99_s'))} / {ms(e[k][1].get('ttft_p99_s'))}"
                            for k in shared
                        ),
                        e["split"],
                        ms(e["split_chat"].get("ttft_p99_s")),
                        ms(e["split_batch"].get("ttft_p99_s")),
                        ms(e["split_chat"].get("tpot_p99_s")),
                    ]
                    for e in eq
                ],
            )
        )
    print(
        "\n## fewest GPUs meeting both tenants' SLOs, per load and chat p99 TTFT objective "
        f"(chat p99 TPOT <= {ms(slos.chat_tpot)}, batch p99 TTFT <= {slos.batch_ttft:g} s; "
        "split: chat + batch pools; $/h at the assumed prices)"
    )
    print(table(["load", "chat TTFT p99 <=", *kinds], headline))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


def verify(path: Path, wh: Path, load: float, best: list[dict[str, Any]], slos: Slos) -> None:
    """Replay each chosen split as one fleet: its tenants must meet their SLOs."""
    todo = [
        pool_split(
            f"check-{b['layout']}",
            b["chat"],
            b["batch"],
            PROFILES["l40s" if b["layout"] == "split-l40s" else "h100"],
        )
        for b in best
    ]
    run = api.replay(todo, warehouse=wh, requests_file=path, intervals=False, time_scale=1.0 / load)
    for sc in todo:
        figs = run.scenarios[sc["name"]].summary.figures
        tenants = per_tenant(figs)
        chat, batch = tenants["chat"], tenants["batch"]
        ok = slos.chat_ok(chat) and slos.batch_ok(batch)
        pools = figs.get("pools", {})
        print(
            f"  check {sc['name']} ({pools['chat']['replicas']}+{pools['batch']['replicas']}): "
            f"chat TTFT/TPOT p99 {ms(chat.get('ttft_p99_s'))}/{ms(chat.get('tpot_p99_s'))}, "
            f"batch {ms(batch.get('ttft_p99_s'))}/{ms(batch.get('tpot_p99_s'))}: "
            f"{'meets' if ok else 'MISSES'} the SLOs"
        )


if __name__ == "__main__":
    main()
