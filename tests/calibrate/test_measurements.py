"""The measurements file: what it accepts, the features it gives, one exact line per bad file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.calibrate.features import step_features
from pipeline.calibrate.measurements import MeasurementError, read_measurements
from pipeline.calibrate.profile import check_matches, read_profile_json
from pipeline.cli import cli

HEADER = "phase,batch_size,prompt_tokens,context_tokens,time_ms"
GOOD = ["prefill,1,128,0,20.5", "prefill,4,512,256,300", "decode,8,100,1000,25"]
COLUMNS = "phase, batch_size, prompt_tokens, context_tokens, time_ms"
OPTIONAL = "model, gpu, tensor_parallel"


def write_csv(tmp_path: Path, lines: list[str], header: str = HEADER) -> Path:
    path = tmp_path / "steps.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def test_reads_csv_and_gives_the_step_features(tmp_path: Path) -> None:
    m = read_measurements(write_csv(tmp_path, GOOD))
    assert m.phase == ["prefill", "prefill", "decode"]
    assert m.time_s.tolist() == pytest.approx([0.0205, 0.3, 0.025])
    f = step_features(m)
    # prefill of 4 x 512 new tokens after 256 cached: pairs 512*256 + 512*513/2 per sequence
    assert f.P.tolist() == [128, 2048, 0]
    assert f.A.tolist() == [128 * 129 / 2, 4 * (512 * 256 + 512 * 513 / 2), 0]
    assert f.N.tolist() == [1, 4, 8]
    assert f.D.tolist() == [0, 0, 8]
    assert f.C.tolist() == [0, 0, 8000]


def test_reads_parquet_with_numeric_columns_the_same(tmp_path: Path) -> None:
    csv = write_csv(tmp_path, GOOD)
    pq = tmp_path / "steps.parquet"
    pl.read_csv(csv).write_parquet(pq)
    a, b = read_measurements(csv), read_measurements(pq)
    assert a.phase == b.phase
    for name in ("batch_size", "prompt_tokens", "context_tokens", "time_s"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert b.sha256 != a.sha256 and len(b.sha256) == 64


# name: (header, data lines, the message after "<file>: ")
BAD: dict[str, tuple[str, list[str], str]] = {
    "missing column": (
        "phase,batch_size,prompt_tokens,context_tokens",
        ["prefill,1,128,0"],
        f"missing column 'time_ms'; a measurements file needs the columns {COLUMNS} "
        f"(optional: {OPTIONAL})",
    ),
    "unknown phase": (
        HEADER,
        [GOOD[0], "prefil,1,128,0,20"],
        "row 2 (line 3), column phase: unknown phase 'prefil'; use prefill or decode",
    ),
    "empty phase": (
        HEADER,
        [",1,128,0,20"],
        "row 1 (line 2), column phase: phase is empty; use prefill or decode",
    ),
    "zero time": (
        HEADER,
        ["decode,1,128,10,0"],
        "row 1 (line 2), column time_ms: time_ms must be > 0, got 0; fix the row or drop it",
    ),
    "negative time": (
        HEADER,
        [GOOD[0], GOOD[1], "decode,1,128,10,-3.5"],
        "row 3 (line 4), column time_ms: time_ms must be > 0, got -3.5; fix the row or drop it",
    ),
    "infinite time": (
        HEADER,
        ["decode,1,128,10,inf"],
        "row 1 (line 2), column time_ms: time_ms is inf; give a finite number",
    ),
    "nan time": (
        HEADER,
        ["decode,1,128,10,nan"],
        "row 1 (line 2), column time_ms: 'nan' is not a number; give a number",
    ),
    "text in a count": (
        HEADER,
        ["decode,eight,128,10,5"],
        "row 1 (line 2), column batch_size: 'eight' is not a number; give a number",
    ),
    "negative count": (
        HEADER,
        ["decode,2,128,-10,5"],
        "row 1 (line 2), column context_tokens: context_tokens is a negative count (-10); "
        "counts are >= 0",
    ),
    "zero batch": (
        HEADER,
        ["decode,0,128,10,5"],
        "row 1 (line 2), column batch_size: batch_size must be >= 1, got 0",
    ),
    "fractional count": (
        HEADER,
        ["prefill,1,12.5,0,5"],
        "row 1 (line 2), column prompt_tokens: prompt_tokens must be a whole number, got 12.5",
    ),
    "prefill of nothing": (
        HEADER,
        ["prefill,1,0,0,5"],
        "row 1 (line 2), column prompt_tokens: prompt_tokens must be >= 1 in a prefill row, got 0",
    ),
    "empty cell": (
        HEADER,
        ["decode,1,128,,5"],
        "row 1 (line 2), column context_tokens: context_tokens is empty; give a number",
    ),
    "several bad rows": (
        HEADER,
        ["decode,1,128,10,0", GOOD[0], "decode,1,128,10,-1", "nope,1,1,1,1"],
        "row 1 (line 2), column time_ms: time_ms must be > 0, got 0; fix the row or drop it "
        "(2 more bad rows)",
    ),
    "first column first in a row": (
        HEADER,
        ["nope,-1,1,1,0"],
        "row 1 (line 2), column phase: unknown phase 'nope'; use prefill or decode",
    ),
    "bad optional tensor_parallel": (
        HEADER + ",tensor_parallel",
        ["decode,1,128,10,5,", "decode,1,128,10,5,0"],
        "row 2 (line 3), column tensor_parallel: tensor_parallel must be >= 1, got 0",
    ),
    "no rows": (HEADER, [], "no rows; add one row per measured step"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_file_gives_its_exact_line(tmp_path: Path, case: str) -> None:
    header, lines, message = BAD[case]
    path = write_csv(tmp_path, lines, header)
    with pytest.raises(MeasurementError) as exc:
        read_measurements(path)
    assert str(exc.value) == f"{path}: {message}"
    assert "\n" not in str(exc.value)


def test_parquet_errors_name_the_row_without_a_line(tmp_path: Path) -> None:
    path = tmp_path / "steps.parquet"
    frame = pl.DataFrame(
        {
            "phase": ["decode", "decode"],
            "batch_size": [1, 1],
            "prompt_tokens": [1, 1],
            "context_tokens": [5, 5],
            "time_ms": [1.0, float("nan")],
        }
    )
    frame.write_parquet(path)
    with pytest.raises(MeasurementError) as exc:
        read_measurements(path)
    assert str(exc.value) == f"{path}: row 2, column time_ms: 'NaN' is not a number; give a number"


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(MeasurementError, match="no such file; give a CSV or Parquet"):
        read_measurements(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{HEADER}\nprefill,1,128,0,20,7,8\n")
    with pytest.raises(MeasurementError, match=r"^.*bad.csv: cannot read as CSV \(.*\); write a"):
        read_measurements(bad)


def test_rows_of_another_model_gpu_or_tp_are_refused(tmp_path: Path) -> None:
    like, name = read_profile_json("llama-3-70b_h100-80gb_tp4")
    path = write_csv(
        tmp_path,
        ["decode,8,100,1000,25,Llama-3-70B,h100-80gb,4", "decode,8,100,1000,25,,h100-80gb,8"],
        HEADER + ",model,gpu,tensor_parallel",
    )
    m = read_measurements(path)
    with pytest.raises(MeasurementError) as exc:
        check_matches(m, like, name)
    assert str(exc.value) == (
        f"{path}: row 2, column tensor_parallel: 8 is not the tensor-parallel degree of "
        f"profile {name} (4); calibrate with a --like profile of that degree, or drop those rows"
    )
    path.write_text(f"{HEADER},gpu\ndecode,8,100,1000,25,a100-80gb\n")
    with pytest.raises(MeasurementError, match=r"row 1, column gpu: 'a100-80gb' is not the gpu"):
        check_matches(read_measurements(path), like, name)


def test_cli_prints_the_line_and_exits_1(tmp_path: Path) -> None:
    path = write_csv(tmp_path, ["decode,1,128,10,0"])
    out = tmp_path / "out.json"
    r = CliRunner().invoke(
        cli, ["calibrate", "measurements", str(path), "--like", "llama-3-8b_h100-80gb_tp1",
              "-o", str(out)],
    )  # fmt: skip
    assert r.exit_code == 1
    assert r.output.strip() == (
        f"Error: {path}: row 1 (line 2), column time_ms: time_ms must be > 0, got 0; "
        "fix the row or drop it"
    )
    assert not out.exists()


def test_unknown_like_profile_lists_the_shipped_ones(tmp_path: Path) -> None:
    path = write_csv(tmp_path, GOOD)
    r = CliRunner().invoke(
        cli, ["calibrate", "measurements", str(path), "--like", "llama-9", "-o", "x.json"]
    )
    assert r.exit_code == 1
    assert "unknown profile 'llama-9'" in r.output and "llama-3-8b_h100-80gb_tp1" in r.output
