"""Every script of the bench/ suite runs its --smoke mode on the CPU and prints a table.

The smokes exercise the scripts' own code paths on tiny random targets (tiny-qwen3), so a
refactor of stock/, kernels/ or specpilot/ that breaks a benchmark shows here, not on the
next lent GPU. bench/README.md lists the suite; bench/archive/ is not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TABLE = re.compile(r"^\|.*\|\n\|(\s*-+\s*\|)+$", re.M)   # a Markdown header and its rule

# (script, why it may be skipped); the shell scripts run their Python scripts' smokes too
SMOKES = [
    pytest.param("engine_tokens.py", id="engine_tokens"),
    pytest.param("step_27b.py", id="step_27b"),
    pytest.param("kernels_vs_cublas.py", id="kernels_vs_cublas"),
    pytest.param("w12_mma.py", id="w12_mma"),   # the CUDA kernel's emulator
    pytest.param("drafter_tau.py", id="drafter_tau"),   # the embedded model, shipped weights
    pytest.param("drafter_positions.py", id="drafter_positions"),   # the same, teacher-forced
    pytest.param("device_facts.py", id="device_facts"),
    pytest.param("memory_verify.py", id="memory_verify"),
    pytest.param("peers.py", id="peers"),
    pytest.param("judges_false_adoption.py", id="judges_false_adoption"),
    pytest.param("gpu_numerics.sh", id="gpu_numerics"),
    pytest.param("gpu_tree.sh", id="gpu_tree"),   # the tree-verify entry applied, step_27b
    pytest.param("gpu_hybrid.sh", id="gpu_hybrid"),   # step_hybrid, gdn_tree(_probe): tiny-hybrid
    pytest.param("batch_throughput.py", id="batch_throughput"),
    pytest.param("batch_draft.py", id="batch_draft"),   # a random drafter, eager
    pytest.param("batch_prepare.py", id="batch_prepare"),   # static and dynamic sizes, eager
    pytest.param("batch_step.py", id="batch_step"),   # a full batch's step, a random drafter
    pytest.param("readme_commands.py", id="readme_commands"),   # a fresh clone, a venv
    pytest.param("concurrent_runs.py", id="concurrent_runs"),
    pytest.param("gpu_explore.sh", id="gpu_explore"),   # staged, stopped before the plan, resumed
    pytest.param("compiled_numerics.py", id="compiled_numerics"),   # inductor's C++ backend
    pytest.param("corpus_size.py", id="corpus_size"),   # training prompts, base and wide
    pytest.param("tree_calibration.py", id="tree_calibration"),   # embedded, shipped drafter
    pytest.param("reference_speed.py", id="reference_speed"),   # the judges' reference_pass
    pytest.param("batch_projection.py", id="batch_projection"),   # tiny-qwen3 as both targets
    pytest.param("self_requests.py", id="self_requests"),   # the embedded target, 2 requests
    # the controller with confined workers (five processes on a 2-core machine)
    pytest.param("gpu_verdict.sh", id="gpu_verdict", marks=pytest.mark.slow),
]


def run_smoke(script: str, out: Path) -> subprocess.CompletedProcess:
    cmd = ([sys.executable] if script.endswith(".py") else ["bash"]) + [str(BENCH / script),
                                                                         "--smoke"]
    env = {**os.environ, "OUT": str(out), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.parametrize("script", SMOKES)
def test_smoke_prints_a_table(script, tmp_path):
    if script == "kernels_vs_cublas.py":
        pytest.importorskip("triton")
    if script == "gpu_verdict.sh" and not shutil.which("bwrap"):
        pytest.skip("the judges confine workers with bubblewrap, absent here")
    t0 = time.perf_counter()
    res = run_smoke(script, tmp_path)
    took = time.perf_counter() - t0
    tail = (res.stdout + res.stderr)[-3000:]
    if script == "gpu_verdict.sh":   # the comparison's own exit: 0 adopted, 3 not adopted
        assert "rc=0 " in res.stdout or "rc=3 " in res.stdout, tail
    assert res.returncode == 0, tail
    assert TABLE.search(res.stdout), f"no table printed by {script} ({took:.1f} s):\n{tail}"
    # what a script leaves in $OUT is read back by name: no file without its type's suffix
    # (batch_projection.py and batch_prepare.py wrote "batch_projection", "batch_prepare")
    bare = [p.name for p in tmp_path.iterdir() if p.is_file() and not p.suffix]
    assert not bare, f"{script} wrote {bare} into $OUT without a suffix"


@pytest.mark.slow
def test_the_verdict_script_judges_several_entries_in_one_run(tmp_path):
    """ENTRY="E1 E2": each entry staged as a branch of its own name, one `specpilot compare
    main E1 E2` with each entry's options (--opt-of), one table a candidate."""
    if not shutil.which("bwrap"):
        pytest.skip("the judges confine workers with bubblewrap, absent here")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "ENTRY": "fused-rmsnorm w12-weights",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(["bash", str(BENCH / "gpu_verdict.sh"), "--smoke",
                          "--opt-of", "fused-rmsnorm", "rmsnorm_impl=fused",
                          "--opt-of", "w12-weights", "weights=w12"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    tail = (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0 and ("rc=0 " in res.stdout or "rc=3 " in res.stdout), tail
    assert "compare main fused-rmsnorm w12-weights" in res.stdout, tail
    for entry in ("fused-rmsnorm", "w12-weights"):
        assert f"several_random-tiny-qwen3.json: {entry}" in res.stdout, tail
        assert f"| B ({entry}), B0 / B1 |" in res.stdout, tail
    assert len(TABLE.findall(res.stdout)) >= 2, tail


def test_every_suite_script_has_a_smoke():
    """A script added to bench/ joins the smokes (or bench/archive/)."""
    listed = {p.values[0] for p in SMOKES}
    helpers = {"common.py", "stage.sh"}
    covered = {"gpu_numerics.py",   # its smoke runs inside gpu_numerics.sh --smoke
               "step_hybrid.py",    # these three inside gpu_hybrid.sh --smoke
               "gdn_tree.py", "gdn_tree_probe.py"}
    present = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    assert present - helpers - covered == listed
    for name in listed | covered:
        assert "--smoke" in (BENCH / name).read_text(), name
