"""Issue 21, class 5: symbolic links in the system paths must not lead out of them, and
making a checkout read-only never follows a link."""

import os
import stat

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_forge import commit_with, drop_refs, link_entry
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.judges import worker_proc
from specpilot.judges.worker_proc import clean_checkout


@pytest.fixture
def files_a(project):
    def steps(project):
        project.entry("a", {1: "'a'"})
        drop_refs(project)
    return project.build("links-files-a", steps)


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside.txt"
    path.write_text("not the repository's\n")
    path.chmod(0o644)
    return path


def targets(outside):
    return {"absolute": str(outside), "climbing": "../../../outside.txt",
            "to a non-system path": "../README.md"}


@pytest.mark.parametrize("kind", ["absolute", "climbing", "to a non-system path"])
def test_replay_refuses_a_link_leading_out_of_the_system_paths(files_a, outside, kind):
    target = targets(outside)[kind]
    link_entry(files_a, "l", "stock/escape", target)
    result = files_a.specpilot("memory", "verify", "l")
    assert result.exit_code == 1, result.output
    assert f"symbolic link 'stock/escape' -> {target!r} leads outside the system paths" \
        in result.output
    wt = files_a.path.parent / "replayed"
    replay = files_a.git_specpilot("replay", "l", "--worktree", str(wt))
    assert replay.exit_code == 1 and not wt.exists(), replay.output
    assert files_a.specpilot("memory", "import", "l").exit_code == 1
    assert not files_a.git("for-each-ref", "refs/specpilot")


def test_a_link_inside_the_system_paths_is_fine(files_a):
    link_entry(files_a, "l", "stock/gemm.py", "../kernels/gemm.py")
    result = files_a.specpilot("memory", "verify", "l")
    assert result.exit_code == 0, result.output


def test_record_refuses_a_source_with_an_escaping_link(project, outside):
    src = commit_with(project, project.base, {"stock/escape": ("120000", str(outside).encode())},
                      "escape")
    project.git("branch", "src/escape", src)
    result = project.specpilot("memory", "record", "--from", "src/escape", "--id", "escape",
                               "--base", project.base)
    assert result.exit_code == 1, result.output
    assert "leads outside the system paths" in result.output
    assert not project.git("for-each-ref", "refs/specpilot", "refs/notes")


def test_clean_checkout_refuses_an_escaping_link_and_touches_nothing(project, outside):
    src = commit_with(project, project.base, {"stock/escape": ("120000", str(outside).encode())},
                      "escape")
    with pytest.raises(SpecPilotError, match="leads outside the system paths"):
        clean_checkout(GitStore(project.path), src, ["stock", "kernels"], project.path)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644
    assert not (project.path / ".specpilot/cache").exists()


def test_making_a_checkout_read_only_never_follows_a_link(tmp_path, outside):
    root = tmp_path / "checkout"
    (root / "stock").mkdir(parents=True)
    (root / "stock/own.py").write_text("x = 1\n")
    os.symlink(outside, root / "stock/link")
    worker_proc._make_readonly(root)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644   # the target outside: untouched
    assert not os.stat(root / "stock/own.py").st_mode & 0o222


def test_resolution_follows_the_trees_own_links():
    from specpilot import links

    # stock/up -> .. is inside (the root); through it, up/../x climbs above the root.
    tree = {"stock/up": "..", "stock/x": "up/../outside", "stock/ok": "up/kernels/k.py",
            "stock/loop": "loop", "stock/d": ".", "stock/y": "d/d/engine.py"}
    assert links.resolve("stock/up/../outside", tree) is None
    assert links.resolve("stock/up/kernels/k.py", tree) == "kernels/k.py"
    assert links.resolve("stock/loop", tree) is None
    assert dict(links.leaving(tree, ["stock", "kernels"])) == \
        {"stock/up": "..", "stock/x": "up/../outside", "stock/loop": "loop"}
