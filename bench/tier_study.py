"""KV offloading tiers on the Mooncake conversation trace: prefix hits per tier.

The trace (12,031 requests, 512-token chained prefix hashes) runs through
``kv_tiers.replay_hits``: one request at a time, a GPU prefix cache of
``GPU_BLOCKS`` blocks of 512 tokens, and a CPU tier of 0, 8, 64, 256 or
1024 GiB that follows vLLM's offloading manager (every computed block
offered, 16 blocks an offer, LRU eviction). KV bytes per token are
Llama-3-70B's (80 layers, 8 KV heads of 128, bf16: 327,680 bytes), the load
bandwidth PCIe 5.0 x16. The cache alone: no timing and no concurrency, so
no TTFT.

``--replay``: the same trace replayed by the vllm policy with the CPU tier in
the loop (``kv_offloading_size_gb`` 0, 8 and 64), Llama-3-70B on 8 H200s at a
quarter of the trace's rate (bench/prefix_cache.py's scenario), with the
profile's KV cache and with one shrunk to ``--gpu-blocks`` blocks of 16 tokens:
GPU and CPU-tier hit shares of prompt tokens, TTFT p50 and p99, the GB loaded,
and the seconds ``simulate`` took (the median of its second to fourth runs: the first compiles).

Run from the repository root:

    .venv/bin/python bench/tier_study.py
    .venv/bin/python bench/tier_study.py --replay
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.sim.kv_tiers import num_chunks, replay_hits  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces_raw" / "mooncake" / "conversation_trace.jsonl"
BLOCK_TOKENS = 512
BYTES_PER_TOKEN = 2 * 80 * 8 * 128 * 2  # Llama-3-70B, K and V, bf16
BYTES_PER_BLOCK = BLOCK_TOKENS * BYTES_PER_TOKEN
GPU_BLOCKS = 1_000  # bench/prefix_cache.py's smallest cache: 512k tokens
CPU_GIB = [0, 8, 64, 256, 1024]


def replay(gpu_blocks: int) -> None:
    """The loop's tiers: hit shares, TTFT and the bytes loaded at 0, 8 and 64 GiB."""
    import tempfile

    from pipeline.contracts import REQUESTS
    from pipeline.ingest import IngestOptions, ingest_logs
    from pipeline.sim.replay_input import prepare, read_requests
    from pipeline.sim.scenario import build_scenario
    from pipeline.sim.simulate import simulate
    from pipeline.sim.summary import summarize
    from pipeline.warehouse import Warehouse

    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse(Path(tmp) / "wh")
        ingest_logs([str(MOONCAKE)], wh, IngestOptions(quiet=True))
        frame = read_requests(wh.files(REQUESTS))
    base = {"policy": "vllm", "profile": "llama-3-70b_h200_tp8", "max_model_len": 131072}
    base |= {"time_scale": 4.0, "block_size": 16}
    print(
        "| GPU KV blocks | CPU tier | GPU hit | CPU hit | TTFT p50 s | TTFT p99 s | loaded GB "
        "| loop s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for blocks in (None, gpu_blocks):
        for gib in (0, 8, 64):
            values = {**base, "kv_offloading_size_gb": float(gib)}
            if blocks is not None:
                values["num_gpu_blocks"] = blocks
            sc = build_scenario(values)
            inp = prepare(frame, sc).inp
            eng = sc.engine()
            simulate(inp, eng)  # compiles, warms
            times = []
            for _ in range(3):  # the median of three: the machine may be shared
                t = time.perf_counter()
                res = simulate(inp, eng)
                times.append(time.perf_counter() - t)
            loop_s = statistics.median(times)
            s = summarize(res)
            tiers = s.get("kv_tiers") or {}
            prompt = float(inp.prompt_tokens.sum())
            gpu_hit = s["prefix_token_hit_rate"] or 0.0
            cpu = tiers.get("cpu_hit_tokens", 0) / prompt
            print(
                f"| {sc.num_kv_blocks} | {gib} GiB | {gpu_hit:.1%} | {cpu:.1%} | "
                f"{s['ttft_p50_s']:.2f} | {s['ttft_p99_s']:.2f} | "
                f"{tiers.get('tier_load_bytes', 0) / 1e9:.0f} | {loop_s:.2f} |",
                flush=True,
            )


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", action="store_true", help="the replay loop's tiers, with TTFT")
    ap.add_argument("--gpu-blocks", type=int, default=8000)
    args = ap.parse_args()
    if args.replay:
        replay(args.gpu_blocks)
        return
    prompts = []
    with MOONCAKE.open() as f:
        for line in f:
            r = json.loads(line)
            prompts.append(([h.to_bytes(8, "little") for h in r["hash_ids"]], r["input_length"]))
    total = sum(t for _, t in prompts)
    print(f"{len(prompts)} requests, {total} prompt tokens, GPU {GPU_BLOCKS} blocks of 512")
    print("| CPU tier | chunks | GPU hit | CPU hit | total hit | loaded GB | load s |")
    print("|---|---|---|---|---|---|---|")
    for gib in CPU_GIB:
        n = num_chunks(gib, BYTES_PER_BLOCK, 1)
        st = replay_hits(prompts, GPU_BLOCKS, n, 0, BLOCK_TOKENS, BYTES_PER_BLOCK)
        hit = st.gpu_tokens + st.cpu_tokens
        print(
            f"| {gib} GiB | {n} | {st.gpu_tokens / total:.1%} | {st.cpu_tokens / total:.1%} "
            f"| {hit / total:.1%} | {st.load_bytes / 1e9:.0f} | {st.load_s:.1f} |"
        )


if __name__ == "__main__":
    main()
