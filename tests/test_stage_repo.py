"""bench/stage.sh's stage_repo (the device scripts' git repository of this tree): a branch per
memory entry with its dependencies' patches applied first, in the order `git specpilot
replay` applies them, so that an entry of several dependencies (two-level: w12-weights and
tree-verify, whose patches both add option registrations at one place) composes as the
replay composes it; a conflict of another kind fails instead of being merged."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_an_entry_of_two_dependencies_is_staged_as_its_replay_composes_it(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    from common import entry_chain

    assert entry_chain("two-level") == ["tree-verify", "w12-weights", "two-level"]
    assert entry_chain("batch-mechanisms") == ["prompt-admission", "batch-mechanisms"]
    repo = tmp_path / "repo"
    run = _bash(f"source bench/stage.sh && stage_repo {repo} cand=two-level", ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    log = subprocess.run(["git", "log", "--format=%s", "cand"], cwd=repo, capture_output=True,
                         text=True).stdout.split("\n")
    assert log[:4] == ["two-level", "w12-weights", "tree-verify", "stock (working tree)"]
    show = subprocess.run(["git", "show", "cand:stock/options.py"], cwd=repo,
                          capture_output=True, text=True).stdout
    assert "<<<<<<<" not in show
    # the postimage of two-level's own patch: the blob its replayed dependencies leave
    patch = (ROOT / "memory" / "two-level.patch").read_text()
    after = re.search(r"diff --git a/stock/options.py.*?\nindex \w+\.\.(\w+)", patch, re.S)[1]
    blob = subprocess.run(["git", "rev-parse", "cand:stock/options.py"], cwd=repo,
                          capture_output=True, text=True).stdout.strip()
    assert blob.startswith(after)


def _conflict(tmp_path: Path, x: str, y: str) -> str:
    """Branches x and y of f (base a b c), y's diff applied 3-way onto x, then stage_union."""
    g = "git -c user.name=t -c user.email=t@t"
    tmp_path.mkdir()
    script = f"""set -e
    cd {tmp_path} && git init -q -b main && printf 'a\\nb\\nc\\n' > f && git add f
    {g} commit -qm base && git checkout -q -b x && printf '{x}' > f
    {g} commit -qam x && git checkout -q main && git checkout -q -b y
    printf '{y}' > f && {g} commit -qam y && git diff main y > y.patch
    git checkout -q x && git apply --3way y.patch 2>/dev/null || true
    source {ROOT}/bench/stage.sh
    stage_union && echo merged || echo refused
    cat f"""
    run = _bash(script, tmp_path)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_two_additions_at_one_place_keep_both_and_another_conflict_fails(tmp_path):
    both = _conflict(tmp_path / "add", "a\\nb\\nX\\nc\\n", "a\\nb\\nY\\nc\\n")
    assert both.split() == ["merged", "a", "b", "X", "Y", "c"]
    other = _conflict(tmp_path / "edit", "a\\nB1\\nc\\n", "a\\nB2\\nc\\n")
    assert other.split()[0] == "refused" and "<<<<<<<" in other


def test_entry_tree_builds_an_entry_of_two_dependencies(tmp_path):
    """bench/common.entry_tree (behind the bench scripts' --entry) gives two-level's stock/
    the blob its replayed dependencies leave, as stage_repo does, with no .git left."""
    sys.path.insert(0, str(ROOT / "bench"))
    from common import entry_tree

    tree = entry_tree("two-level", tmp_path / "tree")
    assert not (tree / ".git").exists()
    text = (tree / "stock" / "options.py").read_text()
    assert "<<<<<<<" not in text
    blob = subprocess.run(["git", "hash-object", str(tree / "stock" / "options.py")],
                          capture_output=True, text=True).stdout.strip()
    patch = (ROOT / "memory" / "two-level.patch").read_text()
    after = re.search(r"diff --git a/stock/options.py.*?\nindex \w+\.\.(\w+)", patch, re.S)[1]
    assert blob.startswith(after)
    # a single entry still takes the plain path and gives the patch's postimage too
    one = entry_tree("w12-weights", tmp_path / "one")
    assert not (one / ".git").exists() and not (one / "stock" / "two_level.py").exists()
    w12 = (ROOT / "memory" / "w12-weights.patch").read_text()
    after = re.search(r"diff --git a/stock/options.py.*?\nindex \w+\.\.(\w+)", w12, re.S)[1]
    blob = subprocess.run(["git", "hash-object", str(one / "stock" / "options.py")],
                          capture_output=True, text=True).stdout.strip()
    assert blob.startswith(after)
