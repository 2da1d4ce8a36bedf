"""`git specpilot replay <entry> [--onto REF] [--worktree PATH] [--json]`: 0 reproduced,
1 diverged or failed, 2 usage error."""

import json
import os
import stat
import subprocess
import sys


from memory_fixtures import *  # noqa: F401,F403
from memory_fixtures import engine_text


def test_reproduced_prints_the_tree_comparison(chain_ab):
    result = chain_ab.git_specpilot("replay", "b")
    assert result.exit_code == 0, result.output
    assert "recorded  " in result.output and "replayed  " in result.output
    assert "stock" in result.output and "=" in result.output
    assert result.output.strip().endswith("reproduced")


def test_json_output(chain_ab):
    result = chain_ab.git_specpilot("replay", "b", "--json")
    data = json.loads(result.output)
    assert data["status"] == "reproduced" and data["expected_tree"] == data["replayed_tree"]
    assert [p["path"] for p in data["paths"]] == ["stock", "kernels"]


def test_onto_a_changed_stock_diverges_with_paths(chain_ab):
    chain_ab.make_commit(chain_ab.base, {"stock/sampler.py": "def greedy(x):\n    return 0\n"}, "s2",
                    branch="stock2")
    result = chain_ab.git_specpilot("replay", "b", "--onto", "stock2", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["status"] == "diverged" and data["differing_paths"] == ["stock/sampler.py"]


def test_onto_a_stock_where_the_patch_fails(chain_ab):
    chain_ab.make_commit(chain_ab.base, {"stock/engine.py": engine_text({10: "'other'"})}, "s3",
                    branch="stock3")
    result = chain_ab.git_specpilot("replay", "b", "--onto", "stock3")
    assert result.exit_code == 1
    assert "failed: entry 'b': patch does not apply: stock/engine.py hunk #1" in result.output


def test_onto_a_stock_that_changes_only_other_paths_reproduces(chain_ab):
    chain_ab.make_commit(chain_ab.base, {"README.md": "docs\n"}, "docs", branch="docs")
    assert chain_ab.git_specpilot("replay", "b", "--onto", "docs").exit_code == 0


def test_worktree_checks_out_the_replayed_system(chain_ab):
    wt = chain_ab.path.parent / "replayed"
    result = chain_ab.git_specpilot("replay", "b", "--worktree", str(wt))
    assert result.exit_code == 0, result.output
    engine = (wt / "stock/engine.py").read_text()
    assert "line_01 = 'a'" in engine and "line_10 = 'b'" in engine
    assert chain_ab.git("-C", str(wt), "rev-parse", "HEAD") == \
        chain_ab.git("rev-parse", "refs/specpilot/entries/b")


def test_usage_errors_exit_2(chain_ab):
    assert chain_ab.git_specpilot("replay", "nope").exit_code == 2
    assert chain_ab.git_specpilot("replay").exit_code == 2
    assert chain_ab.git_specpilot("replay", "b", "--onto", "no-such-ref").exit_code == 2


def test_the_git_door_works_through_git(chain_ab, tmp_path):
    # `git specpilot` finds `git-specpilot` on PATH, as the console script installs it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "git-specpilot"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m specpilot.git_cli \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    ok = subprocess.run(["git", "specpilot", "replay", "a"], cwd=chain_ab.path, env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(["git", "specpilot", "replay", "zzz"], cwd=chain_ab.path, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no memory entry 'zzz'" in bad.stderr


def test_usage_errors_and_an_unknown_entry_are_one_line(chain_ab):
    for args, words in ((["replay", "b", "--bogus"], "No such option '--bogus'"),
                        (["replay"], "Missing argument"),
                        (["replay", "nope"], "nope")):
        res = chain_ab.git_specpilot(*args)
        lines = [x for x in res.output.splitlines() if x.strip()]
        assert res.exit_code >= 1 and len(lines) == 1, res.output
        assert lines[0].startswith("error: ") and words in lines[0], res.output
