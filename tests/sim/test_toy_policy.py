"""A new policy is one file and one registry line: the toy in ``toy_policy.py`` runs.

It runs in a fresh interpreter with a cache directory of its own: registering
a policy changes what the compiled loop depends on (``jit.compiled_sources``),
which would otherwise drop the shared cache of the simulator for the rest of
the suite, and the loop has to compile with the new policy in it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import numpy as np
from pipeline.sim import policies
from tests.sim import toy_policy
policies.register(toy_policy)  # the one registry line, from outside the package
from pipeline.errors import ScenarioError
from pipeline.sim.simulate import simulate
from pipeline.sim.scenario import build_scenario
from pipeline.sim.state import F_FINISH, F_FIRST_TOKEN, R_GENERATED, R_PREEMPT, SimInput

cost = {"fixed_s": 1.0, "flop_s_per_token": 0.0, "flop_s_per_attn": 0.0, "mem_s_weights": 0.0,
        "mem_s_per_kv_token": 0.0, "mem_s_per_token": 0.0, "comm_s_fixed": 0.0,
        "comm_s_per_token": 0.0}
prompt = [900, 100, 500, 100, 300, 700]
output = [3, 2, 4, 1, 5, 2]
inp = SimInput(np.zeros(6), np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64))
out = {"names": list(policies.POLICIES)}
for seqs in (1, 6):
    sc = build_scenario({"policy": "spf", "max_num_seqs": seqs, "cost": cost,
                         "num_gpu_blocks": 1000, "max_model_len": 4096})
    res = simulate(inp, sc.engine())
    out[f"first_{seqs}"] = res.rqf[:, F_FIRST_TOKEN].tolist()
    out[f"finish_{seqs}"] = res.rqf[:, F_FINISH].tolist()
    out[f"generated_{seqs}"] = res.rq[:, R_GENERATED].tolist()
    out[f"preempted_{seqs}"] = int(res.rq[:, R_PREEMPT].sum())
try:
    build_scenario({"policy": "spf", "max_num_seqs": 0, "cost": cost, "num_gpu_blocks": 1000,
                    "max_model_len": 4096})
    out["rejected"] = None
except ScenarioError as e:
    out["rejected"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_toy_policy_registers_and_runs_by_its_own_rules(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "spf" in out["names"]
    assert "max_num_seqs" in out["rejected"]
    prompt = [900, 100, 500, 100, 300, 700]
    output = [3, 2, 4, 1, 5, 2]
    # one at a time, every step 1 s: served by prompt length (ties in arrival order), each
    # taking its output's steps (the prompt's step samples the first token)
    order = sorted(range(6), key=lambda i: (prompt[i], i))
    t = 0.0
    finish = [0.0] * 6
    first = [0.0] * 6
    for i in order:
        first[i] = t + 1
        t += output[i]
        finish[i] = t
    assert out["first_1"] == first
    assert out["finish_1"] == finish
    assert out["generated_1"] == output
    # all at once: every prompt in the first step, then each decodes to its end
    assert out["first_6"] == [1.0] * 6
    assert out["finish_6"] == [float(o) for o in output]
    assert out["preempted_1"] == out["preempted_6"] == 0


def test_the_loop_names_no_policy() -> None:
    """The loop reaches the policies through the registry's dispatch alone (policies/base.py)."""
    tree = ast.parse((ROOT / "pipeline" / "sim" / "loop.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline.sim.policies":
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "pipeline.sim.policies."
        ):
            imported.add(node.module or "")
    assert imported <= {"dispatch", "pipeline.sim.policies.dispatch"}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "CODE" not in names | attrs
