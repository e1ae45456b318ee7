"""The HTTP engine: replay a batch against an OpenAI-compatible server, open loop.

Every request is sent at its arrival time (``LiveBatch.arrival_s``), whether or not the
earlier ones have finished, as a streaming ``POST /v1/completions`` whose prompt has the
logged length and whose ``max_tokens`` is the logged output length. What the server
accepts decides the rest (``ServerCaps``):

    kind          prompt          exact output length through
    vllm, sglang  token ids       ignore_eos + min_tokens
    transformers  text            generation_config {"min_new_tokens": n}
    tgi, openai   text            nothing (a short answer is recorded as an error)

Text prompts are built with the served model's tokenizer (a ``tokenizer.json``) to encode
to exactly the logged length, special tokens included. Every prompt is different, so a
prefix cache finds nothing that the trace did not share.

Timing follows vLLM's benchmark client (benchmarks/backend_request_func.py): a token
arrives with the first chunk whose text is not empty; each later non-empty chunk adds one
inter-token gap; the request ends with its last non-empty chunk. TTFT here is measured
from the request's arrival time (the same zero as the simulator), so a client that sends
late counts against the server; ``sent_s - arrival_s`` says how late it was.

At most ``max_in_flight`` requests are open at once (a request past the limit waits in
the client, and its ``sent_s`` says when it left); each has ``timeout_s`` from sending to
its last chunk. A failure (refused connection, HTTP error, timeout, error chunk, short
answer) is recorded with its reason; nothing is dropped. While requests run, the server's
``/metrics`` (when it has one) and the client's own in-flight and waiting counts are
sampled every ``metrics_interval_s``.

Whatever a server sends fails that request alone, with a reason, never the run and never
as a success: the stream is read by ``pipeline.live.stream`` (bounded JSON, checked
fields), a request with no token streamed is a failure, and any exception left is caught
at the request. Before anything is sent, a request whose prompt and output exceed the
engine's max model length (``--max-model-len``, else the ``max_model_len`` of the server's
``/v1/models``, else ``DEFAULT_MAX_MODEL_LEN``) is refused with its reason, so no prompt
past it is ever built, and a schedule that would sleep longer than ``max_wait_s`` at once
is refused as a whole.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError
from pipeline.live import stream
from pipeline.live.metrics import extract
from pipeline.live.stream import MAX_COUNT, loads_bounded
from pipeline.live.types import LiveBatch, LiveResult, longest_wait
from pipeline.live.wire import StreamingClient

KINDS = ("auto", "vllm", "sglang", "tgi", "transformers", "openai")
CLIENTS = ("asyncio", "httpx")
PREBUILD_BYTES = 256 * 2**20  # request bodies built before the replay starts, at most
SPIN_S = 0.0015  # the dispatcher sleeps until this long before a send, then yields until it
ERROR_BODY_CHARS = 200
ERROR_BODY_BYTES = 64 * 2**10  # of an error answer's body, read at most
ANSWER_BYTES = 4 * 2**20  # of a /v1/models or /info answer, read at most
METRICS_BYTES = 32 * 2**20  # of one /metrics scrape
# prompt + output tokens of one request when neither --max-model-len nor the server says
DEFAULT_MAX_MODEL_LEN = 2**20
MAX_WAIT_S = 300.0  # the longest sleep between arrivals, by default


@dataclass(frozen=True)
class ServerCaps:
    """What a server accepts, and so what the client sends."""

    kind: str
    token_prompts: bool  # prompt may be a list of token ids
    ignore_eos: bool  # ignore_eos and min_tokens are honoured
    generation_config: bool  # transformers serve: a generation_config JSON string
    metrics: bool  # GET /metrics answers in Prometheus text
    model: str | None = None  # the "model" field to send (None: leave it out)
    max_model_len: int | None = None  # prompt + output tokens, as the server reports it


CAPS = {
    "vllm": ServerCaps("vllm", True, True, False, True),
    "sglang": ServerCaps("sglang", True, True, False, True),
    "tgi": ServerCaps("tgi", False, False, False, True),
    "transformers": ServerCaps("transformers", False, False, True, False),
    "openai": ServerCaps("openai", False, False, False, False),
}


@dataclass(frozen=True)
class HttpOptions:
    base_url: str
    server_kind: str = "auto"
    model: str | None = None
    max_in_flight: int = 256
    timeout_s: float = 600.0
    tokenizer: Path | None = None
    metrics_interval_s: float = 0.5
    client: str = "asyncio"  # the requests' HTTP client: pipeline.live.wire, or httpx
    max_model_len: int | None = None  # prompt + output tokens (None: as the server says)
    max_wait_s: float = MAX_WAIT_S  # the longest sleep between arrivals

    def __post_init__(self) -> None:
        url = urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(
                f"--base-url {self.base_url!r}: expected http://HOST:PORT or https://HOST:PORT"
            )
        # the server's root: endpoints are /v1/..., so a URL given with /v1 loses it
        root = self.base_url.rstrip("/").removesuffix("/v1")
        object.__setattr__(self, "base_url", root)
        if self.client not in CLIENTS:
            raise ConfigError(f"--client {self.client!r}: expected one of {', '.join(CLIENTS)}")
        if self.server_kind not in KINDS:
            raise ConfigError(
                f"--server-kind {self.server_kind!r}: expected one of {', '.join(KINDS)}"
            )
        if not 1 <= self.max_in_flight <= 100_000:
            raise ConfigError(f"--max-in-flight {self.max_in_flight}: must be 1 to 100000")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(
                f"--timeout-s {self.timeout_s}: must be a finite number of seconds, more than 0"
            )
        if not (math.isfinite(self.metrics_interval_s) and self.metrics_interval_s > 0):
            raise ConfigError(
                f"--metrics-interval-s {self.metrics_interval_s}: must be a finite number of "
                "seconds, more than 0"
            )
        if self.max_model_len is not None and not 2 <= self.max_model_len <= MAX_COUNT:
            raise ConfigError(
                f"--max-model-len {self.max_model_len}: must be 2 to {MAX_COUNT} tokens"
            )
        if not self.max_wait_s > 0:  # inf: no bound
            raise ConfigError(f"--max-gap-s {self.max_wait_s}: must be more than 0 seconds")


# --- prompts ---------------------------------------------------------------------------


class TextPrompts:
    """Texts that encode to an exact number of tokens with one tokenizer.json.

    The text is words of the vocabulary that stay one token each when joined by spaces,
    drawn at random per request (so prompts share no prefix), then trimmed or extended
    until the encoding, special tokens included, has the asked length.
    """

    def __init__(self, path: Path, *, max_words: int = 512) -> None:
        from tokenizers import Tokenizer

        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise ConfigError(
                f"--tokenizer {path}: not a tokenizers tokenizer.json ({exc}); pass the "
                "tokenizer.json of the served model"
            ) from None
        self.path = path
        self.num_special = len(self.tok.encode("", add_special_tokens=True).ids)
        self.words = self._single_token_words(max_words)
        if not self.words:
            raise ConfigError(f"--tokenizer {path}: found no word that encodes to one token")

    def _single_token_words(self, limit: int) -> list[str]:
        special = set(self.tok.get_added_tokens_decoder())
        words: list[str] = []
        seen: set[str] = set()
        for tid in range(self.tok.get_vocab_size()):
            if tid in special:
                continue
            word = self.tok.decode([tid]).strip()
            if not word.isalnum() or word in seen:
                continue
            seen.add(word)
            if self._count(f"{word} {word} {word}") == 3:
                words.append(word)
                if len(words) >= limit:
                    break
        return words

    def _count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def build(
        self, seed: int, num_tokens: int, hashes: Sequence[int] = (), block_size: int = 0
    ) -> str:
        """A text of exactly ``num_tokens`` tokens (special tokens included).

        Its first full blocks follow ``hashes`` (see ``shared_blocks``); the rest is drawn
        from ``seed``.

        Raises:
            ConfigError: the length cannot be reached (shorter than the special tokens).
        """
        want = num_tokens - self.num_special
        if want < 0:
            raise ConfigError(
                f"a prompt of {num_tokens} tokens is shorter than the {self.num_special} "
                f"special tokens {self.path} adds"
            )
        vocab = len(self.words)
        head = [self.words[j] for j in shared_blocks(hashes, block_size, want, vocab)]
        pick = np.random.default_rng([seed, 1]).integers(0, vocab, size=want - len(head) + 8)
        words = head + [self.words[j] for j in pick]
        k = want
        for _ in range(8):  # joined single-token words nearly always count exactly
            got = self._count(" ".join(words[:k]))
            if got == want:
                return " ".join(words[:k])
            k = max(len(head), min(len(words), k + want - got))
        raise ConfigError(
            f"cannot build a text of exactly {num_tokens} tokens with {self.path}; use a "
            "server that takes token ids"
        )


@lru_cache(maxsize=8192)
def _block(prefix_hash: int, block_size: int, vocab: int) -> npt.NDArray[np.int64]:
    return np.random.default_rng([prefix_hash, 0]).integers(0, vocab, size=block_size)


def shared_blocks(
    hashes: Sequence[int], block_size: int, limit: int, vocab: int
) -> npt.NDArray[np.int64]:
    """Draws in [0, vocab) for the full blocks of ``hashes`` that fit in ``limit`` tokens.

    A block's draws depend on its (chained) hash alone, so requests whose prompts shared a
    prefix in the trace share these tokens, and a server's prefix cache can hit as it did.
    """
    fit = min(len(hashes), limit // block_size) if block_size > 0 else 0
    if fit == 0:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([_block(int(h), block_size, vocab) for h in hashes[:fit]])


def token_prompt(
    seed: int, num_tokens: int, hashes: Sequence[int] = (), block_size: int = 0
) -> list[int]:
    """Token ids 100..1099 for a server that takes ids: shared blocks, then per request."""
    head = shared_blocks(hashes, block_size, num_tokens, 1000)
    tail = np.random.default_rng([seed, 1]).integers(0, 1000, size=num_tokens - len(head))
    return (100 + np.concatenate([head, tail])).tolist()


def request_body(caps: ServerCaps, prompt: str | list[int], output_tokens: int) -> bytes:
    """The JSON body of one streaming completion request."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": int(output_tokens), "stream": True}
    if caps.model is not None:
        body["model"] = caps.model
    if caps.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = int(output_tokens)
        body["stream_options"] = {"include_usage": True}
    if caps.generation_config:
        n = int(output_tokens)
        body["generation_config"] = json.dumps(
            {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False}
        )
    return json.dumps(body).encode()


# --- detection -------------------------------------------------------------------------


async def detect(client: Any, opts: HttpOptions) -> ServerCaps:
    """The server's capabilities: from --server-kind, else from /metrics, /v1/models, probes.

    Any JSON shape from /v1/models is taken: entries that are not objects, ids and owners
    that are not strings, lengths that are not counts are left out (and the model name,
    the kind or the length then come from elsewhere).

    Raises:
        ConfigError: the server cannot be reached or answers no completion request.
    """
    import httpx

    model = opts.model
    if opts.server_kind != "auto":
        caps = replace(CAPS[opts.server_kind], model=model)
        try:
            listed = _models(await _get_json(client, "/v1/models"))
        except httpx.HTTPError:
            listed = []
        return await _with_length(client, caps, listed)
    try:
        status, body = await _get_bounded(client, "/metrics", METRICS_BYTES)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"cannot reach {opts.base_url} ({type(exc).__name__}: {exc}); is the server up? "
            "Give --server-kind to skip detection"
        ) from None
    try:  # some servers fail here (transformers 5.20 without a model cache: HTTP 500)
        listed = _models(await _get_json(client, "/v1/models"))
    except httpx.HTTPError:
        listed = []
    if model is None:
        model = next((m for m in (_text(e, "id") for e in listed) if m), None)
    text = body.decode("utf-8", errors="replace") if status == 200 else ""
    owners = {_text(m, "owned_by") for m in listed}
    for kind, marker in (("vllm", "vllm:"), ("sglang", "sglang:"), ("tgi", "tgi_")):
        if marker in text or kind in owners:
            return await _with_length(
                client, replace(CAPS[kind], model=model, metrics=bool(text)), listed
            )
    # Unknown server: probe what it accepts, one token each.
    probes: list[tuple[dict[str, Any], str]] = [
        ({"prompt": [100, 101, 102], "ignore_eos": True, "min_tokens": 1}, "openai-ids"),
        ({"prompt": "hello", "generation_config": json.dumps({"max_new_tokens": 1})}, "tf"),
        ({"prompt": "hello"}, "openai"),
    ]
    for extra, name in probes:
        body_: dict[str, Any] = {"max_tokens": 1, "stream": False, **extra}
        if model is not None and name != "tf":
            body_["model"] = model
        try:  # a server's first generation may load or allocate for long: wait as for a request
            resp = await _post_retrying(client, body_, opts.timeout_s)
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"{opts.base_url}: a one-token probe of /v1/completions failed "
                f"({type(exc).__name__}: {exc}); give --server-kind to skip detection"
            ) from None
        if resp.status_code != 200:
            continue
        if name == "openai-ids":
            caps = ServerCaps("openai", True, True, False, bool(text), model)
        elif name == "tf":
            caps = replace(CAPS["transformers"], metrics=bool(text))
        else:
            caps = replace(CAPS["openai"], model=model, metrics=bool(text))
        return await _with_length(client, caps, listed)
    raise ConfigError(
        f"{opts.base_url} answers no /v1/completions request (last: HTTP {resp.status_code} "
        f"{stream.quote(resp.text, ERROR_BODY_CHARS)}); give --server-kind and --model"
    )


async def _post_retrying(client: Any, body: dict[str, Any], timeout_s: float) -> Any:
    """POST a probe; once more on a fresh connection if the server dropped a kept-alive one
    (a server closes a connection after an error answer, and the pool may still hold it)."""
    import httpx

    try:
        return await client.post("/v1/completions", json=body, timeout=timeout_s)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await client.post("/v1/completions", json=body, timeout=timeout_s)


async def _get_bounded(client: Any, path: str, limit: int) -> tuple[int, bytes]:
    """(status, body) of ``GET path``; a body past ``limit`` bytes is cut there. Asked once
    more on a fresh connection if the server dropped a kept-alive one (as for probes)."""
    import httpx

    try:
        return await _get_once(client, path, limit)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await _get_once(client, path, limit)


async def _get_once(client: Any, path: str, limit: int) -> tuple[int, bytes]:
    body = bytearray()
    async with client.stream("GET", path) as resp:
        async for piece in resp.aiter_bytes():
            body += piece
            if len(body) >= limit:
                break
        return int(resp.status_code), bytes(body[:limit])


async def _get_json(client: Any, path: str) -> Any:
    """The JSON of ``GET path`` (size and depth bounded), or None: not 200, not JSON.

    Raises:
        httpx.HTTPError: no answer.
    """
    status, body = await _get_bounded(client, path, ANSWER_BYTES + 1)
    if status != 200 or len(body) > ANSWER_BYTES:
        return None
    try:
        return loads_bounded(body)
    except ValueError:
        return None


def _models(doc: Any) -> list[dict[str, Any]]:
    """The model entries of a /v1/models answer: its ``data`` list's objects, else none."""
    listed = doc.get("data") if isinstance(doc, dict) else None
    return [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []


def _text(entry: dict[str, Any], key: str) -> str | None:
    value = entry.get(key)
    return value if isinstance(value, str) and value else None


def _length(value: Any) -> int | None:
    """A max model length as a server reports it, or None if it is not a plausible one."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 2 <= value <= MAX_COUNT else None


async def _with_length(client: Any, caps: ServerCaps, listed: list[dict[str, Any]]) -> ServerCaps:
    """``caps`` with the server's max model length: /v1/models (vLLM, SGLang), else /info
    (TGI); the entry of the model sent, else the first that has one."""
    import httpx

    ours = [m for m in listed if caps.model is not None and _text(m, "id") == caps.model]
    for entry in ours or listed:
        if (n := _length(entry.get("max_model_len"))) is not None:
            return replace(caps, max_model_len=n)
    if caps.kind == "tgi":
        try:
            info = await _get_json(client, "/info")
        except httpx.HTTPError:
            info = None
        if isinstance(info, dict) and (n := _length(info.get("max_total_tokens"))):
            return replace(caps, max_model_len=n)
    return caps


# --- one request -----------------------------------------------------------------------


@dataclass
class _Timing:
    """One request's stream as it arrives: its token times and what the server counted."""

    want: int = 0  # output tokens asked
    first: float = math.nan
    last: float = math.nan
    chunks: int = 0
    gap_sum: float = 0.0
    gap_max: float = 0.0
    usage_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False  # [DONE] seen

    def http_error(self, status: int, body: bytes) -> None:
        text = body.decode(errors="replace")[:ERROR_BODY_CHARS]
        self.error = f"HTTP {status}: {' '.join(text.split())}"

    def on_line(self, line: bytes | str) -> bool:
        """Time one line of the event stream (vLLM's benchmark rules); True: stop, it failed.

        Never raises: what the line says is read by ``stream.parse_line``, and a chunk out
        of order (data after [DONE], a token after the finish reason, more tokens than
        asked) fails the request like a bad one.
        """
        ev = stream.parse_line(line)
        if ev.error is not None:
            self.error = ev.error
        elif self.done and ev is not stream.NOTHING:
            self.error = "bad stream: data after [DONE]"
        elif ev.done:
            self.done = True  # the body still ends after it, so the connection can be reused
        elif ev.chunk:
            self._chunk(ev)
        return self.error is not None

    def _chunk(self, ev: stream.Event) -> None:
        if ev.token:
            if self.finish_reason is not None:
                self.error = f"bad stream: a token after finish_reason {self.finish_reason!r}"
                return
            now = time.perf_counter()
            if self.chunks:
                gap = now - self.last
                self.gap_sum += gap
                self.gap_max = max(self.gap_max, gap)
            else:
                self.first = now
            self.last = now
            self.chunks += 1
            if self.chunks > self.want:
                self.error = f"bad stream: {self.chunks} tokens streamed, {self.want} asked"
                return
        self.finish_reason = ev.finish_reason or self.finish_reason
        if ev.completion_tokens is not None:
            if ev.completion_tokens > self.want:
                self.error = (
                    f"bad stream chunk: usage.completion_tokens {ev.completion_tokens}, "
                    f"{self.want} asked"
                )
                return
            self.usage_tokens = ev.completion_tokens
        if ev.prompt_tokens is not None:
            self.usage_prompt_tokens = ev.prompt_tokens

    @property
    def received(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    def outcome(self) -> str | None:
        """The request's failure reason once its stream ended (None: it completed)."""
        if self.error is not None:
            return self.error
        if self.chunks == 0:
            if self.usage_tokens:
                return (
                    f"usage-only stream: usage counts {self.usage_tokens} tokens, no chunk "
                    "carried text"
                )
            return f"no token streamed (finish_reason {self.finish_reason})"
        if self.received < self.want:
            return (
                f"short answer: {self.received} of {self.want} tokens "
                f"(finish_reason {self.finish_reason})"
            )
        return None


async def _stream_wire(client: StreamingClient, body: bytes, t: _Timing) -> None:
    """Send one request on the asyncio client and time its chunks into ``t``."""
    async with await client.post("/v1/completions", body, "application/json") as resp:
        if resp.status != 200:
            t.http_error(resp.status, await resp.read(ERROR_BODY_BYTES))
            return
        async for line in resp.lines():
            if t.on_line(line):
                return


async def _stream_httpx(client: Any, body: bytes, t: _Timing) -> None:
    """The same through httpx (``client="httpx"``: slower, the baseline of the bench)."""
    headers = {"content-type": "application/json"}
    async with client.stream("POST", "/v1/completions", content=body, headers=headers) as resp:
        if resp.status_code != 200:
            head = bytearray()
            async for piece in resp.aiter_bytes():
                head += piece
                if len(head) >= ERROR_BODY_BYTES:
                    break
            t.http_error(resp.status_code, bytes(head))
            return
        async for line in stream.lines(resp.aiter_bytes()):
            if t.on_line(line):
                return


def _reason(exc: BaseException) -> str:
    """One line for an exception that ended a request."""
    text = " ".join(str(exc).split())[:ERROR_BODY_CHARS]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- the replay ------------------------------------------------------------------------


class _Replay:
    """One open-loop replay: the dispatcher, the requests in flight and the sampler."""

    def __init__(
        self, batch: LiveBatch, opts: HttpOptions, on_done: Callable[[], None] | None = None
    ) -> None:
        self.batch = batch
        self.opts = opts
        self.on_done = on_done
        self.result = LiveResult.empty(len(batch))
        self.recorded = np.zeros(len(batch), dtype=bool)
        self.pending = len(batch)  # requests not yet ended (sent or refused)
        self.in_flight = 0
        self.waiting = 0
        self.done = asyncio.Event()
        self.samples: list[dict[str, float]] = []
        self.text: TextPrompts | None = None
        self.t0 = 0.0
        # requests whose usage chunk counted another prompt length than the one sent
        self.prompt_mismatches: list[str] = []

    def limit(self, caps: ServerCaps) -> tuple[int, str]:
        """(max prompt + output tokens of one request, where that figure comes from)."""
        if self.opts.max_model_len is not None:
            return self.opts.max_model_len, "--max-model-len"
        if caps.max_model_len is not None:
            return caps.max_model_len, "the server's max_model_len"
        return DEFAULT_MAX_MODEL_LEN, "the client's bound when the server names none"

    def refusal(self, caps: ServerCaps, i: int) -> str | None:
        """Why request ``i`` cannot be sent as logged, before anything is built for it."""
        p, o = int(self.batch.prompt_tokens[i]), int(self.batch.output_tokens[i])
        if p < 1 or o < 1:
            return f"refused: prompt {p} and output {o} tokens; each must be at least 1"
        limit, source = self.limit(caps)
        if p + o > limit:
            return (
                f"refused: prompt {p:,} + output {o:,} tokens exceed the max model length "
                f"{limit:,} ({source}); cap them with --max-prompt-tokens and "
                "--max-output-tokens, or give --max-model-len"
            )
        return None

    def body(self, caps: ServerCaps, i: int) -> bytes:
        """The request body of ``i`` (only for one ``refusal`` let through).

        Raises:
            ConfigError: its text prompt cannot be built to the exact length.
        """
        b = self.batch
        n = int(b.prompt_tokens[i])
        hashes: Sequence[int] = () if b.prefix_hashes is None else b.prefix_hashes[i]
        block = 0 if b.block_size is None else int(b.block_size[i])
        prompt: str | list[int]
        if caps.token_prompts:
            prompt = token_prompt(i, n, hashes, block)
        else:
            assert self.text is not None
            prompt = self.text.build(i, n, hashes, block)
        return request_body(caps, prompt, int(self.batch.output_tokens[i]))

    def prepare(self, caps: ServerCaps, i: int) -> bytes | None:
        """The body of ``i``, or None when it is refused (its failure is then recorded)."""
        reason = self.refusal(caps, i)
        if reason is None:
            try:
                return self.body(caps, i)
            except ConfigError as exc:
                reason = f"refused: {exc}"
        self._record(i, _Timing(error=reason))
        self.ended()
        return None

    def ended(self, _task: Any = None) -> None:
        """One request ended (answered, failed or refused): the last one ends the replay."""
        self.pending -= 1
        if self.pending == 0:
            self.done.set()

    async def run(self) -> LiveResult:
        import httpx

        opts = self.opts
        gap, k = longest_wait(self.batch.arrival_s)
        if gap > opts.max_wait_s:
            where = "before the first request" if k == 0 else f"before request {k + 1}"
            raise ConfigError(
                f"the replay would sleep {gap:,.6g} s {where} "
                f"({self.batch.request_id[k]}), past --max-gap-s {opts.max_wait_s:g} s; "
                "replay faster (--time-scale), --skip past the gap, or replay one day"
            )
        limits = httpx.Limits(
            max_connections=opts.max_in_flight, max_keepalive_connections=opts.max_in_flight
        )
        timeout = httpx.Timeout(opts.timeout_s, connect=min(opts.timeout_s, 10.0))
        wire = StreamingClient(opts.base_url, max_connections=opts.max_in_flight)
        async with (
            httpx.AsyncClient(base_url=opts.base_url, limits=limits, timeout=timeout) as slow,
            httpx.AsyncClient(base_url=opts.base_url, timeout=5.0) as scraper,
        ):
            client = wire if opts.client == "asyncio" else slow
            caps = await detect(scraper, opts)
            if not caps.token_prompts:
                if opts.tokenizer is None:
                    raise ConfigError(
                        f"the server at {opts.base_url} ({caps.kind}) takes text prompts: pass "
                        "--tokenizer with the served model's tokenizer.json"
                    )
                self.text = TextPrompts(opts.tokenizer)
            sem = asyncio.Semaphore(opts.max_in_flight)
            tasks: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references
            if self.pending == 0:
                self.done.set()
            # Bodies are built before the replay starts (up to PREBUILD_BYTES), so a burst
            # of simultaneous arrivals leaves together; past that, each while waiting.
            # A refused request is recorded here and never sent.
            n = len(self.batch)
            bodies: list[bytes | None] = [None] * n
            size = 0
            for i in range(n):
                if size >= PREBUILD_BYTES:
                    break
                bodies[i] = self.prepare(caps, i)
                size += len(bodies[i] or b"")
            if caps.metrics:  # the first request through httpx is slow: not while replaying
                try:
                    await _get_bounded(scraper, "/metrics", METRICS_BYTES)
                except httpx.HTTPError:
                    pass
            self.t0 = time.perf_counter()
            sampler = asyncio.create_task(self.sample(scraper, caps))

            for i in range(n):
                if self.recorded[i]:
                    continue  # refused: recorded, never sent
                body, bodies[i] = bodies[i], None
                if body is None and (body := self.prepare(caps, i)) is None:
                    continue
                due = self.t0 + float(self.batch.arrival_s[i])
                if due - time.perf_counter() > SPIN_S:
                    await asyncio.sleep(due - time.perf_counter() - SPIN_S)
                while time.perf_counter() < due:  # the loop's timers wake up to 1 ms late
                    await asyncio.sleep(0)
                task = asyncio.create_task(self.one(client, sem, i, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(self.ended)
                if i + 1 < n and bodies[i + 1] is None and not self.recorded[i + 1]:
                    bodies[i + 1] = self.prepare(caps, i + 1)  # built while waiting for its time
            await self.done.wait()
            await sampler
            await wire.aclose()
        for lost in np.flatnonzero(~self.recorded):  # cannot happen; never a success then
            self.result.error[int(lost)] = "not recorded: the client lost this request"
        self.result.metrics = self.metric_arrays()
        limit, source = self.limit(caps)
        self.result.engine_info = {
            "engine": "http",
            "server_kind": caps.kind,
            "base_url": opts.base_url,
            "model": caps.model or "",
            "prompts": "token ids" if caps.token_prompts else f"text ({opts.tokenizer})",
            "exact_output": str(caps.ignore_eos or caps.generation_config).lower(),
            "max_in_flight": str(opts.max_in_flight),
            "timeout_s": str(opts.timeout_s),
            "max_model_len": str(limit),
            "max_model_len_from": source,
            "client": opts.client,
            "httpx": httpx.__version__,
            # the server's own count of prompt tokens, where it sent one, against ours
            "prompt_length_mismatches": str(len(self.prompt_mismatches)),
            "prompt_length_mismatch_examples": "; ".join(self.prompt_mismatches[:3]),
            # time.perf_counter() at time 0, to line times up with other clocks of the machine
            "perf_counter_t0": repr(self.t0),
        }
        return self.result

    async def one(self, client: Any, sem: asyncio.Semaphore, i: int, body: bytes) -> None:
        """Send request ``i`` and record how it went; whatever happens, it is recorded."""
        import httpx

        r, t0 = self.result, self.t0
        t = _Timing(want=int(self.batch.output_tokens[i]))
        self.waiting += 1
        try:
            async with sem:
                self.waiting -= 1
                self.in_flight += 1
                sent = time.perf_counter()
                r.sent_s[i] = sent - t0
                stream_ = _stream_wire if isinstance(client, StreamingClient) else _stream_httpx
                try:
                    async with asyncio.timeout(self.opts.timeout_s):
                        await stream_(client, body, t)
                except TimeoutError:
                    t.error = (
                        f"timeout after {self.opts.timeout_s:g} s ({t.chunks} chunks received)"
                    )
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    t.error = _reason(exc)
                except stream.StreamError as exc:
                    t.error = f"bad stream: {exc}"
                except Exception as exc:  # noqa: BLE001 - a server's bytes never end the run
                    t.error = f"unreadable answer: {_reason(exc)}"
                finally:
                    self.in_flight -= 1
        finally:
            self._record(i, t)

    def _record(self, i: int, t: _Timing) -> None:
        r, t0 = self.result, self.t0
        self.recorded[i] = True
        r.error[i] = t.outcome()
        # what did arrive, failed or not (NaN where nothing did); counts the parser checked
        r.first_token_s[i] = t.first - t0
        r.finished_s[i] = t.last - t0
        r.output_tokens_received[i] = min(t.received, MAX_COUNT)
        if t.chunks > 1:
            r.itl_mean_s[i] = t.gap_sum / (t.chunks - 1)
            r.itl_max_s[i] = t.gap_max
        sent = int(self.batch.prompt_tokens[i])
        if t.usage_prompt_tokens is not None and t.usage_prompt_tokens != sent:
            self.prompt_mismatches.append(
                f"{self.batch.request_id[i]}: {t.usage_prompt_tokens} not {sent}"
            )
        if self.on_done is not None:
            self.on_done()

    async def sample(self, scraper: Any, caps: ServerCaps) -> None:
        """Every interval until the last request ends: client counts and server metrics.

        A scrape that fails or cannot be read is one lost sample, never the run's end.
        """
        interval = self.opts.metrics_interval_s
        scrape = caps.metrics
        while not self.done.is_set():
            row = {
                "time_s": time.perf_counter() - self.t0,
                "client_in_flight": float(self.in_flight),
                "client_waiting": float(self.waiting),
            }
            if scrape:
                try:
                    status, body = await _get_bounded(scraper, "/metrics", METRICS_BYTES + 1)
                    if status != 200:
                        scrape = False
                    elif len(body) <= METRICS_BYTES:
                        got = extract(body.decode("utf-8", errors="replace"))
                        row.update({k: v for k, v in got.items() if math.isfinite(v)})
                except Exception:  # noqa: BLE001, S110 - one lost sample
                    pass
            self.samples.append(row)
            try:
                await asyncio.wait_for(self.done.wait(), interval)
            except TimeoutError:
                pass

    def metric_arrays(self) -> dict[str, np.ndarray]:
        names = sorted({k for row in self.samples for k in row} - {"time_s"})
        out = {"time_s": np.array([row["time_s"] for row in self.samples], dtype=np.float64)}
        for name in names:
            out[name] = np.array([row.get(name, np.nan) for row in self.samples])
        return out


def run_http(
    batch: LiveBatch, opts: HttpOptions, *, on_done: Callable[[], None] | None = None
) -> LiveResult:
    """Replay ``batch`` against the server at ``opts.base_url`` (see the module doc).

    ``on_done`` is called as each request ends (a progress bar). Every request ends with
    ``error`` None (it streamed every token asked) or a one-line reason.

    Raises:
        ConfigError: the server cannot be reached or detected, text prompts are needed
            and no usable tokenizer was given, or the schedule sleeps past
            ``opts.max_wait_s`` at once (before anything is sent).
    """
    return asyncio.run(_Replay(batch, opts, on_done).run())
