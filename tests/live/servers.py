"""Real servers for the HTTP engine's tests: started as subprocesses on free local ports.

``token_server``: pipeline.live.token_server (tokens at known times, exact counts).
``transformers_server``: `transformers serve` on CPU with a tiny random Llama and a
word-level tokenizer built offline here (nothing is downloaded).
``scripted_server``: in this process, a listener that answers each path with exactly the
bytes it is given (a misbehaving server: bad JSON, bad HTTP, a stream that never ends).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.extras import require

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "po", "se", "vi", "zu"]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(cmd: list[str], url: str, ready_path: str, timeout_s: float) -> Iterator[str]:
    """Start ``cmd``, wait until ``url + ready_path`` answers 200, stop it afterwards."""
    httpx = require("httpx")  # polls the server until it is ready
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # the server's output goes to a file: an unread pipe fills up and stalls a chatty server
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                out = log.read().decode(errors="replace")
                raise RuntimeError(f"{cmd[:3]} exited with {proc.returncode}:\n{out[-3000:]}")
            try:
                if httpx.get(url + ready_path, timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[:3]} not ready at {url} after {timeout_s} s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.environ.get("TRACEREPLAY_TEST_SERVER_LOG"):
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
        log.close()


@contextmanager
def token_server(
    ttft_s: float = 0.02,
    itl_s: float = 0.01,
    stop_after: int | None = None,
    close_after_answer: bool = False,
) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "pipeline.live.token_server", "--port", str(port)]
    cmd += ["--ttft", str(ttft_s), "--itl", str(itl_s)]
    if stop_after is not None:
        cmd += ["--stop-after", str(stop_after)]
    if close_after_answer:
        cmd.append("--close-after-answer")
    with running(cmd, f"http://127.0.0.1:{port}", "/stats", 30) as url:
        yield url


def make_tokenizer(out: Path) -> Path:
    """A 104-token word-level tokenizer (100 two-syllable words, BOS added) in ``out``."""
    require("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    out.mkdir(parents=True, exist_ok=True)
    words = [a + b for a in SYLLABLES for b in SYLLABLES]
    vocab = {t: i for i, t in enumerate(SPECIAL + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by spaces
    tok.add_special_tokens(SPECIAL)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 512,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out / "tokenizer.json"


def make_bpe_tokenizer(out: Path) -> Path:
    """A byte-level BPE (GPT-2 / Llama 3 style, 600 tokens, BOS added) trained here."""
    import random

    require("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(300)
    ]
    text = [" ".join(rng.choice(words) for _ in range(50)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=600, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


def make_tiny_model(out: Path) -> Path:
    """A random 2-layer Llama beside the tokenizer of ``make_tokenizer``, saved to ``out``."""
    require("torch")
    require("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    make_tokenizer(out)
    vocab_size = len(SPECIAL) + len(SYLLABLES) ** 2
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


@contextmanager
def transformers_server(model_dir: Path) -> Iterator[str]:
    port = free_port()
    exe = Path(sys.executable).parent / "transformers"
    cmd = [str(exe), "serve", str(model_dir), "--device", "cpu", "--host", "127.0.0.1"]
    cmd += ["--port", str(port)]
    with running(cmd, f"http://127.0.0.1:{port}", "/health", 120) as url:
        yield url


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found"
HANG = b"\0hang\0"  # a reply part that stalls: nothing more is sent until the server stops

Reply = bytes | list[bytes]  # the whole answer, or its parts (HANG among them)


def sse_reply(*events: bytes | str, chunked: bool = False) -> bytes:
    """An HTTP 200 event stream: each event sent as ``data: <event>\\n\\n``, except one
    that already is an SSE line of another kind (``: comment``, ``event: ...``)."""
    parts = []
    for e in events:
        line = e.encode() if isinstance(e, str) else e
        raw = line.startswith((b":", b"event:"))
        parts.append((line if raw else b"data: " + line) + b"\n\n")
    body = b"".join(parts)
    if chunked:
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        return head + (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def json_reply(value: object | bytes, status: int = 200) -> bytes:
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n" % (status, len(body)) + body


@dataclass
class Scripted:
    """What a scripted server was asked: (method, path) of every request, in order."""

    url: str
    requests: list[tuple[str, str]] = field(default_factory=list)

    def count(self, path: str) -> int:
        return sum(1 for _, p in self.requests if p == path)


@contextmanager
def scripted_server(routes: Mapping[str, Reply]) -> Iterator[Scripted]:
    """A listener (a thread of this process) answering ``routes[path]`` byte for byte.

    Each connection takes one request (its body read by content-length), gets the reply
    and is closed. A path not in ``routes`` answers 404. A reply given as parts is sent
    part by part; a ``HANG`` part stalls the answer until the server stops.
    """
    ready = threading.Event()
    port = free_port()
    held: dict[str, Any] = {}
    seen = Scripted(f"http://127.0.0.1:{port}")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, path = head.split(b" ", 2)[:2]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            seen.requests.append((method.decode(), path.decode()))
            reply = routes.get(path.decode(), NOT_FOUND)
            for part in [reply] if isinstance(reply, bytes) else reply:
                if part == HANG:
                    await held["stop"].wait()
                    break
                writer.write(part)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        held["loop"], held["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with await asyncio.start_server(answer, "127.0.0.1", port):
            ready.set()
            await held["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield seen
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(10)
