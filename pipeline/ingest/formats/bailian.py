"""Alibaba Qwen Bailian usage traces: Mooncake-shaped JSONL with ``timestamp`` in
seconds (float), 16-token hash blocks, and ``chat_id``, ``parent_chat_id``,
``turn``, ``type`` for multi-turn conversations.
"""

from __future__ import annotations

from pipeline.ingest.formats import Block, Parsed, ParseOptions
from pipeline.ingest.formats.mooncake import parse_hashed

name = "bailian"
line_based = True
has_header = False
may_hold_text = True  # a JSON line may carry any extra field, a prompt too

BLOCK_SIZE = 16


def sniff(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return first.lstrip().startswith(b"{") and b'"hash_ids"' in first and b'"chat_id"' in first


def parse(block: Block, opts: ParseOptions) -> Parsed:
    return parse_hashed(block, opts, 1.0, BLOCK_SIZE)
