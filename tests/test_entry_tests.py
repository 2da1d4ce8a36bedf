"""Each shipped memory entry's own tests, run on the entry replayed onto the current stock.

An entry's option exists only where its patch is applied, so its tests skip on stock. Here
each entry is replayed onto HEAD (`git specpilot replay ID --onto HEAD --worktree DIR`, from
refs or memory/), which fails when the entry no longer applies to the stock, and its test
files run in that checkout in a subprocess; they must pass and skip nothing. HEAD is the
committed stock and tests: commit before running this locally.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
ENTRY_TESTS = {
    "batch-mechanisms": ["tests/test_batch_stack.py"],
    "batch-serving-stack": ["tests/test_batch_serving_stack.py"],   # its parts: theirs
    "batch-tree-verify": ["tests/test_batch_tree.py", "tests/test_kernels_compile.py"],
    "coalesced-admission": ["tests/test_batch_admission.py"],
    "shared-node-budget": ["tests/test_node_budget.py"],
    "dynamic-draft-length": ["tests/test_dynamic_draft.py"],
    "fused-rmsnorm": ["tests/test_fused_rmsnorm.py"],
    "prompt-admission": ["tests/test_prompt_admission.py"],
    "prefill-buckets": ["tests/test_prefill_buckets.py"],
    "admission-stack": ["tests/test_admission_stack.py"],   # its parts: theirs
    "tree-verify": ["tests/test_tree_verify.py"],
    "tree-verify-gdn": ["tests/test_tree_verify_gdn.py", "tests/test_gdn_tree_kernel.py"],
    "two-level": ["tests/test_two_level.py"],
    "w12-weights": ["tests/test_w12_linear.py"],
}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry", sorted(ENTRY_TESTS))
def test_entry_tests_pass_on_the_entry_replayed_onto_stock(entry, tmp_path):
    if _git("rev-parse", "HEAD").returncode != 0:
        pytest.skip("not a git checkout")
    if not (REPO / "memory" / f"{entry}.toml").exists():
        pytest.fail(f"memory/{entry}.toml is missing")
    wt = tmp_path / entry
    replay = subprocess.run([sys.executable, "-m", "specpilot.git_cli", "replay", entry,
                             "--onto", "HEAD", "--worktree", str(wt), "--json"], cwd=REPO,
                            capture_output=True, text=True)
    try:
        # onto a stock that moved since the entry's base the tree differs from the recorded
        # one ("diverged", exit 1); what must hold is that the patch applied (not "failed")
        assert replay.returncode in (0, 1) and wt.is_dir(), replay.stdout + replay.stderr
        assert json.loads(replay.stdout)["status"] in ("reproduced", "diverged")
        # the entry's pytest at this process's own torch threads (it only waits meanwhile):
        # its share of the cores under xdist (tests/conftest.py), every core alone, so the
        # two xdist workers' work holds the two cores and no more. Not the module's decision
        # (conftest.child_threads, made at its start, when the previous module's processes
        # may still hold a core). The tree-verify entry's tests took 170 s in the suite so,
        # 155 s at torch's default two threads beside the other worker, 87 s alone at two
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
        env["PYTHONPATH"] = str(wt)
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-rs", *ENTRY_TESTS[entry]], cwd=wt, env=env,
                             capture_output=True, text=True, timeout=900)
        tail = run.stdout[-3000:] + run.stderr[-2000:]
        assert run.returncode == 0, tail
        assert re.search(r"\d+ passed", run.stdout), tail
        assert "skipped" not in run.stdout.splitlines()[-1], tail
    finally:
        if wt.exists():
            _git("worktree", "remove", "--force", str(wt))
        _git("worktree", "prune")
