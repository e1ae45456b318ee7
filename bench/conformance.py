"""The conformance table: vLLM's own scheduler against the simulator's ``vllm`` policy.

    python bench/conformance.py          # the configurations the test suite runs
    python bench/conformance.py --full   # 2,000 requests of the real Azure trace, 1,500 blocks
    python bench/conformance.py --spec   # speculative decoding (docs/replay.md)

Prints one markdown row per configuration (see docs/conformance.md): steps and
preemptions on each side, the prompt tokens each found in its prefix cache
(first lookups, as a share of all prompt tokens; "-" without caching), the
largest and mean TTFT / E2E difference per request, and the wall time of both
sides (after a warm-up that imports vLLM and compiles the simulator). Needs the
``conformance`` extra and vLLM (``--no-deps``), as ``scripts/test.sh`` installs them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.harness import (  # noqa: E402
    Config,
    Request,
    compare,
    configurations,
    speculative_configurations,
    vllm_version,
)


def main() -> None:
    full = "--full" in sys.argv[1:]
    spec = "--spec" in sys.argv[1:]
    compare(Config("warm-up", [Request(0.0, [1] * 40, 3)], 100))  # import vLLM, compile numba
    which = "speculative" if spec else "full" if full else "test-suite"
    print(f"vLLM {vllm_version()}, {which} set, {time.strftime('%F')}")
    print()
    print(
        "| configuration | requests | KV blocks | steps vLLM / sim | preemptions vLLM / sim "
        "| prefix hits vLLM / sim | TTFT diff max / mean | E2E diff max / mean | identical | s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for cfg in speculative_configurations() if spec else configurations(full):
        t0 = time.perf_counter()
        c = compare(cfg)
        wall = time.perf_counter() - t0
        hits = "-"
        if cfg.enable_prefix_caching:
            total = c.prompt_tokens
            hits = f"{c.vllm_hit_tokens / total:.1%} / {c.sim_hit_tokens / total:.1%}"
        print(
            f"| `{cfg.name}` | {len(cfg.requests):,} | {cfg.num_blocks:,} "
            f"| {c.vllm_steps:,} / {c.sim_steps:,} | {c.vllm_preemptions} / {c.sim_preemptions} "
            f"| {hits} "
            f"| {c.ttft_max_s:.3g} / {c.ttft_mean_s:.3g} s "
            f"| {c.e2e_max_s:.3g} / {c.e2e_mean_s:.3g} s "
            f"| {'yes' if c.identical else f'no (step {c.first_divergence})'} | {wall:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
