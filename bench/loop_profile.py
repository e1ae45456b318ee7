"""Where the compiled loop spends its time: a ``perf`` profile with numba's functions named.

numba's compiled code runs from anonymous memory, so ``perf`` shows bare
addresses. This script loads the loop from numba's cache while keeping each
library's object code, reads its symbols (``nm``), writes the
``/tmp/perf-<pid>.map`` that ``perf report`` reads, names numba's runtime
helpers (``NRT_incref`` / ``NRT_decref``, found by their machine code), then
samples the process while ``simulate`` replays the first N requests of the
1M workload of ``sim_speed.py`` (``vllm``, chunked prefill, one replica).

Needs ``perf`` and ``nm`` on PATH and permission to profile one's own process.

    .venv/bin/python bench/loop_profile.py --record   # 200,000 requests, 3 times
    .venv/bin/python bench/loop_profile.py --n 100000 --repeats 1
    .venv/bin/python bench/loop_profile.py --annotate vllm.schedule --annotate loop.replay_loop
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import numba.core.codegen as codegen  # noqa: E402
from _measure import record  # noqa: E402

_LOADED: dict[str, bytes] = {}  # library name -> object code, as numba's cache gives it
_unserialize = codegen.CPUCodegen.unserialize_library


def _keep(self: Any, serialized: Any) -> Any:
    name, kind, data = serialized
    if kind == "object":
        _LOADED[name] = data[0]
    return _unserialize(self, serialized)


codegen.CPUCodegen.unserialize_library = _keep  # type: ignore[method-assign]

# numba's runtime refcount helpers: test rdi; je; lock inc/dec qword [rdi]
_HELPERS = {
    bytes.fromhex("4885ff7404f048ff07c3"): "NRT_incref (atomic)",
    bytes.fromhex("4885ff7406f048ff0f"): "NRT_decref (atomic)",
}


def _pretty(name: str) -> str:
    """``_ZN8pipeline3sim4loop5_stepB2v8...`` as ``loop._step``."""
    m = re.match(r"_ZN(?:7cpython)?((?:\d+\w+?)+?)B\d", name)
    if not m:
        return name[:60]
    parts, rest = [], m.group(1)
    while rest:
        k = re.match(r"\d+", rest)
        if k is None:
            break
        size = int(k.group(0))
        parts.append(rest[len(k.group(0)) : len(k.group(0)) + size])
        rest = rest[len(k.group(0)) + size :]
    return ".".join(parts[-2:])


def _symbols(
    workdir: Path, objects: dict[str, tuple[Path, int]] | None = None
) -> list[tuple[int, int, str]]:
    """(address, size, name) of every function of the loaded numba libraries and helpers.

    ``objects``, if given, gets each function's object file and load address (by symbol).
    """
    from numba.core.registry import CPUDispatcher

    out = []
    for obj in gc.get_objects():
        if not isinstance(obj, CPUDispatcher):
            continue
        for cres in obj.overloads.values():
            code = _LOADED.get(cres.library.name)
            if code is None:
                continue
            path = workdir / f"lib{len(out)}.o"  # a name per library: objects refers to it
            path.write_bytes(code)
            nm = subprocess.run(["nm", "-S", "--defined-only", str(path)], capture_output=True,
                                text=True, check=True).stdout  # fmt: skip
            rows = [r.split() for r in nm.splitlines()]
            funcs = [(int(r[0], 16), int(r[1], 16), r[3]) for r in rows
                     if len(r) == 4 and r[2] in "TtWw"]  # fmt: skip
            entry = cres.fndesc.llvm_func_name
            offset = next((o for o, _, n in funcs if n == entry), None)
            if offset is None:
                continue
            base = cres.library.get_pointer_to_function(entry) - offset
            out += [(base + o, size, _pretty(n)) for o, size, n in funcs]
            if objects is not None:
                objects |= {n: (path, base) for _, _, n in funcs if n not in objects}
    for line in Path("/proc/self/maps").read_text().splitlines():
        f = line.split()
        if f[1] != "r-xp" or len(f) != 5:
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        if hi - lo > 1 << 16:
            continue
        page = ctypes.string_at(lo, hi - lo)
        for pattern, name in _HELPERS.items():
            at = page.find(pattern)
            if at >= 0:
                out.append((lo + at, 16, name))
    return sorted(set(out))


def _annotate(data: Path, objects: dict[str, tuple[Path, int]], name: str, top: int) -> None:
    """Print the ``top`` instructions of the numba function ``name`` (as ``_pretty`` names
    it) with the most samples, in address order, with their machine code."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    samples: dict[int, int] = {}
    for ip in script.split():
        samples[int(ip, 16)] = samples.get(int(ip, 16), 0) + 1
    total = sum(samples.values())
    for symbol, (path, base) in objects.items():
        if _pretty(symbol) != name:
            continue
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "intel",
                              f"--disassemble={symbol}", str(path)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        rows = []
        for line in dis.splitlines():
            head, _, asm = line.partition(":\t")
            if asm and re.fullmatch(r"\s*[0-9a-f]+", head):
                rows.append((samples.get(base + int(head, 16), 0), int(head, 16), asm))
        here = sum(c for c, _, _ in rows)
        if here == 0:  # e.g. numba's Python wrapper of the function
            continue
        print(f"{name}: {here / total:.1%} of the samples; its {top} hottest instructions:")
        for c, addr, asm in sorted(sorted(rows, reverse=True)[:top], key=lambda x: x[1]):
            print(f"  {c / total:6.2%}  {addr:6x}  {re.sub(r'<_ZN.*?>', '', asm)[:70]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="write bench/RESULTS.md")
    parser.add_argument(
        "--annotate", action="append", default=[], metavar="FUNC",
        help="print the hottest instructions of FUNC too (vllm.schedule)",
    )  # fmt: skip
    parser.add_argument("--top", type=int, default=40, help="instructions --annotate prints")
    args = parser.parse_args()
    from sim_speed import SCENARIO, make_warehouse

    from pipeline.contracts import REQUESTS
    from pipeline.sim.replay_input import prepare, read_requests
    from pipeline.sim.scenario import build_scenario
    from pipeline.sim.simulate import simulate, warm_up
    from pipeline.sim.state import SimInput
    from pipeline.warehouse import Warehouse

    sc = build_scenario(SCENARIO)
    eng = sc.engine()
    wh = make_warehouse(1_000_000, 16.8)
    inp = prepare(read_requests(Warehouse(wh).files(REQUESTS)), sc).inp
    n = args.n
    sub = SimInput(inp.arrival_s[:n].copy(), inp.prompt_tokens[:n].copy(),
                   inp.output_tokens[:n].copy())  # fmt: skip
    warm_up(eng)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        objects: dict[str, tuple[Path, int]] = {}
        symbols = _symbols(work, objects)
        perf_map = Path(f"/tmp/perf-{os.getpid()}.map")
        perf_map.write_text("".join(f"{a:x} {s:x} {name}\n" for a, s, name in symbols))
        data = work / "perf.data"
        perf = subprocess.Popen(
            ["perf", "record", "-F", "1999", "-p", str(os.getpid()), "-o", str(data)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # perf attaches
        t = time.perf_counter()
        for _ in range(args.repeats):
            simulate(sub, eng)
        took = time.perf_counter() - t
        perf.send_signal(signal.SIGINT)
        perf.wait()
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--no-children", "--sort", "sym", "--stdio"],
            capture_output=True,
            text=True,
        ).stdout
        perf_map.unlink(missing_ok=True)
        for name in args.annotate:
            _annotate(data, objects, name, args.top)
    print(f"simulate x{args.repeats} on {n:,} requests: {took:.2f} s "
          f"({n * args.repeats / took:,.0f} req/s while profiled)")  # fmt: skip
    print("share of samples by function (numba functions named; inlined callees count "
          "in their caller):")  # fmt: skip
    top = [ln.strip() for ln in report.splitlines() if ln.strip() and not ln.startswith("#")]
    for line in top[:15]:
        print("  " + line)
    if args.record:
        rows = []
        for line in top[:12]:
            share, _, name = line.split(maxsplit=2)
            rows.append(f"| {name} | {share} |")
        body = "\n".join(
            [
                f"`simulate` x{args.repeats} on the first {n:,} requests of the 1M workload "
                f"of `bench/sim_speed.py` (`vllm`, chunked prefill, one replica), sampled by "
                f"`perf` at 1,999 Hz: {n * args.repeats / took:,.0f} req/s while profiled. "
                "Inlined callees count in their caller; `NRT_incref`/`NRT_decref` are numba's "
                "atomic reference counts of the arrays passed to every non-inlined call.",
                "",
                "| function | share of samples |",
                "|---|---:|",
                *rows,
            ]
        )
        record("Loop profile", "python bench/loop_profile.py --record", body)


if __name__ == "__main__":
    main()
