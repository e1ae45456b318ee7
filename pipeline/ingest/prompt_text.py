"""Prompt text to prefix hashes (``--tokenizer``), the same way for every format.

Formats whose records may carry the prompt (``token_ids`` records without ids,
gateway ``prompt`` / ``messages``, OTel ``gen_ai.input.messages`` /
``gen_ai.prompt``) hand it here when ``--tokenizer`` is given. The text is
turned into token ids, the ids into the chained block hashes of
``pipeline.ingest.hashing`` (what the simulator's prefix cache matches), and
the text is dropped: only the hashes and counts are stored.

How text becomes token ids:

* a plain prompt (a completions call): the tokenizer's ``encode`` with its
  special tokens (a BOS where the tokenizer adds one), as vLLM's completions
  endpoint does;
* chat messages, when the tokenizer comes with a chat template (the
  ``chat_template`` of a ``tokenizer_config.json``, or a ``chat_template.jinja``,
  next to the tokenizer.json): the template rendered as Hugging Face's
  ``apply_chat_template`` does (sandboxed Jinja, ``add_generation_prompt``,
  ``bos_token`` / ``eos_token`` from the config), then encoded without adding
  special tokens (the template writes them), as vLLM's chat endpoint does.
  ``strftime_now`` is not defined, so templates that print today's date fall
  back to their fixed date and re-ingesting a log gives the same hashes;
* chat messages without a template: one ``role: content`` line per message,
  joined with newlines, encoded with special tokens. Counts are then close to,
  not equal to, the engine's.

A message's ``content`` is a string or a list of parts (OpenAI ``{"type":
"text", "text": ...}``, OTel ``{"type": "text", "content": ...}``); other
parts (images, tool calls) add no text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.errors import ConfigError, SourceError
from pipeline.ingest.formats import ParseOptions
from pipeline.ingest.hashing import DEFAULT_BLOCK_SIZE, prefix_hashes
from pipeline.validation import loads_json

Messages = list[dict[str, str]]
Prompt = str | Messages  # a plain prompt, or chat messages with string contents


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer and, when it has one, its chat template."""

    tokenizer: Any  # tokenizers.Tokenizer
    template: Any  # a compiled jinja2 Template, or None
    bos_token: str
    eos_token: str

    def render(self, messages: Messages) -> str:
        """The chat template applied to ``messages`` (with the generation prompt)."""
        return str(
            self.template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )

    def encode(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Token ids of each prompt (see the module docstring for the rules)."""
        plain: list[tuple[int, str]] = []
        chat: list[tuple[int, str]] = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                plain.append((i, p))
            elif self.template is not None:
                chat.append((i, self.render(p)))
            else:
                plain.append((i, joined(p)))
        out: list[list[int]] = [[] for _ in prompts]
        for group, special in ((plain, True), (chat, False)):
            if group:
                encs = self.tokenizer.encode_batch(
                    [t for _, t in group], add_special_tokens=special
                )
                for (i, _), enc in zip(group, encs, strict=True):
                    out[i] = list(enc.ids)
        return out


def joined(messages: Messages) -> str:
    """Chat messages as text when there is no chat template: ``role: content`` lines."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict) or part.get("type", "text") != "text":
        return ""
    text = part.get("text", part.get("content"))
    return text if isinstance(text, str) else ""


def messages_of(value: Any) -> Messages | None:
    """Chat messages with string contents, or None when ``value`` is not a list of them."""
    if not isinstance(value, list):
        return None
    out: Messages = []
    for m in value:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        content = m.get("content", m.get("parts"))
        if isinstance(content, list):
            content = "".join(_part_text(p) for p in content)
        out.append(
            {
                "role": role if isinstance(role, str) else "",
                "content": content if isinstance(content, str) else "",
            }
        )
    return out


def prompt_of(record: dict[str, Any]) -> Prompt | None:
    """The prompt a JSON record carries: ``prompt`` (a string), else ``messages``."""
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return messages_of(record.get("messages"))


def _missing_package(source: str) -> SourceError:
    return SourceError(
        source,
        "records carry prompt text; tokenizing them needs the optional `tokenizers` "
        "package (`pip install tokenizers`)",
    )


def _template(path: Path) -> tuple[str | None, str, str]:
    """The chat template, BOS and EOS tokens next to a tokenizer.json (or in its folder)."""
    folder = path if path.is_dir() else path.parent
    config: dict[str, Any] = {}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            text = cfg.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{cfg}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        loaded = loads_json(text, str(cfg), finite=False)
        config = loaded if isinstance(loaded, dict) else {}

    def token(key: str) -> str:
        t = config.get(key)
        t = t.get("content") if isinstance(t, dict) else t
        return t if isinstance(t, str) else ""

    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja = folder / "chat_template.jinja"
    if not isinstance(template, str) and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return (template if isinstance(template, str) else None), token("bos_token"), token("eos_token")


def _compile(template: str) -> Any:
    """A chat template compiled the way Hugging Face's ``apply_chat_template`` does."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


@lru_cache(maxsize=4)
def load_tokenizer(path: str, source: str) -> TextTokenizer:
    """Load ``path`` (a tokenizer.json, or a folder holding one) with its chat template.

    Raises:
        SourceError: naming ``source``, when the package is missing or the file unreadable.
    """
    try:
        from tokenizers import Tokenizer  # optional dependency
    except ImportError:
        raise _missing_package(source) from None
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    try:
        tok = Tokenizer.from_file(str(file))
        template, bos, eos = _template(p)
        compiled = _compile(template) if template is not None else None
    except ConfigError as exc:  # its tokenizer_config.json: not UTF-8, not JSON, too deep
        raise SourceError(source, f"cannot load tokenizer {path}: {exc}") from None
    except Exception as exc:  # the packages raise their own exception types
        raise SourceError(
            source, f"cannot load tokenizer {path} ({type(exc).__name__}); pass a tokenizer.json"
        ) from None
    return TextTokenizer(tok, compiled, bos, eos)


def _tokenizer_for(opts: ParseOptions) -> TextTokenizer:
    if opts.tokenizer is None:
        raise SourceError(
            str(opts.path),
            "records carry prompt text but no prompt_token_ids; pass --tokenizer "
            "tokenizer.json (needs `pip install tokenizers`) to tokenize them, or export "
            "prompt_token_ids",
        )
    return load_tokenizer(str(opts.tokenizer), str(opts.path))


def token_ids(prompts: Sequence[Prompt], opts: ParseOptions) -> list[list[int]]:
    """Token ids of each prompt with the tokenizer of ``opts`` (SourceError without one).

    A chat template that refuses a conversation (``raise_exception``, e.g. roles
    out of order) makes that prompt fall back to the ``role: content`` join; an
    unpaired surrogate in the text is read as ``?``.
    """
    tok = _tokenizer_for(opts)
    try:
        return tok.encode(prompts)
    except Exception:  # noqa: BLE001 - a template or text error on some record: one by one
        return [_one(tok, p) for p in prompts]


def _one(tok: TextTokenizer, prompt: Prompt) -> list[int]:
    try:
        return tok.encode([prompt])[0]
    except Exception:  # noqa: BLE001 - this record's template failed, or its text is not UTF-8
        text = prompt if isinstance(prompt, str) else joined(prompt)
        # an unpaired surrogate (JSON allows "\ud800") becomes "?"
        return tok.encode([text.encode("utf-8", "replace").decode("utf-8")])[0]


def hash_list_series(
    values: list[npt.NDArray[np.uint64]],
    lens: list[int],
    name: str = "prefix_hashes",
    valid: list[bool] | None = None,
) -> pl.Series:
    """One List(UInt64) series of hashes (``prefix_hashes`` unless ``name`` says) from
    per-row arrays, without per-row objects; rows not ``valid`` are null."""
    flat = np.concatenate(values) if values else np.zeros(0, dtype=np.uint64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    mask = None if valid is None else pa.array([not v for v in valid], pa.bool_())
    arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.uint64()), mask=mask)
    series = pl.Series(name, arr)
    return series.cast(pl.List(pl.UInt64()))


def with_prompt_hashes(
    rows: pl.DataFrame, prompts: list[Prompt | None], opts: ParseOptions
) -> pl.DataFrame:
    """Add ``prefix_hashes`` and ``block_size`` to rows from their prompts (one per row).

    Rows without a prompt get no hashes. The logged ``prompt_tokens`` stays
    (it is the engine's own count); where it is missing, the tokenized length
    fills it. Hashes cover at most the full blocks of the logged count, so a
    tokenizer that counts a few more tokens than the engine never makes the
    validator reject the record.
    """
    bs = opts.block_size or DEFAULT_BLOCK_SIZE
    present = [(i, p) for i, p in enumerate(prompts) if p is not None]
    ids = token_ids([p for _, p in present], opts) if present else []
    logged = rows["prompt_tokens"].to_list() if "prompt_tokens" in rows.columns else []
    counts: list[int | None] = list(logged) if logged else [None] * rows.height
    values: list[npt.NDArray[np.uint64]] = []
    lens = [0] * rows.height
    sizes: list[int | None] = [None] * rows.height
    for (i, _), tokens in zip(present, ids, strict=True):
        if counts[i] is None:
            counts[i] = len(tokens)
        n = counts[i]
        keep = tokens[: (n // bs) * bs] if isinstance(n, int) and n >= 0 else tokens
        h = prefix_hashes(keep, bs, hash_salt=opts.hash_salt)
        values.append(h)
        lens[i] = len(h)
        sizes[i] = bs
    return rows.with_columns(
        pl.Series("prompt_tokens", counts, dtype=pl.Int64),
        pl.Series("block_size", sizes, dtype=pl.Int32),
        hash_list_series(values, lens),
    )
