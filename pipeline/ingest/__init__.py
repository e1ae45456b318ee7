"""Ingest: production request logs -> the ``requests`` table (plus ``quarantine``, ``runs``).

``ingest_logs`` reads every file (globs and directories expanded, gzip and
zstd recognised), detects its format from its content (or takes the one
given), parses it block by block, validates every record, and writes:

* good records to ``requests/date=YYYY-MM-DD/src-<key>.parquet``, one file per
  source file and day, where ``<key>`` names the source file. Re-ingesting a
  file replaces what it wrote before, so nothing doubles;
* rejected records to ``quarantine/src-<key>.parquet`` with line, byte offset
  and reason;
* one row to ``runs``.

Records whose request id is already in the warehouse (from another file) or
earlier in the same file are dropped and counted as duplicates. For every
file: rows read = kept + quarantined + duplicates.

A file that cannot be ingested as a whole (unreadable, unknown format,
truncated or corrupt compression, not UTF-8) lands nothing and leaves what it
wrote before in place; the other files of the run still land, and the result
lists the error. An error no check foresaw (a bug) is handled the same way,
as a one-line file error. No record can stop a run: every record either lands,
is a duplicate, or is quarantined with a reason.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import __version__
from pipeline.config import Config
from pipeline.contracts import CHECKSUMS, QUARANTINE, REQUESTS, RUNS, conform
from pipeline.errors import ConfigError, SourceError
from pipeline.ingest.formats import FORMATS, Block, LogFormat, ParseOptions, detect
from pipeline.ingest.idset import IdSet
from pipeline.ingest.reader import (
    BLOCK_BYTES,
    HEAD_BYTES,
    Opened,
    check_encoding,
    expand_sources,
    iter_blocks,
    open_source,
    read_all,
    read_head,
)
from pipeline.ingest.sink import RequestSink
from pipeline.ingest.validate import content_keys, occurrence_ids, validate
from pipeline.objectstore import display, source_name
from pipeline.progress import progress
from pipeline.warehouse import Warehouse, iter_partitions, new_run_id, replace_files, source_key

log = logging.getLogger(__name__)

EXCERPT_CHARS = 200
# a CSV field shown in excerpts: a number or a time (starts with a digit, sign or
# dot; then digits, separators and the letters of exponents and ISO times only)
_NUMERIC_FIELD = re.compile(r"^\s*\"?[-+.]?[0-9][0-9.:+\-eETZ ]*\"?\s*$|^\s*$")


@dataclass
class IngestOptions:
    """How to read the sources (see ``tracereplay ingest --help``)."""

    format: str | None = None  # force a format instead of detecting it
    block_size: int | None = None  # prefix hash block size override
    hash_salt: str = ""
    tokenizer: Path | None = None
    trace_start: datetime = datetime(1970, 1, 1, tzinfo=UTC)  # for relative-time logs
    block_bytes: int = BLOCK_BYTES
    quiet: bool = False
    # the tenant and model of every record that names none (a log of one tenant or model,
    # mixed with others in one warehouse: a fleet's pools can then split them)
    tenant: str | None = None
    model: str | None = None

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        *,
        fmt: str | None = None,
        block_size: int | None = None,
        hash_salt: str | None = None,
        tokenizer: Path | None = None,
        trace_start: str | None = None,
        quiet: bool = False,
        tenant: str | None = None,
        model: str | None = None,
    ) -> IngestOptions:
        """Options from what was given (flags, arguments), falling back to the config
        file's ``[ingest]`` section.

        Raises:
            ConfigError: ``trace_start`` is not an ISO-8601 time; a tenant or model that is
                empty, over 256 characters or holds a control character.
        """
        start = trace_start or cfg.get("ingest", "trace_start")
        tok = tokenizer or cfg.get("ingest", "tokenizer")
        opts = cls(
            format=fmt,
            block_size=block_size or cfg.get("ingest", "block_size"),
            hash_salt=hash_salt if hash_salt is not None else cfg.get("ingest", "hash_salt", ""),
            tokenizer=Path(tok) if tok else None,
            quiet=quiet,
            tenant=_label(tenant, "--tenant"),
            model=_label(model, "--model"),
        )
        if start:
            opts.trace_start = parse_time(start, "--trace-start")
        return opts


def _label(value: str | None, where: str) -> str | None:
    """A tenant or model name given for every record, checked (None: not given)."""
    if value is None:
        return None
    if not value.strip() or len(value) > 256 or any(c < " " or c == "\x7f" for c in value):
        raise ConfigError(
            f"{where}: {value[:40]!r} must be a name of 1 to 256 printable characters, "
            "e.g. --tenant chat"
        )
    return value


def _fill_labels(good: pl.DataFrame, opts: IngestOptions) -> pl.DataFrame:
    """``opts.tenant`` and ``opts.model`` for the records of ``good`` that name none."""
    fills = [
        pl.col(col).fill_null(pl.lit(value))
        for col, value in (("tenant", opts.tenant), ("model", opts.model))
        if value is not None
    ]
    return good.with_columns(fills) if fills else good


def parse_time(value: str, where: str) -> datetime:
    """An ISO-8601 time (``Z`` for UTC); a time without a zone is UTC."""
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(
            f"{where}: {value!r} is not an ISO-8601 time, e.g. 2024-05-01T00:00:00Z"
        ) from exc
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@dataclass
class FileResult:
    path: str
    format: str | None = None
    compression: str | None = None
    rows_read: int = 0
    rows_kept: int = 0
    rows_quarantined: int = 0
    rows_duplicate: int = 0
    dates: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class IngestResult:
    run_id: str
    warehouse: str
    files: list[FileResult]

    @property
    def ok(self) -> bool:
        return all(f.error is None for f in self.files)

    def total(self, name: str) -> int:
        return sum(int(getattr(f, name)) for f in self.files)

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "warehouse": self.warehouse,
            "status": "ok" if self.ok else "partial",
            "rows_read": self.total("rows_read"),
            "rows_kept": self.total("rows_kept"),
            "rows_quarantined": self.total("rows_quarantined"),
            "rows_duplicate": self.total("rows_duplicate"),
            "files": [asdict(f) for f in self.files],
        }


class _IdIndex:
    """Which request ids are taken: by other sources in the warehouse, and so far in this run."""

    def __init__(self, warehouse: Warehouse) -> None:
        frames = []
        for path in warehouse.good_files(REQUESTS):
            ids = pl.from_arrow(pq.read_table(path, columns=["request_id"]).column(0))
            assert isinstance(ids, pl.Series)
            if len(ids):
                frames.append(pl.DataFrame({"h": ids.hash()}).with_columns(src=pl.lit(path.stem)))
        self._existing = (
            pl.concat(frames) if frames else pl.DataFrame(schema={"h": pl.UInt64, "src": pl.String})
        )
        self._run: list[np.ndarray] = []

    def for_source(self, stem: str) -> IdSet:
        """The ids a source may not reuse: other sources' in the warehouse, and this run's."""
        other = self._existing.filter(pl.col("src") != stem)["h"].to_numpy()
        taken = IdSet()
        taken.add(other)
        for a in self._run:
            taken.add(a)
        return taken

    def keep(self, hashes: list[np.ndarray]) -> None:
        """Record the ids a source landed in this run."""
        self._run.extend(hashes)


def ingest_logs(
    sources: list[str], warehouse: Warehouse, opts: IngestOptions | None = None
) -> IngestResult:
    """Ingest log files into the warehouse.

    Args:
        sources: file paths, globs or directories.
        warehouse: where to write.
        opts: format and hashing options.

    Returns:
        Per-file counts and errors; ``ok`` is False when any file failed.

    Raises:
        SourceError: a pattern matched no file at all.
    """
    opts = opts or IngestOptions()
    started = datetime.now(UTC)
    run_id = new_run_id(started)
    warehouse.init()
    paths = expand_sources(sources)
    index = _IdIndex(warehouse)
    results: list[FileResult] = []
    total_bytes = sum(p.stat().st_size for p in paths)
    with progress("ingest", total_bytes, quiet=opts.quiet) as bar:
        for path in paths:
            res = FileResult(path=source_name(path))
            try:
                _ingest_file(path, warehouse, opts, run_id, index, res, bar)
            except SourceError as exc:
                res.error = str(exc)
            except OSError as exc:
                res.error = _os_error(path, exc, results, len(paths))
            except Exception as exc:  # noqa: BLE001 - a bug on one file must not stop the others
                res.error = _unexpected(path, exc)
            if res.error is not None:
                res.rows_read = res.rows_kept = res.rows_quarantined = res.rows_duplicate = 0
                res.dates = []
            results.append(res)
    result = IngestResult(run_id, display(warehouse.root), results)
    whole = sum(1 for r in results if r.error is None)
    try:
        _write_run(warehouse, result, sources, started, opts)
    except OSError as exc:
        from pipeline import storage

        outcome = (
            f"its {whole} files landed whole, its runs row did not; a rerun replaces them"
            if whole
            else None
        )
        err = storage.storage_error(exc, outcome=outcome)
        if err is None:
            raise
        raise err from exc
    if whole:
        from pipeline import storage

        storage.landed(f"the ingest (run {run_id}) landed whole")
    return result


def _os_error(path: Path, exc: OSError, done: list[FileResult], total: int) -> str:
    """The error line of a file the system would not let us read; raises when it would
    not let us *write* (a full disk, a read-only warehouse, ...): the other files would
    fail the same way, so the run stops there (``pipeline.storage``)."""
    from pipeline import storage

    err = storage.storage_error(exc)
    if err is None:
        return _unexpected(path, exc)
    if err.path.resolve() == path.resolve():  # the log itself: this file only
        return (
            f"{path}: cannot read it: {err.reason}; give this user read access to it, "
            "then rerun (the other files landed)"
        )
    whole = sum(1 for r in done if r.error is None)
    if whole:
        storage.landed(
            f"{whole} of the {total} files landed whole before it, and a rerun replaces them"
        )
    raise err from exc


def _unexpected(path: Path, exc: Exception) -> str:
    """One line for an error no check foresaw (a bug): what, where, and what to do.

    The exception's message is left out: it may quote a value of the log, and
    this line is stored in ``runs``. The traceback goes to the debug log.
    """
    log.debug("unexpected error while ingesting %s", path, exc_info=exc)
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return (
        f"{path}: unexpected error while reading it ({type(exc).__name__}{where}); nothing "
        "from it was kept and the other files landed; please report it (run with --debug "
        "for the traceback)"
    )


def _ingest_file(
    path: Path,
    warehouse: Warehouse,
    opts: IngestOptions,
    run_id: str,
    index: _IdIndex,
    res: FileResult,
    bar: object,
) -> None:
    head = read_head(path)
    if len(head) < HEAD_BYTES and not head.removeprefix(b"\xef\xbb\xbf").strip():
        return  # an empty (or blank) file holds no records: nothing to do, nothing replaced
    check_encoding(path, head)
    fmt = _choose_format(path, head, opts.format)
    res.format = fmt.name
    key = source_key(path)
    stem = f"src-{key}"
    taken = index.for_source(stem)
    kept_hashes: list[np.ndarray] = []
    popts = ParseOptions(
        path=path, block_size=opts.block_size, hash_salt=opts.hash_salt, tokenizer=opts.tokenizer
    )
    sink = RequestSink(warehouse, stem, run_id, fmt.name, source_name(path))
    rejects: list[pl.DataFrame] = []
    counts: dict[int, int] = {}
    opened = open_source(path)
    res.compression = opened.compression
    done = 0
    try:
        blocks = (
            iter_blocks(path, opened, skip_header=fmt.has_header, block_bytes=opts.block_bytes)
            if fmt.line_based
            else _whole(path, opened)
        )
        for part, consumed in _parsed_blocks(blocks, fmt, popts, opts.trace_start):
            if part.bad is not None:
                rejects.append(part.bad)
                res.rows_quarantined += part.bad.height
            res.rows_read += part.n_read
            good, hashes = _assign_ids(part, counts)
            good, ndup = _dedupe(good, hashes, taken, kept_hashes)
            good = _fill_labels(good, opts)
            res.rows_duplicate += ndup
            if good.height:
                sink.write(good)
                res.rows_kept += good.height
            if consumed > done:
                bar.advance(consumed - done)  # type: ignore[attr-defined]
                done = consumed
        if res.rows_read != res.rows_kept + res.rows_quarantined + res.rows_duplicate:
            raise AssertionError(f"counts do not reconcile for {path}: {res}")
        _commit(warehouse, stem, sink, rejects, run_id, fmt, path, res)
    except BaseException:
        sink.abort()  # a failed write (a full disk) leaves no temporary file behind
        raise
    finally:
        opened.stream.close()
    index.keep(kept_hashes)
    if res.rows_kept == 0 and res.rows_read == 0:
        res.dates = []


@dataclass
class _Part:
    """One parsed block: the good rows (with ``arrival_time``); either the hashes of their
    ids or, when some rows have none, the content keys of those rows (their ids, and so
    every hash, come in order); the rejects (None: none), and the records read."""

    n_read: int
    good: pl.DataFrame
    hashes: np.ndarray | None
    keys: np.ndarray | None
    bad: pl.DataFrame | None


def _parse_one(
    block: Block, header: bytes, fmt: LogFormat, popts: ParseOptions, trace_start: datetime
) -> _Part:
    """Parse and validate one block, and do every per-row step that needs no order.

    NOTE: on the parse threads, not the thread that orders the blocks: each
    polars call waits its turn in polars' thread pool, busy with the other
    block's read, and that thread's waits held up the whole file.
    """
    if fmt.has_header:
        popts = replace(popts, header=header)
    parsed = fmt.parse(block, popts)
    good, bad = validate(parsed.rows)
    bad = pl.concat([parsed.rejects, bad]).sort("source_line")
    n_read = parsed.rows.height + parsed.rejects.height
    keys = hashes = None
    if good["request_id"].null_count():  # ids from content, numbered in order later
        keys = content_keys(good.filter(pl.col("request_id").is_null()), fmt.name)
    else:
        hashes = good["request_id"].hash().to_numpy()
    good = _arrival_time(good, trace_start)
    return _Part(n_read, good, hashes, keys, _excerpts(bad, block, fmt) if bad.height else None)


def _parsed_blocks(
    blocks: Iterable[tuple[Block, bytes, int]],
    fmt: LogFormat,
    popts: ParseOptions,
    trace_start: datetime,
) -> Iterator[tuple[_Part, int]]:
    """Parse blocks on two threads, in order, with at most three blocks in flight.

    NOTE: polars and numpy release the GIL, so reading the next block and
    parsing this one overlap on a 2-core machine; ids and dedupe stay in order
    on the caller's thread.
    """
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending: deque[tuple[Future[_Part], int]] = deque()
        for block, header, consumed in blocks:
            job = pool.submit(_parse_one, block, header, fmt, popts, trace_start)
            pending.append((job, consumed))
            if len(pending) >= 3:
                fut, c = pending.popleft()
                yield fut.result(), c
        while pending:
            fut, c = pending.popleft()
            yield fut.result(), c


def _whole(path: Path, opened: Opened) -> list[tuple[Block, bytes, int]]:
    """The whole decompressed file as one block (formats that are not line-based)."""
    return [(Block(read_all(path, opened), 1, 0), b"", opened.size)]


def _choose_format(path: Path, head: bytes, forced: str | None) -> LogFormat:
    if forced:
        if forced not in FORMATS:
            raise SourceError(
                str(path), f"unknown format {forced!r}; choose one of {', '.join(sorted(FORMATS))}"
            )
        return FORMATS[forced]
    fmt = detect(head)
    if fmt is None:
        raise SourceError(
            str(path),
            "unknown log format (the first line matches none of "
            f"{', '.join(sorted(FORMATS))}); pass --log-format NAME if you know it",
        )
    return fmt


def _assign_ids(part: _Part, counts: dict[int, int]) -> tuple[pl.DataFrame, np.ndarray]:
    """The block with an id for every row, and the ids' hashes (rows without an id get one
    from their content, numbered by how often it came before in the file: in order)."""
    good = part.good
    if part.keys is None:
        assert part.hashes is not None
        return good, part.hashes
    ids = occurrence_ids(part.keys, counts)
    missing = good["request_id"].is_null().to_numpy()
    filled = good["request_id"].to_list()
    it = iter(ids)
    for i in np.flatnonzero(missing).tolist():
        filled[i] = next(it)
    good = good.with_columns(pl.Series("request_id", filled, dtype=pl.String))
    return good, good["request_id"].hash().to_numpy()


def _dedupe(
    good: pl.DataFrame, h: np.ndarray, taken: IdSet, kept: list[np.ndarray]
) -> tuple[pl.DataFrame, int]:
    """Drop rows whose id (hash ``h``) is taken (elsewhere, earlier in the file or in the
    block)."""
    if not good.height:
        return good, 0
    dup = taken.add(h)
    ndup = int(dup.sum())
    if not ndup:  # the common case: no copy of the block
        kept.append(h)
        return good, 0
    kept.append(h[~dup])
    return good.filter(pl.Series(~dup)), ndup


def _arrival_time(good: pl.DataFrame, trace_start: datetime) -> pl.DataFrame:
    if good["arrival_offset_s"].null_count() == good.height:  # absolute times only
        good.drop_in_place("arrival_offset_s")  # (``drop`` is a query: a turn in the pool)
        return good
    base = pl.lit(trace_start).dt.cast_time_unit("us").dt.convert_time_zone("UTC")
    offset = pl.duration(microseconds=(pl.col("arrival_offset_s") * 1e6).round().cast(pl.Int64))
    return good.with_columns(
        pl.coalesce(pl.col("arrival_time"), base + offset).alias("arrival_time")
    ).drop("arrival_offset_s")


def _excerpts(bad: pl.DataFrame, block: Block, fmt: LogFormat) -> pl.DataFrame:
    """The rejected lines as excerpts, for CSV formats only, with every text field masked.

    A record of a format that may carry text (every JSON format: any line may
    hold a prompt in some field) gets no excerpt. In a CSV line, a field that
    is not a number or a time is shown as ``?``: a bad line may hold more
    fields than the header names, and text in any of them.
    """
    if fmt.may_hold_text or not fmt.line_based:
        return bad.with_columns(pl.lit(None, dtype=pl.String).alias("raw_excerpt"))
    out = []
    data = block.data
    for off in bad["byte_offset"].to_list():
        start = off - block.offset
        end = data.find(b"\n", start)
        line = data[start : end if end >= 0 else len(data)].rstrip(b"\r")
        text = line[: EXCERPT_CHARS * 2].decode("utf-8", "replace")
        out.append(
            ",".join(f if _NUMERIC_FIELD.match(f) else "?" for f in text.split(","))[:EXCERPT_CHARS]
        )
    return bad.with_columns(pl.Series("raw_excerpt", out, dtype=pl.String))


def _commit(
    warehouse: Warehouse,
    stem: str,
    sink: RequestSink,
    rejects: list[pl.DataFrame],
    run_id: str,
    fmt: LogFormat,
    path: Path,
    res: FileResult,
) -> None:
    """Swap the file's new partitions and quarantine in, replacing what it wrote before."""
    src = source_name(path)
    new = sink.close()
    old = [p for _, p in iter_partitions(warehouse.files(REQUESTS)) if p.stem == stem]
    q = (
        pl.concat(rejects)
        if rejects
        else pl.DataFrame(
            schema={
                "source_line": pl.Int64,
                "byte_offset": pl.Int64,
                "reason": pl.String,
                "raw_excerpt": pl.String,
            }
        )
    ).with_columns(
        pl.lit(run_id).alias("run_id"),
        pl.lit(fmt.name).alias("source_format"),
        pl.lit(src).alias("source_file"),
    )
    q_final = warehouse.partition_path(QUARANTINE, {}, stem)
    if q.height:
        q_tmp = q_final.with_name(f".{q_final.name}.tmp-{run_id}")
        q_tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            q_table = conform(q.to_arrow(), QUARANTINE, source_name(path))
            pq.write_table(q_table, q_tmp, compression="zstd", **CHECKSUMS)
        except BaseException:
            q_tmp.unlink(missing_ok=True)
            raise
        new.append((q_tmp, q_final))
    else:
        old.append(q_final)
    replace_files(new, old)
    res.dates = sink.dates


def _write_run(
    warehouse: Warehouse,
    result: IngestResult,
    sources: list[str],
    started: datetime,
    opts: IngestOptions,
) -> None:
    d = result.to_dict()
    details = {
        "files": d["files"],
        "options": {
            "format": opts.format,
            "block_size": opts.block_size,
            "trace_start": opts.trace_start.isoformat(),
            "hash_salt_set": bool(opts.hash_salt),
        },
    }
    row = {
        "run_id": [result.run_id],
        "command": ["ingest"],
        "started_at": [started],
        "finished_at": [datetime.now(UTC)],
        "status": [d["status"]],
        "inputs": [json.dumps(sources)],
        "rows_read": [result.total("rows_read")],
        "rows_kept": [result.total("rows_kept")],
        "rows_quarantined": [result.total("rows_quarantined")],
        "rows_duplicate": [result.total("rows_duplicate")],
        "details": [json.dumps(details)],
        "version": [__version__],
    }
    warehouse.write(RUNS, pa.table(row), {}, result.run_id)
