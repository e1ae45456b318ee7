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
from pipeline.live.metrics import MetricsParseError, extract
from pipeline.live.types import LiveBatch, LiveResult
from pipeline.live.wire import StreamingClient

KINDS = ("auto", "vllm", "sglang", "tgi", "transformers", "openai")
CLIENTS = ("asyncio", "httpx")
PREBUILD_BYTES = 256 * 2**20  # request bodies built before the replay starts, at most
SPIN_S = 0.0015  # the dispatcher sleeps until this long before a send, then yields until it
ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class ServerCaps:
    """What a server accepts, and so what the client sends."""

    kind: str
    token_prompts: bool  # prompt may be a list of token ids
    ignore_eos: bool  # ignore_eos and min_tokens are honoured
    generation_config: bool  # transformers serve: a generation_config JSON string
    metrics: bool  # GET /metrics answers in Prometheus text
    model: str | None = None  # the "model" field to send (None: leave it out)


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
        if self.max_in_flight < 1:
            raise ConfigError(f"--max-in-flight {self.max_in_flight}: must be at least 1")
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout {self.timeout_s}: must be more than 0 seconds")


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

    Raises:
        ConfigError: the server cannot be reached or answers no completion request.
    """
    import httpx

    model = opts.model
    if opts.server_kind != "auto":
        return replace(CAPS[opts.server_kind], model=model)
    try:
        metrics = await client.get("/metrics")
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"cannot reach {opts.base_url} ({type(exc).__name__}: {exc}); is the server up? "
            "Give --server-kind to skip detection"
        ) from None
    try:  # some servers fail here (transformers 5.20 without a model cache: HTTP 500)
        models = await client.get("/v1/models")
    except httpx.HTTPError:
        models = None
    ok = models is not None and models.status_code == 200
    listed = _json(models).get("data") if ok else None
    listed = listed if isinstance(listed, list) else []
    if model is None and listed:
        model = listed[0].get("id")
    text = metrics.text if metrics.status_code == 200 else ""
    owners = {m.get("owned_by") for m in listed}
    for kind, marker in (("vllm", "vllm:"), ("sglang", "sglang:"), ("tgi", "tgi_")):
        if marker in text or kind in owners:
            return replace(CAPS[kind], model=model, metrics=bool(text))
    # Unknown server: probe what it accepts, one token each.
    probes: list[tuple[dict[str, Any], str]] = [
        ({"prompt": [100, 101, 102], "ignore_eos": True, "min_tokens": 1}, "openai-ids"),
        ({"prompt": "hello", "generation_config": json.dumps({"max_new_tokens": 1})}, "tf"),
        ({"prompt": "hello"}, "openai"),
    ]
    for extra, name in probes:
        body: dict[str, Any] = {"max_tokens": 1, "stream": False, **extra}
        if model is not None and name != "tf":
            body["model"] = model
        try:  # a server's first generation may load or allocate for long: wait as for a request
            resp = await _post_retrying(client, body, opts.timeout_s)
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"{opts.base_url}: a one-token probe of /v1/completions failed "
                f"({type(exc).__name__}: {exc}); give --server-kind to skip detection"
            ) from None
        if resp.status_code != 200:
            continue
        if name == "openai-ids":
            return ServerCaps("openai", True, True, False, bool(text), model)
        if name == "tf":
            return replace(CAPS["transformers"], metrics=bool(text))
        return replace(CAPS["openai"], model=model, metrics=bool(text))
    raise ConfigError(
        f"{opts.base_url} answers no /v1/completions request (last: HTTP {resp.status_code} "
        f"{resp.text[:ERROR_BODY_CHARS]!r}); give --server-kind and --model"
    )


async def _post_retrying(client: Any, body: dict[str, Any], timeout_s: float) -> Any:
    """POST a probe; once more on a fresh connection if the server dropped a kept-alive one
    (a server closes a connection after an error answer, and the pool may still hold it)."""
    import httpx

    try:
        return await client.post("/v1/completions", json=body, timeout=timeout_s)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await client.post("/v1/completions", json=body, timeout=timeout_s)


def _json(resp: Any) -> dict[str, Any]:
    try:
        out = resp.json()
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


# --- one request -----------------------------------------------------------------------


@dataclass
class _Timing:
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

    def on_line(self, line: str) -> bool:
        """Time one line of the event stream (vLLM's benchmark rules); True: stop, it failed."""
        if not line.startswith("data:") or self.done:
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True  # the body still ends after it, so the connection can be reused
            return False
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            self.error = f"bad stream chunk: {data[:ERROR_BODY_CHARS]!r}"
            return True
        if "error" in chunk:
            self.error = f"server error: {str(chunk['error'])[:ERROR_BODY_CHARS]}"
            return True
        choices = chunk.get("choices") or []
        if choices:
            if choices[0].get("text"):
                now = time.perf_counter()
                if self.chunks:
                    gap = now - self.last
                    self.gap_sum += gap
                    self.gap_max = max(self.gap_max, gap)
                else:
                    self.first = now
                self.last = now
                self.chunks += 1
            self.finish_reason = choices[0].get("finish_reason") or self.finish_reason
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        if usage and usage.get("prompt_tokens") is not None:
            self.usage_prompt_tokens = int(usage["prompt_tokens"])
        return False


async def _stream_wire(client: StreamingClient, body: bytes, t: _Timing) -> None:
    """Send one request on the asyncio client and time its chunks into ``t``."""
    async with await client.post("/v1/completions", body, "application/json") as resp:
        if resp.status != 200:
            t.http_error(resp.status, await resp.read())
            return
        async for line in resp.lines():
            if t.on_line(line):
                return


async def _stream_httpx(client: Any, body: bytes, t: _Timing) -> None:
    """The same through httpx (``client="httpx"``: slower, the baseline of the bench)."""
    headers = {"content-type": "application/json"}
    async with client.stream("POST", "/v1/completions", content=body, headers=headers) as resp:
        if resp.status_code != 200:
            t.http_error(resp.status_code, await resp.aread())
            return
        async for line in resp.aiter_lines():
            if t.on_line(line):
                return


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
        self.in_flight = 0
        self.waiting = 0
        self.done = asyncio.Event()
        self.samples: list[dict[str, float]] = []
        self.text: TextPrompts | None = None
        self.t0 = 0.0
        # requests whose usage chunk counted another prompt length than the one sent
        self.prompt_mismatches: list[str] = []

    def body(self, caps: ServerCaps, i: int) -> bytes:
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

    async def run(self) -> LiveResult:
        import httpx

        opts = self.opts
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
            tasks: set[asyncio.Task[None]] = set()
            pending = len(self.batch)
            if pending == 0:
                self.done.set()
            # Bodies are built before the replay starts (up to PREBUILD_BYTES), so a burst
            # of simultaneous arrivals leaves together; past that, each while waiting.
            bodies: list[bytes | None] = [None] * len(self.batch)
            size = 0
            for i in range(len(self.batch)):
                if size >= PREBUILD_BYTES:
                    break
                bodies[i] = self.body(caps, i)
                size += len(bodies[i] or b"")
            if caps.metrics:  # the first request through httpx is slow: not while replaying
                try:
                    await scraper.get("/metrics")
                except httpx.HTTPError:
                    pass
            self.t0 = time.perf_counter()
            sampler = asyncio.create_task(self.sample(scraper, caps))

            def finished(task: asyncio.Task[None]) -> None:
                nonlocal pending
                tasks.discard(task)
                pending -= 1
                if pending == 0:
                    self.done.set()

            for i in range(len(self.batch)):
                body, bodies[i] = bodies[i] or self.body(caps, i), None
                due = self.t0 + float(self.batch.arrival_s[i])
                if due - time.perf_counter() > SPIN_S:
                    await asyncio.sleep(due - time.perf_counter() - SPIN_S)
                while time.perf_counter() < due:  # the loop's timers wake up to 1 ms late
                    await asyncio.sleep(0)
                task = asyncio.create_task(self.one(client, sem, i, body))
                tasks.add(task)
                task.add_done_callback(finished)
                if i + 1 < len(self.batch) and bodies[i + 1] is None:
                    bodies[i + 1] = self.body(caps, i + 1)  # built while waiting for its time
            await self.done.wait()
            await sampler
            await wire.aclose()
        self.result.metrics = self.metric_arrays()
        self.result.engine_info = {
            "engine": "http",
            "server_kind": caps.kind,
            "base_url": opts.base_url,
            "model": caps.model or "",
            "prompts": "token ids" if caps.token_prompts else f"text ({opts.tokenizer})",
            "exact_output": str(caps.ignore_eos or caps.generation_config).lower(),
            "max_in_flight": str(opts.max_in_flight),
            "timeout_s": str(opts.timeout_s),
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
        import httpx

        r, t0 = self.result, self.t0
        self.waiting += 1
        async with sem:
            self.waiting -= 1
            self.in_flight += 1
            t = _Timing()
            sent = time.perf_counter()
            r.sent_s[i] = sent - t0
            stream = _stream_wire if isinstance(client, StreamingClient) else _stream_httpx
            try:
                async with asyncio.timeout(self.opts.timeout_s):
                    await stream(client, body, t)
            except TimeoutError:
                t.error = f"timeout after {self.opts.timeout_s:g} s ({t.chunks} chunks received)"
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                t.error = f"{type(exc).__name__}: {exc}".strip(": ") or type(exc).__name__
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                t.error = f"bad stream chunk: {exc}"
            except (ValueError, TypeError, AttributeError, KeyError) as exc:  # odd JSON shapes
                t.error = f"unreadable answer: {type(exc).__name__}: {exc}"
            finally:
                self.in_flight -= 1
        self._record(i, t)

    def _record(self, i: int, t: _Timing) -> None:
        r, t0 = self.result, self.t0
        r.first_token_s[i] = t.first - t0
        r.finished_s[i] = t.last - t0
        received = t.usage_tokens if t.usage_tokens is not None else t.chunks
        r.output_tokens_received[i] = received
        if t.chunks > 1:
            r.itl_mean_s[i] = t.gap_sum / (t.chunks - 1)
            r.itl_max_s[i] = t.gap_max
        sent = int(self.batch.prompt_tokens[i])
        if t.usage_prompt_tokens is not None and t.usage_prompt_tokens != sent:
            self.prompt_mismatches.append(
                f"{self.batch.request_id[i]}: {t.usage_prompt_tokens} not {sent}"
            )
        want = int(self.batch.output_tokens[i])
        if t.error is None and received < want:
            t.error = f"short answer: {received} of {want} tokens (finish_reason {t.finish_reason})"
        r.error[i] = t.error
        if self.on_done is not None:
            self.on_done()

    async def sample(self, scraper: Any, caps: ServerCaps) -> None:
        """Every interval until the last request ends: client counts and server metrics."""
        import httpx

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
                    resp = await scraper.get("/metrics")
                    if resp.status_code == 200:
                        row.update(extract(resp.text))
                    else:
                        scrape = False
                except (httpx.HTTPError, MetricsParseError):
                    pass  # one lost sample; the requests themselves say what failed
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

    ``on_done`` is called as each request ends (a progress bar).

    Raises:
        ConfigError: the server cannot be reached or detected, or text prompts are
            needed and no usable tokenizer was given.
    """
    return asyncio.run(_Replay(batch, opts, on_done).run())
