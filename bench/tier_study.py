"""KV offloading tiers on the Mooncake conversation trace: prefix hits per tier.

The trace (12,031 requests, 512-token chained prefix hashes) runs through
``kv_tiers.replay_hits``: one request at a time, a GPU prefix cache of
``GPU_BLOCKS`` blocks of 512 tokens, and a CPU tier of 0, 8, 64, 256 or
1024 GiB that follows vLLM's offloading manager (every computed block
offered, 16 blocks an offer, LRU eviction). KV bytes per token are
Llama-3-70B's (80 layers, 8 KV heads of 128, bf16: 327,680 bytes), the load
bandwidth PCIe 5.0 x16. The cache alone: no timing and no concurrency, so
no TTFT.

Run from the repository root:

    .venv/bin/python bench/tier_study.py
"""

from __future__ import annotations

import json
import sys
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


def main() -> None:
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
