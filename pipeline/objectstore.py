"""A warehouse, inbox or log source at ``s3://bucket/prefix`` on any S3-compatible store.

The code of a local warehouse is the one code path; this module puts an object store
under it:

- **Writers** (``ingest``, ``replay``, ``sweep``, ``capacity``, ``run``, ``nightly``)
  work on a local mirror of the warehouse (``mirror``), under the store's lock. Taking
  the lock (``session``) brings the mirror to the last committed state; releasing it
  commits: every file that is new or changed is uploaded under a prefix of its own,
  ``_data/<commit id>/<path in the warehouse>``, and then one manifest object,
  ``_manifests/<sequence number>.json``, names every file of the new state. The
  manifest is the commit: an object store has no rename, so a reader never lists
  ``_data/``, it reads only what the latest manifest names. The upload of a killed
  command is named by no manifest and so is invisible; the next writer removes it
  (``collect``), along with what only manifests older than the last ``KEEP`` name.
- **Readers** (``sql``, ``report``, ``compare``) read the latest manifest and query its
  files in place: each table is an Arrow dataset over the store (``pyarrow.dataset`` with
  ``pyarrow.fs.S3FileSystem``), registered on the sandboxed DuckDB connection under the
  name the views read (``sql/views.sql`` unchanged). DuckDB's own ``httpfs`` extension is
  not used: the sandbox loads no extension, and this way credentials are read once, the
  AWS way, for every reader.
- **The lock** is a lease object, ``_lock.json``, created with a conditional put
  (``If-None-Match: *``, which only one writer can win); it records the holder's pid,
  host, command and start, and an expiry that the holder renews (``If-Match``) every
  third of ``LEASE_S``. A lease past its expiry, or one whose holder on this host is
  gone, is taken over. Waiting, its messages and ``--lock-timeout-s`` are the local
  lock's (``pipeline.lock``).
- **Log sources and the nightly inbox** (``fetch``): the objects a ``s3://`` glob
  matches are downloaded to a temporary directory for the command and read as files;
  the warehouse records them by their URI (``source_name``).

Credentials, region and endpoint come from the standard AWS variables and files:
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), ``AWS_PROFILE``
with ``~/.aws/config`` and ``~/.aws/credentials``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` (for MinIO, Ceph, R2, ...). The conditional
puts need ``boto3`` (``pip install 'tracereplay[s3]'``): pyarrow's file system cannot
make them.
"""

from __future__ import annotations

import atexit
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pipeline.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    import duckdb
    import pyarrow.fs as pafs

SCHEME = "s3://"
MANIFESTS = "_manifests"
DATA = "_data"
LOCK = "_lock.json"
STATE = ".remote.json"  # in the mirror: which object each file came from
KEEP = 3  # manifests kept (a reader that read an older one may still be reading)
LEASE_S = float(os.environ.get("TRACEREPLAY_S3_LEASE_S", "60"))
POLL_S = 0.2
# Tests: kill -9 this process at the named point ("s3:uploaded").
CRASH_AT = "TRACEREPLAY_CRASH_AT"

# not the warehouse's own state: the local lock, the mirror's bookkeeping, the verdicts
# of this machine's verification, reports (uploaded as plain objects, see ``publish``)
_LOCAL_ONLY = {".lock", STATE, ".verified.json"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_TEMPORARY = re.compile(r"^\..*\.tmp-")


class ObjectStoreError(PipelineError):
    """The object store refused or could not be reached: one line with the fix."""


@dataclass(frozen=True)
class Remote:
    """A warehouse (or a source glob) at ``s3://bucket/prefix``."""

    bucket: str
    prefix: str  # without slashes at either end; "" for the bucket's root

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def path(self, key: str) -> str:
        """``bucket/key``, as pyarrow's file system names an object."""
        return f"{self.bucket}/{key}"


def is_remote(value: object) -> bool:
    return str(value).startswith(SCHEME)


def parse(uri: str) -> Remote:
    """``s3://bucket/prefix`` as a ``Remote``.

    Raises:
        ConfigError: not such a URI, or a bucket name S3 does not allow.
    """
    rest = str(uri)[len(SCHEME) :] if is_remote(uri) else ""
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"{uri}: not an object store location; write s3://BUCKET/PREFIX with a bucket "
            "name of 3-63 lowercase letters, digits, dots and hyphens"
        )
    return Remote(bucket, prefix.strip("/"))


# --- clients ------------------------------------------------------------------------------


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


_fs: dict[tuple[str | None, str | None], pafs.S3FileSystem] = {}


def filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 file system, configured from the AWS variables (one per process).

    pyarrow reads the keys, ``AWS_PROFILE`` and the ``~/.aws`` files itself (the AWS
    SDK's chain); the endpoint and region it is given here.
    """
    import pyarrow.fs as pafs

    endpoint, region = _endpoint(), _region()
    if (endpoint, region) not in _fs:
        kwargs: dict[str, Any] = {
            "allow_bucket_creation": False,
            "allow_bucket_deletion": False,
            "connect_timeout": 5,
            "request_timeout": 60,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
        }
        if endpoint:
            scheme, _, host = endpoint.rpartition("://")
            kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme or "https")
        if region:
            kwargs["region"] = region
        _fs[(endpoint, region)] = pafs.S3FileSystem(**kwargs)
    return _fs[(endpoint, region)]


_clients: dict[tuple[str | None, str | None], Any] = {}


def client() -> Any:
    """A boto3 S3 client for the conditional puts of the lock and the manifests."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError(
            "an s3:// warehouse needs boto3 for its lock and commits: pip install 'tracereplay[s3]'"
        ) from None
    endpoint, region = _endpoint(), _region()
    if (endpoint, region) not in _clients:
        config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3})
        _clients[(endpoint, region)] = boto3.client(
            "s3", endpoint_url=endpoint, region_name=region, config=config
        )
    return _clients[(endpoint, region)]


def explain(exc: BaseException, remote: Remote) -> ObjectStoreError | None:
    """The one-line error of a refusal by the store, or None when ``exc`` is not one."""
    code, text = _code(exc)
    uri = remote.uri
    creds = (
        "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and that they may "
        f"read and write s3://{remote.bucket}"
    )
    if code == "NoSuchBucket" or "NO_SUCH_BUCKET" in text:
        return _no_bucket(remote)
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or any(
        s in text for s in ("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch")
    ):
        return ObjectStoreError(f"{uri}: the store refused the credentials ({code}); {creds}")
    if code in ("NoCredentialsError", "PartialCredentialsError"):
        return ObjectStoreError(f"{uri}: no AWS credentials found; {creds}")
    if code in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError") or any(
        s in text for s in ("NETWORK_CONNECTION", "Couldn't connect", "Could not resolve")
    ):
        return ObjectStoreError(
            f"{uri}: cannot reach the object store at {_endpoint() or 'AWS S3'}; check the "
            "network and AWS_ENDPOINT_URL (AWS_REGION for AWS itself)"
        )
    return None


def _no_bucket(remote: Remote) -> ObjectStoreError:
    return ObjectStoreError(
        f"{remote.uri}: bucket {remote.bucket!r} does not exist at {_endpoint() or 'AWS S3'}; "
        "create it, or fix the bucket name or AWS_ENDPOINT_URL"
    )


def _code(exc: BaseException) -> tuple[str, str]:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "")), str(exc)
    return type(exc).__name__, str(exc)


@contextmanager
def refusals(remote: Remote) -> Iterator[None]:
    """Within the block, a refusal by the store comes out as one ``ObjectStoreError``."""
    try:
        yield
    except ObjectStoreError:
        raise
    except Exception as exc:
        err = explain(exc, remote)
        if err is None:
            raise
        raise err from exc


# --- mirrors: where a writer works on the warehouse ----------------------------------------

_mirrors: dict[Path, Remote] = {}


def cache_dir() -> Path:
    base = os.environ.get("TRACEREPLAY_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "tracereplay" if base else Path.home() / ".cache" / "tracereplay"


def mirror(uri: str) -> Path:
    """The local directory that stands for the warehouse at ``uri`` (made, and known to
    ``remote_of`` from now on)."""
    remote = parse(uri)
    digest = hashlib.sha1(remote.uri.encode()).hexdigest()[:8]
    root = cache_dir() / "s3" / remote.bucket / f"{remote.prefix.replace('/', '_')}-{digest}"
    root.mkdir(parents=True, exist_ok=True)
    _mirrors[root.resolve()] = remote
    return root


def remote_of(root: Path) -> Remote | None:
    """The object store a warehouse directory mirrors, if it is a mirror."""
    return _mirrors.get(Path(root).resolve()) if _mirrors else None


def display(root: Path) -> str:
    """How to name the warehouse at ``root`` to the user: its URI when it is a mirror."""
    remote = remote_of(root)
    return remote.uri if remote else str(root)


def _managed(root: Path) -> Iterator[tuple[str, Path]]:
    """(path in the warehouse, file) of every file a commit carries."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d != "reports"]
        for name in filenames:
            if (here == root and name in _LOCAL_ONLY) or _TEMPORARY.match(name):
                continue
            p = here / name
            yield p.relative_to(root).as_posix(), p


@dataclass
class Manifest:
    seq: int
    files: dict[str, dict[str, Any]]  # path in the warehouse -> {"key", "size"}


def latest(remote: Remote) -> Manifest:
    """The last committed manifest (sequence 0 and no files before the first commit)."""
    import pyarrow.fs as pafs

    fs = filesystem()
    with refusals(remote):
        bucket = fs.get_file_info(remote.bucket)
        if bucket.type == pafs.FileType.NotFound:
            raise _no_bucket(remote)
        found = fs.get_file_info(
            pafs.FileSelector(remote.path(remote.key(MANIFESTS)), allow_not_found=True)
        )
        names = sorted(i.base_name for i in found if re.fullmatch(r"\d{12}\.json", i.base_name))
        if not names:
            return Manifest(0, {})
        with fs.open_input_stream(remote.path(remote.key(f"{MANIFESTS}/{names[-1]}"))) as f:
            data = json.loads(f.read())
    return Manifest(int(data["seq"]), dict(data["files"]))


def _load_state(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / STATE).read_text())
    except (OSError, ValueError):
        return {"seq": -1, "files": {}}
    return data if isinstance(data, dict) else {"seq": -1, "files": {}}


def _save_state(root: Path, seq: int, files: dict[str, dict[str, Any]]) -> None:
    from pipeline.storage import write_atomic

    write_atomic(root / STATE, json.dumps({"seq": seq, "files": files}))


def sync(remote: Remote, root: Path, manifest: Manifest) -> int:
    """Make the mirror at ``root`` the state ``manifest`` names; how many files it fetched.

    A file already fetched from the same object (and not changed since) stays: objects
    under ``_data/`` are never rewritten, so the same key is the same content.
    """
    fs = filesystem()
    state = _load_state(root)["files"]
    files: dict[str, dict[str, Any]] = {}
    fetched = 0
    with refusals(remote):
        for rel, ent in manifest.files.items():
            p = root / rel
            cur = state.get(rel)
            if cur and cur.get("key") == ent["key"] and _same(p, cur):
                files[rel] = cur
                continue
            _download(fs, remote.path(ent["key"]), p)
            fetched += 1
            st = p.stat()
            files[rel] = {"key": ent["key"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    for rel, p in list(_managed(root)):
        if rel not in manifest.files:
            p.unlink(missing_ok=True)
    _save_state(root, manifest.seq, files)
    return fetched


def _same(p: Path, ent: dict[str, Any]) -> bool:
    try:
        st = p.stat()
    except OSError:
        return False
    return st.st_size == ent.get("size") and st.st_mtime_ns == ent.get("mtime_ns")


def _download(fs: pafs.S3FileSystem, src: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with fs.open_input_stream(src) as f, open(tmp, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)  # type: ignore[misc]
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _upload(fs: pafs.S3FileSystem, src: Path, dest: str) -> None:
    with open(src, "rb") as f, fs.open_output_stream(dest) as out:
        shutil.copyfileobj(f, out, 1 << 20)  # type: ignore[misc]


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def commit(remote: Remote, root: Path, commit_id: str, lease: Lease) -> int | None:
    """Upload what changed in the mirror and commit it with the next manifest.

    Returns the new manifest's sequence number, or None when nothing changed.
    """
    fs = filesystem()
    state = _load_state(root)
    old: dict[str, dict[str, Any]] = state["files"]
    files: dict[str, dict[str, Any]] = {}
    changed = False
    with refusals(remote):
        for rel, p in _managed(root):
            cur = old.get(rel)
            if cur and _same(p, cur):
                files[rel] = cur
                continue
            key = remote.key(f"{DATA}/{commit_id}/{rel}")
            st = p.stat()
            _upload(fs, p, remote.path(key))
            files[rel] = {"key": key, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            changed = True
        changed = changed or set(files) != set(old)
        publish_reports(remote, root)
        if not changed:
            return None
        _crash_point("s3:uploaded")
        lease.check()
        seq = int(state["seq"]) + 1
        body = {
            "seq": seq,
            "commit": commit_id,
            "written_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "files": {r: {"key": e["key"], "size": e["size"]} for r, e in sorted(files.items())},
        }
        key = remote.key(f"{MANIFESTS}/{seq:012d}.json")
        try:
            client().put_object(
                Bucket=remote.bucket,
                Key=key,
                Body=json.dumps(body, indent=1).encode(),
                IfNoneMatch="*",
                ContentType="application/json",
            )
        except Exception as exc:
            if _code(exc)[0] in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise ObjectStoreError(
                    f"{remote.uri}: another writer committed manifest {seq} while this command "
                    "ran (its lock lease had expired); rerun the command"
                ) from None
            raise
    _save_state(root, seq, files)
    return seq


def collect(remote: Remote) -> list[str]:
    """Remove what no kept manifest names: the uploads of commands that never committed,
    and the files and manifests older than the last ``KEEP``; return the keys removed.
    Hold the lock: then no writer is uploading."""
    import pyarrow.fs as pafs

    fs = filesystem()
    removed: list[str] = []
    with refusals(remote):
        infos = fs.get_file_info(
            pafs.FileSelector(remote.path(remote.key(MANIFESTS)), allow_not_found=True)
        )
        names = sorted(i.path for i in infos if re.search(r"/\d{12}\.json$", i.path))
        keep, drop = names[-KEEP:], names[:-KEEP]
        named: set[str] = set()
        for path in keep:
            with fs.open_input_stream(path) as f:
                named |= {e["key"] for e in json.loads(f.read())["files"].values()}
        data = fs.get_file_info(
            pafs.FileSelector(remote.path(remote.key(DATA)), recursive=True, allow_not_found=True)
        )
        for info in data:
            key = info.path.split("/", 1)[1]
            if info.type == pafs.FileType.File and key not in named:
                removed.append(key)
        removed += [path.split("/", 1)[1] for path in drop]
        # by boto3, in batches: pyarrow's delete_file leaves a marker object for the
        # "directory" it empties
        for i in range(0, len(removed), 1000):
            client().delete_objects(
                Bucket=remote.bucket,
                Delete={"Objects": [{"Key": k} for k in removed[i : i + 1000]], "Quiet": True},
            )
    return removed


def publish_reports(remote: Remote, root: Path) -> list[str]:
    """Upload the mirror's reports that the store lacks (a report is one object, whole)."""
    import pyarrow.fs as pafs

    fs = filesystem()
    out: list[str] = []
    reports = root / "reports"
    if not reports.is_dir():
        return out
    for p in sorted(reports.rglob("*")):
        if not p.is_file() or _TEMPORARY.match(p.name):
            continue
        dest = remote.path(remote.key(p.relative_to(root).as_posix()))
        info = fs.get_file_info(dest)
        if info.type == pafs.FileType.File and info.size == p.stat().st_size:
            continue
        _upload(fs, p, dest)
        out.append(f"{SCHEME}{dest}")
    return out


def publish(root: Path, path: Path) -> str | None:
    """Upload the report ``path`` written in the mirror ``root``; its URI (None: not one)."""
    remote = remote_of(root)
    if remote is None or not Path(path).resolve().is_relative_to(Path(root).resolve()):
        return None
    rel = Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    with refusals(remote):
        _upload(filesystem(), Path(path), remote.path(remote.key(rel)))
    return f"{remote.uri}/{rel}"


# --- the lock -----------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lease:
    """The store's lock object, held (and renewed) by this process."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.key = remote.key(LOCK)
        self.etag: str | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._record: dict[str, Any] = {}

    def holder(self) -> tuple[dict[str, Any] | None, str | None]:
        """(what the lock object says, its ETag); (None, None) when there is none."""
        try:
            obj = client().get_object(Bucket=self.remote.bucket, Key=self.key)
        except Exception as exc:
            if _code(exc)[0] in ("NoSuchKey", "404"):
                return None, None
            raise
        try:
            info = json.loads(obj["Body"].read())
        except ValueError:
            info = None
        return (info if isinstance(info, dict) else {}), obj["ETag"]

    def _body(self) -> bytes:
        self._record["expires"] = time.time() + LEASE_S
        return json.dumps(self._record).encode()

    def try_acquire(self, command: str) -> bool:
        self._record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command,
            "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        try:
            r = client().put_object(
                Bucket=self.remote.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*"
            )
        except Exception as exc:
            if _code(exc)[0] in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        self.etag = r["ETag"]
        self._thread = threading.Thread(target=self._renew, name="s3-lease", daemon=True)
        self._thread.start()
        return True

    def break_if_stale(self, info: dict[str, Any] | None, etag: str | None) -> bool:
        """Remove a lease past its expiry, or one whose holder on this host is gone."""
        if etag is None or info is None:
            return False
        expired = float(info.get("expires", 0)) < time.time()
        pid = info.get("pid")
        dead_here = (
            info.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid)
        )
        if not (expired or dead_here):
            return False
        try:
            client().delete_object(Bucket=self.remote.bucket, Key=self.key, IfMatch=etag)
        except Exception as exc:
            if _code(exc)[0] not in ("PreconditionFailed", "NoSuchKey", "404"):
                raise
        return True

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_S / 3):
            try:
                r = client().put_object(
                    Bucket=self.remote.bucket, Key=self.key, Body=self._body(), IfMatch=self.etag
                )
                self.etag = r["ETag"]
            except Exception as exc:
                if _code(exc)[0] in ("PreconditionFailed", "NoSuchKey", "404"):
                    self.lost = True
                    return
                # a passing network error: the next renewal tries again

    def check(self) -> None:
        if self.lost:
            raise ObjectStoreError(
                f"{self.remote.uri}: this command lost the warehouse lock (its lease expired "
                f"and another command took it); nothing of it was committed: rerun it"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.etag and not self.lost:
            try:
                client().delete_object(Bucket=self.remote.bucket, Key=self.key, IfMatch=self.etag)
            except Exception:  # noqa: BLE001 - it expires all the same
                pass


@contextmanager
def session(
    remote: Remote,
    root: Path,
    *,
    timeout_s: float,
    command: str,
    on_wait: Callable[[str], None],
    describe: Callable[[dict[str, Any] | None], str],
    timeout_error: type[PipelineError],
    clean: bool = True,
) -> Iterator[None]:
    """Hold the store's lock for the block, with the mirror at ``root`` brought to the last
    commit first (and what killed writers left removed), and commit it when the block ends
    (also when it fails: what landed whole stays, as in a local warehouse). ``clean``:
    remove the uploads of killed commands and the old commits (``collect``)."""
    from pipeline.warehouse import new_run_id

    lease = Lease(remote)
    uri = remote.uri
    with refusals(remote):
        latest(remote)  # a missing bucket or refused credentials: one line, now
        deadline = time.monotonic() + timeout_s
        told = False
        while not lease.try_acquire(command):
            info, etag = lease.holder()
            if lease.break_if_stale(info, etag) or etag is None:
                continue
            if time.monotonic() >= deadline:
                raise timeout_error(
                    f"warehouse {uri} is locked by {describe(info)}; gave up after "
                    f"{timeout_s:g} s: wait for it to finish, or pass a longer "
                    "--lock-timeout-s"
                )
            if not told:
                on_wait(
                    f"waiting for the warehouse lock of {uri}, held by {describe(info)}; "
                    f"giving up after {timeout_s:g} s (--lock-timeout-s)"
                )
                told = True
            time.sleep(POLL_S)
    try:
        with refusals(remote):
            sync(remote, root, latest(remote))
            if clean:
                collect(remote)
        commit_id = new_run_id()
        try:
            yield
        except BaseException:
            try:
                commit(remote, root, commit_id, lease)
            except Exception as exc:  # noqa: BLE001 - the command's own error is what matters
                print(f"warning: {uri}: could not commit what landed: {exc}", file=sys.stderr)
            raise
        if commit(remote, root, commit_id, lease) is not None:
            with refusals(remote):
                collect(remote)
    finally:
        lease.release()


# --- readers ------------------------------------------------------------------------------


def connect(remote: Remote) -> duckdb.DuckDBPyConnection:
    """A sandboxed DuckDB connection with the views of ``sql/views.sql`` over the files
    the latest manifest names, each table an Arrow dataset read in place."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from pipeline import sandbox
    from pipeline.contracts import CONTRACTS
    from pipeline.warehouse import VIEWS_SQL, load_sql, view_sources

    manifest = latest(remote)
    fs = filesystem()
    datasets = {}
    for name, contract in CONTRACTS.items():
        depth = len(contract.partition_by) + 1
        paths = sorted(
            remote.path(e["key"])
            for rel, e in manifest.files.items()
            if rel.startswith(f"{name}/")
            and len(PurePosixPath(rel).parts) == depth + 1
            and rel.endswith(".parquet")
            and not rel.endswith("/_empty.parquet")
        )
        part = pa.schema(
            [f for f in contract.schema(with_partitions=True) if f.name in contract.partition_by]
        )
        datasets[f"_store_{name}"] = ds.dataset(
            paths,
            schema=contract.schema(with_partitions=True),
            filesystem=fs,
            format="parquet",
            partitioning=ds.partitioning(part, flavor="hive") if contract.partition_by else None,
        )
    text = view_sources(load_sql(VIEWS_SQL), lambda table, _options: f"_store_{table}")
    con = sandbox.connect(datasets=datasets)
    try:
        with refusals(remote):
            con.execute(text)
    except BaseException:
        con.close()
        raise
    return con


# --- sources ------------------------------------------------------------------------------

_fetched: dict[Path, str] = {}  # downloaded file -> its URI
_tmp: list[Path] = []


def source_name(path: Path) -> str:
    """The name of a source file as the warehouse records it: its URI when it was fetched
    from an object store, else its path."""
    return _fetched.get(Path(path).resolve(), str(path)) if _fetched else str(path)


def _scratch() -> Path:
    if not _tmp:
        d = Path(tempfile.mkdtemp(prefix="tracereplay-s3-"))
        _tmp.append(d)
        atexit.register(shutil.rmtree, d, True)
    return _tmp[0]


def fetch(pattern: str, *, must_match: bool = True) -> list[Path]:
    """Download the objects ``s3://bucket/key-glob`` names (``*``, ``?``, ``[...]``, and
    ``**`` across ``/``) to a temporary directory; the local files, sorted by key.

    Raises:
        ObjectStoreError: the store refused (missing bucket, credentials, network).
        SourceError: nothing matches (with ``must_match``).
    """
    import pyarrow.fs as pafs

    from pipeline.errors import SourceError

    remote = parse(pattern)
    glob_part = remote.prefix
    fixed = re.split(r"[*?\[]", glob_part, maxsplit=1)[0]
    base = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
    fs = filesystem()
    out: list[Path] = []
    with refusals(remote):
        info = fs.get_file_info(remote.path(glob_part)) if glob_part else None
        if info is not None and info.type == pafs.FileType.File:
            keys = [glob_part]
        else:
            if fs.get_file_info(remote.bucket).type == pafs.FileType.NotFound:
                raise _no_bucket(remote)
            listed = fs.get_file_info(
                pafs.FileSelector(remote.path(base), recursive=True, allow_not_found=True)
            )
            literal = not re.search(r"[*?\[]", glob_part)
            keys = sorted(
                k
                for i in listed
                if i.type == pafs.FileType.File
                for k in [i.path.split("/", 1)[1]]
                if (k.startswith(glob_part.rstrip("/") + "/") if literal else _match(k, glob_part))
            )
        if not keys and must_match:
            raise SourceError(pattern, "no object matches; check the bucket, prefix and glob")
        scratch = _scratch()
        for key in keys:
            local = scratch / remote.bucket / key
            _download(fs, remote.path(key), local)
            _fetched[local.resolve()] = f"{SCHEME}{remote.bucket}/{key}"
            out.append(local)
    return out


def _match(key: str, pattern: str) -> bool:
    """A key against a glob: ``*``, ``?`` and ``[...]`` within one ``/`` segment, a
    ``**`` segment across any number of them."""
    return _match_parts(key.split("/"), pattern.split("/"))


def _match_parts(key: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not key
    if pattern[0] == "**":
        return any(_match_parts(key[i:], pattern[1:]) for i in range(len(key) + 1))
    return (
        bool(key) and fnmatch.fnmatchcase(key[0], pattern[0]) and _match_parts(key[1:], pattern[1:])
    )
