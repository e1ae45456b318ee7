"""What the warehouse serves is what it has verified; a damaged file is set aside.

A file of a table is served (to the DuckDB views, to the replay's reader, to ingest's
id index: every reader, through ``Warehouse.good_files`` and ``Warehouse.connect``)
only once it has passed every check:

- it is a regular, non-empty file where its table's layout puts one
  (``runs/<id>.parquet``, ``requests/date=<day>/<name>.parquet``, ...);
- its footer reads and says it is a file of that table at this schema version, with
  the contract's columns and types (``contracts.footer_problems``);
- every page reads back and matches its CRC32 (``contracts.CHECKSUMS``; files written
  before checksums have none: their pages are only decoded);
- every value is one the contract allows: no nulls where none may be, each column
  within its declared ``Valid`` (``contracts.value_problems``).

A file that fails is *damaged*. A command holding the warehouse lock (``pipeline.lock``)
moves it to ``damaged/<its path>`` and adds a record to ``damaged/manifest.jsonl``:
where it was, when, what failed, what to do (re-ingest the source it came from, re-run
the run that wrote it). A command without the lock (``sql``, ``report``, ``check``
without ``--repair``, any on a read-only warehouse) leaves it where it is and out of
what it reads. Either way one line on stderr names the file and the fix, and every
other file is still served: one damaged file never blocks the views.

Verification reads every page once; the verdicts are kept in ``.verified.json`` under
the warehouse, keyed by each file's size, mtime, ctime and inode, so a file is read
again only once it has changed (a warehouse that cannot be written keeps no verdicts
and verifies each time). Verifying a requests file of a million rows (185 MB, 20M prefix
hashes) takes about 1.4 s, once; a verdict kept costs a ``stat``.

Setting aside survives kill -9: the manifest records are written (atomically) before
any file moves, and a record whose file has not moved yet is completed by the next
command that sets files aside, so a file is always either in place or in ``damaged/``
with its record.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import __version__
from pipeline.contracts import (
    CONTRACTS,
    RUNS,
    Contract,
    footer_problems,
    open_verified,
    value_problems,
)
from pipeline.storage import discard

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from pipeline.warehouse import Warehouse
else:  # loaded when a file is judged, not when the verdicts kept beside them still hold
    from pipeline.lazy import lazy_import

    pq = lazy_import("pyarrow.parquet")

DAMAGED_DIR = "damaged"
MANIFEST = "manifest.jsonl"
VERDICTS = ".verified.json"
EMPTY = "_empty.parquet"
# Tests: kill -9 this process at the named point ("set-aside:recorded", ...).
CRASH_AT = "TRACEREPLAY_CRASH_AT"

# The verdicts of another tracereplay (other checks, other contracts) are not reused.
_VERDICTS_VERSION = f"1:{__version__}"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")

Say = Callable[[str], None]


@dataclass(frozen=True)
class Damage:
    """A damaged file (or directory, where a file belongs), relative to the warehouse."""

    table: str
    rel: str  # its path under the warehouse root
    problem: str  # what failed
    fix: str  # what to do


@dataclass
class Scan:
    """What verification found: per table the files that may be served, and the damage."""

    served: dict[str, list[Path]] = field(default_factory=dict)  # _empty.parquet included
    damaged: list[Damage] = field(default_factory=list)
    checked: int = 0  # files judged (from their verdict or read)
    read: int = 0  # of which read now (no verdict, or it had changed)


@dataclass
class SetAside:
    """A damaged file moved to ``damaged/``: its record in the manifest."""

    damage: Damage
    moved_to: str  # under the warehouse root


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# Lines already printed by this process: a command reads a table more than once.
_told: set[str] = set()


def _say_once(say: Say, line: str) -> None:
    if line not in _told:
        _told.add(line)
        say(line)


# --- verification -------------------------------------------------------------------------


def verify(path: Path, contract: Contract) -> str | None:
    """What is wrong with the Parquet file ``path`` as a file of ``contract``; None: nothing.

    Reads the whole file, a row group at a time, with page checksums verified.
    """
    try:
        pf = open_verified(path)
    except Exception as exc:  # noqa: BLE001 - whatever the reader says, the file is unreadable
        return f"not a readable Parquet file ({_first_line(exc)})"
    try:
        problems = footer_problems(pf.schema_arrow, contract)
        if problems:
            return "; ".join(problems)
        for i in range(pf.num_row_groups):
            problems = value_problems(pf.read_row_group(i), contract)
            if problems:
                return "; ".join(problems)
    except Exception as exc:  # noqa: BLE001 - a page that does not decode or verify
        return f"a damaged page ({_first_line(exc)})"
    finally:
        pf.close()
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _placement(parts: tuple[str, ...], contract: Contract) -> str | None:
    """What is wrong with where a file lies in its table (its partition directories)."""
    for col, part in zip(contract.partition_by, parts[:-1], strict=False):
        key, sep, value = part.partition("=")
        if key != col or not sep or not value:
            return f"lies in {part!r}, not in a {col}=... directory"
        if col == "date":
            try:
                ok = bool(_DAY.fullmatch(value)) and date.fromisoformat(value) is not None
            except ValueError:
                ok = False
            if not ok:
                return f"lies in {part!r}: {value!r} is not a day (YYYY-MM-DD)"
    return None


class _Verdicts:
    """``.verified.json``: what verification said of each file, keyed by its stat."""

    def __init__(self, root: Path, *, trust: bool = True) -> None:
        self.path = root / VERDICTS
        self.entries: dict[str, list[Any]] = {}
        self.changed = False
        if not trust:
            return
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("version") == _VERDICTS_VERSION:
            files = data.get("files")
            if isinstance(files, dict):
                self.entries = files

    @staticmethod
    def _key(st: os.stat_result) -> list[int]:
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]

    def get(self, rel: str, st: os.stat_result) -> tuple[bool, str | None]:
        e = self.entries.get(rel)
        if isinstance(e, list) and len(e) == 5 and e[:4] == self._key(st):
            return True, e[4] if isinstance(e[4], str) else None
        return False, None

    def put(self, rel: str, st: os.stat_result, problem: str | None) -> None:
        self.entries[rel] = [*self._key(st), problem]
        self.changed = True

    def save(self, root: Path) -> None:
        """Write the verdicts atomically; forget files that are gone. Quietly nothing when
        the warehouse cannot be written (the next command verifies again)."""
        if not self.changed:
            return
        self.entries = {k: v for k, v in self.entries.items() if (root / k).exists()}
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"version": _VERDICTS_VERSION, "files": self.entries}))
            _crash_point("verdicts:written")
            os.replace(tmp, self.path)
        except OSError:
            discard(tmp)


def _candidates(wh: Warehouse, contract: Contract) -> tuple[list[Path], Damage | None]:
    """The paths the table's view would read (what its glob names), or the damage of a
    table directory that is not one."""
    d = wh.table_dir(contract)
    if not d.exists() and not d.is_symlink():
        return [], None
    if not d.is_dir():
        return [], Damage(
            contract.name,
            contract.name,
            "a file where the table's directory should be",
            f"nothing once it is moved aside: the next command makes {contract.name}/ again",
        )
    pattern = "/".join(["*"] * len(contract.partition_by) + ["*.parquet"])
    paths = [
        p for p in d.glob(pattern) if not any(s.startswith(".") for s in p.relative_to(d).parts)
    ]
    return sorted(paths), None


def _judge(
    wh: Warehouse, contract: Contract, path: Path, verdicts: _Verdicts, out: Scan
) -> str | None:
    rel = str(path.relative_to(wh.root))
    out.checked += 1
    placed = _placement(path.relative_to(wh.table_dir(contract)).parts, contract)
    if placed:
        return placed
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "a directory where a Parquet file should be"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size == 0:
        return "an empty file (0 bytes)"
    known, problem = verdicts.get(rel, st)
    if known:
        return problem
    out.read += 1
    problem = verify(path, contract)
    verdicts.put(rel, st, problem)
    return problem


def scan(
    wh: Warehouse,
    contracts: Iterable[Contract] | None = None,
    *,
    trust: bool = True,
    save: bool = True,
    fixes: bool = True,
) -> Scan:
    """Judge every file of ``contracts`` (default: every table); change nothing but the
    verdicts (``save``). ``trust``: reuse the verdicts of files that did not change;
    ``fixes``: say what to do about each damaged file (reads the runs rows)."""
    verdicts = _Verdicts(wh.root, trust=trust)
    out = Scan()
    found: list[tuple[Contract, str, str]] = []
    for contract in contracts if contracts is not None else CONTRACTS.values():
        paths, broken = _candidates(wh, contract)
        good = out.served.setdefault(contract.name, [])
        if broken is not None:
            out.damaged.append(broken)
        for path in paths:
            problem = _judge(wh, contract, path, verdicts, out)
            if problem is None:
                good.append(path)
            else:
                found.append((contract, str(path.relative_to(wh.root)), problem))
    if save:
        verdicts.save(wh.root)
    for contract, rel, problem in found:
        fix = fix_for(wh, contract, rel) if fixes else ""
        out.damaged.append(Damage(contract.name, rel, problem, fix))
    return out


# --- what to do ---------------------------------------------------------------------------


def fix_for(wh: Warehouse, contract: Contract, rel: str) -> str:
    """What to do about the damaged file ``rel`` of ``contract``: one clause."""
    path = Path(rel)
    if path.name == EMPTY:
        return "nothing: the next command writes this schema file again"
    if contract.name in ("requests", "quarantine"):
        source = _source_of(wh, path.stem)
        if source:
            return f"re-ingest its source: tracereplay ingest {source}"
        return "re-ingest the log it came from (tracereplay ingest <that log>)"
    if contract.name == "runs":
        return (
            f"re-run the command of run {path.stem}: until then the views hide its rows "
            "in the other tables"
        )
    run = next((p.split("=", 1)[1] for p in path.parts if p.startswith("run_id=")), None)
    command = _command_of(wh, run) if run else None
    return (
        f"re-run the {command or 'command'} that wrote run {run} (tracereplay {command or '...'})"
    )


def _served_runs(wh: Warehouse) -> list[Path]:
    return [
        p
        for p in scan(wh, [RUNS], save=False, fixes=False).served.get("runs", [])
        if p.name != EMPTY
    ]


def _source_of(wh: Warehouse, stem: str) -> str | None:
    """The log a requests or quarantine file ``src-<key>`` came from: from the ingest runs
    rows (each file they ingested), else from the other files of the same source."""
    from pipeline.warehouse import source_key

    key = stem.removeprefix("src-")
    for path in _served_runs(wh):
        try:
            row = pq.read_table(path, columns=["command", "details"]).to_pylist()[0]
            if row["command"] != "ingest":
                continue
            for f in json.loads(row["details"]).get("files", []):
                if source_key(f["path"]) == key:
                    return str(f["path"])
        except Exception:  # noqa: BLE001 - a hint only; the next source may say
            continue
    for name in ("requests", "quarantine"):
        contract = CONTRACTS[name]
        for path in scan(wh, [contract], save=False, fixes=False).served.get(name, []):
            if path.stem != stem:
                continue
            try:
                col = pq.read_table(path, columns=["source_file"]).column(0)
                if len(col):
                    return str(col[0].as_py())
            except Exception:  # noqa: BLE001
                continue
    return None


def _command_of(wh: Warehouse, run: str) -> str | None:
    for path in _served_runs(wh):
        if path.stem == run:
            try:
                return str(pq.read_table(path, columns=["command"]).column(0)[0].as_py())
            except Exception:  # noqa: BLE001
                return None
    return None


# --- setting aside ------------------------------------------------------------------------


def manifest(wh: Warehouse) -> list[dict[str, Any]]:
    """The records of ``damaged/manifest.jsonl`` (none when there is none)."""
    try:
        text = (wh.root / DAMAGED_DIR / MANIFEST).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("path"), str):
            out.append(rec)
    return out


def _write_manifest(wh: Warehouse, records: list[dict[str, Any]]) -> None:
    d = wh.root / DAMAGED_DIR
    d.mkdir(parents=True, exist_ok=True)
    final = d / MANIFEST
    tmp = d / f".{MANIFEST}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
            f.flush()
            os.fsync(f.fileno())
        _crash_point("set-aside:manifest-written")
        os.replace(tmp, final)
    finally:
        discard(tmp)


def _free(wh: Warehouse, rel: str, taken: set[str]) -> str:
    """Where under ``damaged/`` the file ``rel`` goes: its own path, or ``<path>~N``."""
    base = f"{DAMAGED_DIR}/{rel}"
    dest, n = base, 1
    while dest in taken or (wh.root / dest).exists() or (wh.root / dest).is_symlink():
        n += 1
        dest = f"{base}~{n}"
    return dest


def set_aside(wh: Warehouse, damaged: list[Damage], tables: Iterable[str]) -> list[SetAside]:
    """Move ``damaged`` to ``damaged/``, recording each first; hold the warehouse lock.

    ``tables``: the tables that were scanned; their records whose file never moved and
    is not damaged now (it was replaced, or removed) are dropped.

    Raises:
        OSError: the warehouse cannot be written (a file left in place is still recorded,
            and moved by the next command that can).
    """
    root = wh.root
    scanned = set(tables)
    now = {d.rel: d for d in damaged}
    records = []
    pending: dict[str, dict[str, Any]] = {}
    for r in manifest(wh):
        moved = (root / str(r.get("moved_to", ""))).exists()
        if not moved and r["path"] in now and r["path"] not in pending:
            pending[r["path"]] = r
        elif not moved and r.get("table") in scanned:
            continue  # its file is no longer damaged, or gone: the record is void
        records.append(r)
    taken = {str(r.get("moved_to")) for r in records}
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for d in damaged:
        if d.rel not in pending:
            to = _free(wh, d.rel, taken)
            taken.add(to)
            rec = {
                "path": d.rel,
                "moved_to": to,
                "table": d.table,
                "detected_at": when,
                "problem": d.problem,
                "fix": d.fix,
            }
            pending[d.rel] = rec
            records.append(rec)
    _write_manifest(wh, records)
    _crash_point("set-aside:recorded")
    out = []
    for d in damaged:
        rec = pending[d.rel]
        src, dest = root / d.rel, root / rec["moved_to"]
        if not (src.exists() or src.is_symlink()):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dest)
        _crash_point("set-aside:moved")
        out.append(SetAside(d, rec["moved_to"]))
    return out


def runs_set_aside(wh: Warehouse) -> set[str] | None:
    """The run ids whose ``runs`` row was set aside (their other files are kept); None:
    the ``runs`` directory itself was, so no run directory may be taken for stale."""
    ids = set()
    for r in manifest(wh):
        if r.get("table") == "runs":
            if r["path"] == "runs":
                return None
            ids.add(Path(r["path"]).stem)
    return ids


# --- serving ------------------------------------------------------------------------------


def serve(
    wh: Warehouse, contracts: Iterable[Contract] | None = None, *, say: Say = warn
) -> dict[str, list[Path]]:
    """Per table, the files a reader may read (``_empty.parquet`` included).

    Damaged files are left out, each named in one line through ``say`` (once per
    process) with what to do; when this process holds the warehouse lock they are
    moved aside first.
    """
    from pipeline.lock import holds

    chosen = list(contracts) if contracts is not None else list(CONTRACTS.values())
    found = scan(wh, chosen)
    if not found.damaged:
        return found.served
    moved: dict[str, str] = {}
    failed = ""
    if holds(wh.root):
        try:
            moved = {
                s.damage.rel: s.moved_to
                for s in set_aside(wh, found.damaged, (c.name for c in chosen))
            }
        except OSError as exc:
            failed = f" (could not move it aside: {exc.strerror or exc})"
    root = wh.root
    for d in found.damaged:
        if d.rel in moved:
            where = f"moved to {root / moved[d.rel]}"
        else:
            where = f"left out{failed}; `tracereplay check --repair` moves it aside"
        _say_once(say, f"warning: damaged file {root / d.rel}: {d.problem}; {where}; {d.fix}")
    if moved:
        wh.init()  # the schema files and table directories set aside
        return scan(wh, chosen).served
    return found.served


# --- tracereplay check --------------------------------------------------------------------


@dataclass
class CheckResult:
    scan: Scan
    moved: list[SetAside]
    stale: list[Path]  # temporary files of killed commands (removed with repair)
    earlier: int  # records in the manifest from before (files set aside already)


def check(
    wh: Warehouse, *, repair: bool = False, full: bool = False, lock_timeout_s: float = 600.0
) -> CheckResult:
    """Verify every file of the warehouse; with ``repair``, under the lock, set the damaged
    ones aside and remove what killed commands left. Without it, nothing changes (not even
    the verdicts). ``full``: read every file again, whatever the verdicts say."""
    from pipeline.lock import holds, warehouse_lock
    from pipeline.objectstore import remote_of

    if not repair and remote_of(wh.root) is not None and not holds(wh.root):
        # an s3:// warehouse: its mirror brought to the last commit (under the lock, which
        # commits nothing when nothing changed), then judged like a directory
        with warehouse_lock(wh.root, timeout_s=lock_timeout_s, clean=False):
            return check(wh, full=full)
    if not repair:
        found = scan(wh, trust=not full, save=False)
        return CheckResult(found, [], _stale(wh), len(manifest(wh)))

    with warehouse_lock(wh.root, timeout_s=lock_timeout_s, clean=False):
        earlier = len(manifest(wh))
        stale = wh.remove_stale()
        found = scan(wh, trust=not full)
        moved = set_aside(wh, found.damaged, CONTRACTS) if found.damaged else []
        if moved:
            wh.init()
        return CheckResult(found, moved, stale, earlier)


def _stale(wh: Warehouse) -> list[Path]:
    out: list[Path] = []
    for contract in CONTRACTS.values():
        d = wh.table_dir(contract)
        if d.is_dir():
            out += d.rglob(".*.tmp-*")
    return sorted(out)
