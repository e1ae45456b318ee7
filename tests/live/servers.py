"""Real servers for the HTTP engine's tests: started as subprocesses on free local ports.

``token_server``: pipeline.live.token_server (tokens at known times, exact counts).
``transformers_server``: `transformers serve` on CPU with a tiny random Llama and a
word-level tokenizer built offline here (nothing is downloaded).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "po", "se", "vi", "zu"]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(cmd: list[str], url: str, ready_path: str, timeout_s: float) -> Iterator[str]:
    """Start ``cmd``, wait until ``url + ready_path`` answers 200, stop it afterwards."""
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
