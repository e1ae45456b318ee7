"""Probe designs: the step shapes ``calibrate live`` times, per kind of machine.

* prefill ``batch x prompt``: ``batch`` prompts of ``prompt`` tokens, one output token
  each: the step is exactly that prefill; repeated ``warmup + repeats`` times;
* decode ``batch x context``: ``batch`` prompts of ``context - 1`` tokens generating
  ``1 + warmup + repeats`` tokens: after the prefill, the decode steps read contexts
  ``context``, ``context + 1``, ...; the first ``warmup`` are dropped.
* mixed ``decodes x context + prompt``: ``decodes`` requests decoding at about
  ``context``, then one prompt of ``prompt`` tokens released into them: the step is those
  decodes plus that prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

DECODE_CONTEXT_SLACK = 2  # prompt c - 1, then contexts c .. c + warmup + repeats
MIXED_DECODE_TOKENS = 120  # what the decodes of a mixed probe generate (they outlast it)


@dataclass(frozen=True)
class ProbeDesign:
    """The step shapes to time."""

    prefill_tokens: tuple[int, ...] = (8, 32, 64, 128, 256, 512)
    prefill_batches: tuple[int, ...] = (1, 2, 4)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_contexts: tuple[int, ...] = (16, 128, 512, 1024)
    repeats: int = 5
    warmup: int = 1
    max_batch_tokens: int = 2048  # prefill shapes above it are left out
    rounds: int = 3  # passes over all the shapes; a row is the median of every repeat
    # mixed steps: decodes of (batch, context) plus one prompt chunk of these sizes
    mixed_batches: tuple[int, ...] = (1, 4, 16)
    mixed_contexts: tuple[int, ...] = (128, 512)
    mixed_prompts: tuple[int, ...] = (32, 128, 512)

    def prefill_shapes(self) -> list[tuple[int, int]]:
        return [
            (b, p)
            for p in self.prefill_tokens
            for b in self.prefill_batches
            if b * p <= self.max_batch_tokens
        ]

    def mixed_shapes(self) -> list[tuple[int, int, int]]:
        return [
            (b, c, p)
            for b in self.mixed_batches
            for c in self.mixed_contexts
            for p in self.mixed_prompts
            if b + p <= self.max_batch_tokens
        ]

    def decode_shapes(self) -> list[tuple[int, int]]:
        return [(b, c) for c in self.decode_contexts for b in self.decode_batches]

    def kv_tokens(self) -> int:
        """KV-cache tokens the largest shape needs."""
        decode = max(
            (b * (c + self.warmup + self.repeats + DECODE_CONTEXT_SLACK))
            for b, c in self.decode_shapes()
        )
        prefill = max(b * (p + 1) for b, p in self.prefill_shapes())
        mixed = max(
            (b * (c + MIXED_DECODE_TOKENS) + p + 1 for b, c, p in self.mixed_shapes()), default=0
        )
        return max(decode, prefill, mixed)


DESIGNS: dict[str, ProbeDesign] = {
    # CPU with a tiny or small model: seconds to minutes
    "cpu": ProbeDesign(),
    # a quick check (tests)
    "smoke": ProbeDesign(
        prefill_tokens=(8, 64),
        prefill_batches=(1, 2),
        decode_batches=(1, 4),
        decode_contexts=(16, 64),
        repeats=3,
        warmup=1,
        max_batch_tokens=256,
        rounds=1,
        mixed_batches=(2,),
        mixed_contexts=(32,),
        mixed_prompts=(16, 64),
    ),
    # a GPU with a 7-8B model: shapes that fill its compute and memory bandwidth
    "gpu": ProbeDesign(
        prefill_tokens=(16, 64, 256, 512, 1024, 2048, 4096),
        prefill_batches=(1, 2, 4),
        decode_batches=(1, 4, 16, 32, 64, 128),
        decode_contexts=(128, 512, 1024, 2048),
        repeats=5,
        warmup=2,
        max_batch_tokens=8192,
        rounds=2,
        mixed_batches=(4, 32),
        mixed_contexts=(512, 2048),
        mixed_prompts=(256, 2048),
    ),
}
