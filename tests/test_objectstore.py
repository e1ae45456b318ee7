"""A warehouse, nightly inbox and log sources on a real S3-compatible server (moto's).

The server is ``moto[server]`` (the ``test`` extra), started once per session on a free
port of 127.0.0.1; each test gets its own bucket and the standard AWS variables pointing
at it. Nothing of the store is mocked: the commands talk S3 over HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.warehouse import Warehouse
from tests.gateway_logs import gateway_lines

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "azure_conv.csv"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto's server did not listen within 60 s")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    proc, url = _start_server()
    yield url
    proc.terminate()
    proc.wait(timeout=30)


_buckets = iter(range(10**6))


@pytest.fixture
def s3(s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh bucket, and the AWS variables (and a cache directory) for it."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_server,
        "TRACEREPLAY_CACHE_DIR": str(tmp_path / "cache"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bucket = f"wh-{os.getpid()}-{next(_buckets)}"
    client().create_bucket(Bucket=bucket)
    return {**env, "bucket": bucket, "uri": f"s3://{bucket}/prod"}


def client() -> Any:
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def keys(bucket: str, prefix: str = "") -> list[str]:
    pages = client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def invoke(*args: str) -> Any:
    r = CliRunner().invoke(cli, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r


def scalar(uri: str, sql: str) -> Any:
    r = invoke("sql", sql, "--warehouse", uri, "--format", "json")
    assert r.exit_code == 0, r.output
    return next(iter(json.loads(r.output)[0].values()))


def local_scalar(root: Path, sql: str) -> Any:
    con = Warehouse(root).connect()
    row = con.execute(sql).fetchone()
    con.close()
    assert row is not None
    return row[0]


def tracereplay(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **{k: v for k, v in env.items() if k.isupper()}},
        cwd=REPO,
    )


def test_ingest_replay_sql_report_compare_on_the_store(s3: dict[str, str], tmp_path: Path) -> None:
    uri = s3["uri"]
    assert invoke("ingest", str(SAMPLE), "--warehouse", uri, "--quiet").exit_code == 0
    local = tmp_path / "local"
    assert invoke("ingest", str(SAMPLE), "--warehouse", str(local), "--quiet").exit_code == 0
    # the same rows as a local warehouse of the same log, read from the store
    q = "SELECT count(*) || ':' || sum(prompt_tokens) || ':' || min(arrival_s) FROM requests"
    assert scalar(uri, q) == local_scalar(local, q)
    # the store holds manifests and data, nothing else the readers could list
    names = keys(s3["bucket"], "prod/")
    assert any(k.startswith("prod/_manifests/") for k in names)
    assert all(k.split("/")[1] in ("_manifests", "_data") for k in names)

    runs = []
    for seqs in ("16", "64"):
        r = invoke(
            "replay", "--policy", "vllm", "--max-num-seqs", seqs, "--no-intervals",
            "--warehouse", uri, "--json",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        runs.append(json.loads(r.output)["run_id"])
    # read with no mirror at all: only the store has the runs
    for d in (tmp_path / "cache").rglob("*"):
        if d.is_file():
            d.unlink()
    seen = scalar(uri, "SELECT string_agg(DISTINCT run_id, ',' ORDER BY run_id) FROM sim_requests")
    assert seen.split(",") == sorted(runs)
    r = invoke("compare", *runs, "--warehouse", uri, "--json")
    assert r.exit_code == 0, r.output
    assert runs[0] in r.output and runs[1] in r.output
    r = invoke("report", runs[1], "--warehouse", uri, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert Path(out["html"]).is_file()
    assert out["uploaded"].startswith(f"{uri}/reports/{runs[1]}/")
    assert out["uploaded"].removeprefix(f"s3://{s3['bucket']}/") in keys(s3["bucket"])


def test_log_sources_on_the_store_are_read_and_named_by_uri(
    s3: dict[str, str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for day in (0, 1):
        (logs / f"day{day}.jsonl").write_text(gateway_lines(range(day * 200, day * 200 + 200)))
        client().upload_file(str(logs / f"day{day}.jsonl"), s3["bucket"], f"logs/day{day}.jsonl")
    client().put_object(Bucket=s3["bucket"], Key="logs/notes.txt", Body=b"not a log")
    src = f"s3://{s3['bucket']}/logs/*.jsonl"
    r = invoke("ingest", src, "--warehouse", s3["uri"], "--json")
    assert r.exit_code == 0, r.output
    local = tmp_path / "local"
    assert invoke("ingest", str(logs / "day0.jsonl"), str(logs / "day1.jsonl"),
                  "--warehouse", str(local), "--quiet").exit_code == 0  # fmt: skip
    q = "SELECT count(*) || ':' || sum(output_tokens) FROM requests"
    assert scalar(s3["uri"], q) == local_scalar(local, q)
    named = scalar(
        s3["uri"], "SELECT string_agg(DISTINCT source_file, ',' ORDER BY source_file) FROM requests"
    )
    assert named.split(",") == [f"s3://{s3['bucket']}/logs/day{d}.jsonl" for d in (0, 1)]
    # ingesting the same objects again replaces what they wrote: nothing doubles
    assert invoke("ingest", src, "--warehouse", s3["uri"], "--quiet").exit_code == 0
    assert scalar(s3["uri"], q) == local_scalar(local, q)
    # a selection written from the bucket's warehouse, replayed from the bucket
    picked = tmp_path / "day1.parquet"
    r = invoke("sql", "SELECT * FROM requests WHERE source_file LIKE '%day1%'",
               "--warehouse", s3["uri"], "--format", "parquet", "-o", str(picked))  # fmt: skip
    assert r.exit_code == 0, r.output
    client().upload_file(str(picked), s3["bucket"], "sel/day1.parquet")
    other = tmp_path / "other"
    r = invoke("replay", "--requests", f"s3://{s3['bucket']}/sel/day1.parquet", "--policy",
               "vllm", "--no-intervals", "--warehouse", str(other), "--quiet")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert local_scalar(other, "SELECT count(*) FROM sim_requests") == local_scalar(
        local, "SELECT count(*) FROM requests WHERE source_file LIKE '%day1%'"
    )


def test_a_killed_write_stays_invisible_and_the_next_writer_removes_it(
    s3: dict[str, str], tmp_path: Path
) -> None:
    uri, bucket = s3["uri"], s3["bucket"]
    assert invoke("ingest", str(SAMPLE), "--warehouse", uri, "--quiet").exit_code == 0
    before = scalar(uri, "SELECT count(*) FROM requests")
    log = tmp_path / "more.jsonl"
    log.write_text(gateway_lines(range(300)))
    committed = set(keys(bucket, "prod/_data/"))
    p = tracereplay(
        {**s3, "TRACEREPLAY_CRASH_AT": "s3:uploaded"}, "ingest", str(log), "--warehouse", uri
    )
    _, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL, err
    orphans = set(keys(bucket, "prod/_data/")) - committed
    assert any("/requests/" in k for k in orphans)  # its files were uploaded ...
    assert scalar(uri, "SELECT count(*) FROM requests") == before  # ... and are not seen
    # the killed holder's lease is taken over (its pid is gone) and its upload removed
    assert invoke("ingest", str(SAMPLE), "--warehouse", uri, "--quiet").exit_code == 0
    assert not orphans & set(keys(bucket, "prod/_data/"))
    assert scalar(uri, "SELECT count(*) FROM requests") == before


def test_two_writers_at_once_end_as_one_after_the_other(s3: dict[str, str], tmp_path: Path) -> None:
    logs = []
    for i in range(2):
        logs.append(tmp_path / f"w{i}.jsonl")
        logs[-1].write_text(gateway_lines(range(i * 1000, i * 1000 + 1000)))
    # two machines, as it were: each its own mirror of the warehouse, only the store shared
    procs = [
        tracereplay(
            {**s3, "TRACEREPLAY_CACHE_DIR": str(tmp_path / f"cache{i}")},
            "ingest",
            str(f),
            "--warehouse",
            s3["uri"],
            "--quiet",
        )  # fmt: skip
        for i, f in enumerate(logs)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert scalar(s3["uri"], "SELECT count(DISTINCT source_file) FROM requests") == 2
    assert scalar(s3["uri"], "SELECT count(DISTINCT request_id) FROM requests") == 2000


def test_a_held_lock_names_its_holder_and_times_out(s3: dict[str, str], tmp_path: Path) -> None:
    from pipeline import objectstore

    lease = objectstore.Lease(objectstore.parse(s3["uri"]))
    assert lease.try_acquire("tracereplay nightly prod.toml")
    try:
        p = tracereplay(
            s3, "ingest", str(SAMPLE), "--warehouse", s3["uri"], "--lock-timeout-s", "1"
        )
        _, err = p.communicate(timeout=300)
        assert p.returncode == 1
        lines = err.strip().splitlines()
        assert lines[0].startswith(f"waiting for the warehouse lock of {s3['uri']}, held by pid ")
        assert lines[-1].startswith(f"Error: warehouse {s3['uri']} is locked by pid {os.getpid()}")
        assert "(tracereplay nightly prod.toml, since" in lines[-1]
        assert "--lock-timeout-s" in lines[-1]
    finally:
        lease.release()
    assert invoke("ingest", str(SAMPLE), "--warehouse", s3["uri"], "--quiet").exit_code == 0


def test_nightly_inbox_on_the_store_ingests_new_objects_only(
    s3: dict[str, str], tmp_path: Path
) -> None:
    bucket = s3["bucket"]
    (tmp_path / "nightly.toml").write_text(
        f'[nightly]\nwarehouse = "{s3["uri"]}"\ninbox = ["s3://{bucket}/inbox/*.jsonl"]\n'
        'keep_nights = 2\n[[scenario]]\nname = "prod"\npolicy = "vllm"\nmax_num_seqs = 32\n'
    )
    body = gateway_lines(range(300), day=0, spacing_s=2)
    client().put_object(Bucket=bucket, Key="inbox/day0.jsonl", Body=body.encode())

    def night() -> dict[str, Any]:
        r = CliRunner().invoke(cli, ["nightly", str(tmp_path / "nightly.toml"), "--json"])
        assert r.exception is None or isinstance(r.exception, SystemExit), r.output
        return dict(json.loads(r.output))

    first = night()
    assert first["errors"] == []
    assert [f["path"] for f in first["inbox"]["new_or_changed"]] == [
        f"s3://{bucket}/inbox/day0.jsonl"
    ]
    second = night()
    assert second["inbox"] == {"matched": 1, "skipped_unchanged": 1, "new_or_changed": []}
    assert scalar(s3["uri"], "SELECT count(*) FROM requests") == 300


def _one_line_error(r: Any) -> str:
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert "Traceback" not in r.output
    return str(lines[0])


@pytest.mark.parametrize("command", [["sql", "SELECT 1"], ["ingest", str(SAMPLE)]])
def test_a_bad_uri_or_a_missing_bucket_is_one_line(s3: dict[str, str], command: list[str]) -> None:
    line = _one_line_error(invoke(*command, "--warehouse", "s3://Not_A_Bucket/x"))
    assert "s3://Not_A_Bucket/x" in line and "bucket name" in line
    line = _one_line_error(invoke(*command, "--warehouse", "s3://no-such-bucket-here/x"))
    assert "bucket 'no-such-bucket-here' does not exist" in line
    assert "create it" in line


def test_refused_credentials_are_one_line(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a second server that checks every request against its (empty) IAM: no key is valid
    proc, url = _start_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        for command in (["sql", "SELECT 1"], ["ingest", str(SAMPLE)]):
            line = _one_line_error(invoke(*command, "--warehouse", s3["uri"]))
            assert "refused the credentials" in line and "AWS_ACCESS_KEY_ID" in line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_lease_past_its_expiry_is_taken_over(s3: dict[str, str]) -> None:
    stale = {"pid": 1, "host": "another-host", "command": "tracereplay ingest x", "since": "-",
             "expires": time.time() - 1}  # fmt: skip
    client().put_object(Bucket=s3["bucket"], Key="prod/_lock.json", Body=json.dumps(stale))
    r = invoke("ingest", str(SAMPLE), "--warehouse", s3["uri"], "--lock-timeout-s", "0")
    assert r.exit_code == 0, r.output
    assert "prod/_lock.json" not in keys(s3["bucket"])  # released at the end


def test_old_commits_and_what_only_they_name_are_removed(
    s3: dict[str, str], tmp_path: Path
) -> None:
    from pipeline.objectstore import KEEP

    log = tmp_path / "day.jsonl"
    for n in range(KEEP + 2):  # each ingest rewrites the log's files: new objects each time
        log.write_text(gateway_lines(range(100 + n)))
        assert invoke("ingest", str(log), "--warehouse", s3["uri"], "--quiet").exit_code == 0
    manifests = keys(s3["bucket"], "prod/_manifests/")
    assert len(manifests) == KEEP
    named = set()
    for key in manifests:
        body = client().get_object(Bucket=s3["bucket"], Key=key)["Body"].read()
        named |= {e["key"] for e in json.loads(body)["files"].values()}
    assert set(keys(s3["bucket"], "prod/_data/")) == named
    assert scalar(s3["uri"], "SELECT count(*) FROM requests") == 100 + KEEP + 1


def test_check_judges_the_last_commit(
    s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert invoke("ingest", str(SAMPLE), "--warehouse", s3["uri"], "--quiet").exit_code == 0
    # another machine's check: a mirror of its own, brought to the store's state first
    monkeypatch.setenv("TRACEREPLAY_CACHE_DIR", str(tmp_path / "elsewhere"))
    r = invoke("check", "--warehouse", s3["uri"], "--json")
    assert r.exit_code == 0, r.output
    local = tmp_path / "local"
    assert invoke("ingest", str(SAMPLE), "--warehouse", str(local), "--quiet").exit_code == 0
    assert (
        json.loads(r.output)["checked"]
        == json.loads(invoke("check", "--warehouse", str(local), "--json").output)["checked"]
    )


def test_an_unreachable_store_is_one_line(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing there
    line = _one_line_error(invoke("sql", "SELECT 1", "--warehouse", s3["uri"]))
    assert "cannot reach the object store" in line and "AWS_ENDPOINT_URL" in line
