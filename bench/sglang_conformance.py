"""The SGLang conformance table: SGLang's own admission code on the ``sglang`` policy's states.

    python bench/sglang_conformance.py          # the test suite's set (50-100 requests each)
    python bench/sglang_conformance.py --full   # 300 requests of the real traces each

Prints one markdown row per configuration (see docs/conformance.md): prefill
decisions and the batches among them, how many SGLang's ``PrefillAdder`` decided
the same way, decode steps and retractions, the decode steps whose
``new_token_ratio`` differs from SGLang's ``NewTokenRatioTracker``, and the wall
time (recording and SGLang's side). Needs the ``conformance`` extra and SGLang
(``--no-deps``), as ``scripts/test.sh`` installs them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.sglang_harness import (  # noqa: E402
    compare,
    configurations,
    fast_configurations,
    sglang_version,
)


def main() -> None:
    full = "--full" in sys.argv[1:]
    cfgs = configurations() if full else fast_configurations()
    print(
        f"SGLang {sglang_version()}, {'full' if full else 'test-suite'} set, {time.strftime('%F')}"
    )
    print()
    print(
        "| configuration | requests | KV tokens | decisions | batches | same as SGLang "
        "| decode steps | retractions | ratio differs | identical | s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for cfg in cfgs:
        o = compare(cfg)
        print(
            f"| `{cfg.name}` | {len(cfg.workload.prompt):,} | {cfg.kv_tokens:,} "
            f"| {o.decisions:,} | {o.admissions:,} | {o.same:,} | {o.decode_steps:,} "
            f"| {o.retractions:,} | {o.ratio_diffs} | {'yes' if o.identical else 'no'} "
            f"| {o.seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
