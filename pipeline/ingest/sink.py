"""Where a source file's good rows go: per-day Parquet files, written on a thread.

Rows arrive block by block. Each block gets ``arrival_s`` against the earliest
arrival seen so far (the first block's, in a time-ordered log) and is written
as row groups of temporary files, one per day, while the next block is being
parsed. If a later block holds an earlier arrival (an unordered log), the
files are rewritten once at the end with the true origin. ``commit`` then
renames the files into place; ``abort`` removes them.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contracts import CHECKSUMS, REQUESTS, conform
from pipeline.warehouse import Warehouse


def seconds_since(times: pl.Series, origin_us: int) -> npt.NDArray[np.float64]:
    """Seconds from ``origin_us`` (epoch microseconds), as whole seconds plus microseconds / 1e6.

    NOTE: summing the two parts (like Python's timedelta.total_seconds) rounds
    the same way as the Vidur/Splitwise processed traces, so Azure relative
    times match them exactly; dividing the microsecond count by 1e6 does not.
    """
    return _seconds(times.dt.epoch("us").to_numpy(), origin_us)


def _seconds(epoch_us: npt.NDArray[np.int64], origin_us: int) -> npt.NDArray[np.float64]:
    delta = epoch_us - origin_us
    return (delta // 1_000_000) + (delta % 1_000_000) / 1e6  # type: ignore[no-any-return]


# Dictionary pages only for columns whose values repeat (names, counts, small ints): on
# ids, times, line numbers and hashes a dictionary is built, overflows and is dropped,
# which made writing ~25% slower and the files ~15% larger (bench/ingest_speed.py).
_UNIQUE = {
    "request_id",
    "arrival_time",
    "arrival_s",
    "source_line",
    "prefix_hashes",
    "output_hashes",
}
DICTIONARY_COLUMNS = [
    f.name for f in REQUESTS.schema() if f.name not in _UNIQUE and not pa.types.is_floating(f.type)
]
# Ids and times rise with the line number: delta-packed they are smaller and cheaper to
# write than dictionary or plain pages (no dictionary is tried, zstd has little left to do).
# No min/max statistics on ids and hash lists: random values, so min/max prune nothing;
# computing them cost ~10% of the write (bench/ingest_speed.py).
DELTA_COLUMNS = {"source_line": "DELTA_BINARY_PACKED", "arrival_time": "DELTA_BINARY_PACKED"}
STATISTICS_COLUMNS = [
    f.name
    for f in REQUESTS.schema()
    if f.name not in {"request_id", "prefix_hashes", "output_hashes"}
]
WRITE_OPTIONS = {
    "compression": "zstd",
    "use_dictionary": DICTIONARY_COLUMNS,
    "column_encoding": DELTA_COLUMNS,
    "write_statistics": STATISTICS_COLUMNS,
    **CHECKSUMS,
}


class RequestSink:
    """Temporary per-day ``requests`` files of one source file."""

    def __init__(self, warehouse: Warehouse, stem: str, run_id: str, fmt: str, src: str) -> None:
        self._wh = warehouse
        self._stem = stem
        self._suffix = f".tmp-{run_id}"
        self._fmt = fmt
        self._src = src
        self._writers: dict[str, tuple[pq.ParquetWriter, Path, Path]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._last: Future[None] | None = None
        self._origin: int | None = None  # origin used for arrival_s so far
        self._min: int | None = None  # true earliest arrival
        self.rows = 0

    def write(self, good: pl.DataFrame) -> None:
        """Queue a block of good rows (with ``arrival_time``) for writing."""
        if not good.height:
            return
        self.rows += good.height
        prev = self._last

        def run() -> None:
            if prev is not None:
                prev.result()
            self._write(self._with_origin(good))

        # NOTE: all of the work on the writer thread, blocks in order: the caller's
        # thread orders the blocks, and its polars calls would wait their turn in the pool.
        self._last = self._pool.submit(run)

    def _with_origin(self, good: pl.DataFrame) -> pl.DataFrame:
        """The block with ``arrival_s`` (against the first block's earliest arrival) and
        its source columns."""
        epoch = good["arrival_time"].to_physical()  # microseconds
        t = epoch.min()
        assert isinstance(t, int)
        self._min = t if self._min is None else min(self._min, t)
        if self._origin is None:
            self._origin = t
        n = good.height
        return good.hstack(
            [
                pl.Series("arrival_s", _seconds(epoch.to_numpy(), self._origin)),
                pl.Series("source_format", [self._fmt], dtype=pl.String).new_from_index(0, n),
                pl.Series("source_file", [self._src], dtype=pl.String).new_from_index(0, n),
            ]
        )

    def _write(self, frame: pl.DataFrame) -> None:
        times = frame["arrival_time"]
        first, last = times.min(), times.max()
        assert isinstance(first, datetime) and isinstance(last, datetime)
        if first.date() == last.date():  # one day (most blocks): no grouping, no copy
            days: list[tuple[object, pl.DataFrame]] = [(first.date(), frame)]
        else:
            days = [
                (date, sub.drop("_d"))
                for (date,), sub in frame.with_columns(times.dt.date().alias("_d")).group_by(
                    "_d", maintain_order=True
                )
            ]
        for date, sub in days:
            d = str(date)
            if d not in self._writers:
                final = self._wh.partition_path(REQUESTS, {"date": d}, self._stem)
                tmp = final.with_name(f".{final.name}{self._suffix}")
                tmp.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(tmp, REQUESTS.schema(), **WRITE_OPTIONS)
                self._writers[d] = (writer, tmp, final)
            if not sub["arrival_time"].is_sorted():
                sub = sub.sort("arrival_time")
            table = conform(sub.to_arrow(), REQUESTS, self._src)
            self._writers[d][0].write_table(table)

    def _finish(self) -> None:
        try:
            if self._last is not None:
                self._last.result()
        finally:
            for w, _, _ in self._writers.values():
                w.close()
            self._pool.shutdown()

    def close(self) -> list[tuple[Path, Path]]:
        """Finish writing; return (temporary, final) path pairs, one per day."""
        self._finish()
        if self._origin is not None and self._min is not None and self._min < self._origin:
            for _, tmp, _ in self._writers.values():
                self._rebase(tmp, self._min)
        return [(tmp, final) for _, tmp, final in self._writers.values()]

    @property
    def dates(self) -> list[str]:
        return sorted(self._writers)

    def _rebase(self, tmp: Path, origin: int) -> None:
        df = pl.read_parquet(tmp)
        df = df.with_columns(pl.Series("arrival_s", seconds_since(df["arrival_time"], origin)))
        again = tmp.with_name(tmp.name + "-rebased")
        pq.write_table(conform(df.to_arrow(), REQUESTS, self._src), again, **WRITE_OPTIONS)
        again.replace(tmp)

    def abort(self) -> None:
        """Stop and remove the temporary files."""
        try:
            self._finish()
        except Exception:  # noqa: BLE001 - the caller is already failing with its own error
            pass
        for _, tmp, _ in self._writers.values():
            tmp.unlink(missing_ok=True)
