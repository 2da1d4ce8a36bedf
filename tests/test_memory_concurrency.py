"""Two writers at once: the second gets a clear error; refs are never corrupted."""

import subprocess
import sys
import time

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_fixtures import engine_text
from specpilot.gitstore import GitStore, LockedError, RefMovedError
from specpilot.memory.verify import verify

HOLD = """
import sys, time, pathlib
from specpilot.gitstore import GitStore
with GitStore(sys.argv[1]).writer_lock():
    print("locked", flush=True)
    while not pathlib.Path(sys.argv[2]).exists():
        time.sleep(0.02)
"""


def test_second_writer_gets_a_clear_error_while_the_first_holds_the_lock(project):
    project.make_commit(project.base, {"stock/engine.py": engine_text({1: "'a'"})}, "a",
                        branch="src/a")
    release = project.path.parent / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(project.path), str(release)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = project.specpilot("memory", "record", "--from", "src/a", "--id", "a")
        assert result.exit_code == 1
        assert "error: another specpilot writer holds" in result.output
        assert "specpilot.lock" in result.output
        assert project.git("for-each-ref", "refs/specpilot") == ""
    finally:
        release.touch()
        holder.wait(timeout=10)
    result = project.specpilot("memory", "record", "--from", "src/a", "--id", "a")
    assert result.exit_code == 0, result.output


def test_ref_update_is_compare_and_swap(project):
    store = GitStore(project.path)
    first = project.make_commit(project.base, {"stock/x.py": "1\n"}, "one")
    second = project.make_commit(project.base, {"stock/x.py": "2\n"}, "two")
    store.update_ref("refs/specpilot/entries/x", first, None, "create")
    with pytest.raises(RefMovedError, match="changed under us"):
        store.update_ref("refs/specpilot/entries/x", second, None, "create again")
    with pytest.raises(RefMovedError):
        store.update_ref("refs/specpilot/entries/x", second, project.base, "stale old value")
    assert project.git("rev-parse", "refs/specpilot/entries/x") == first


def test_lock_is_released_after_an_error(project):
    store = GitStore(project.path)
    with pytest.raises(LockedError):
        with store.writer_lock():
            with store.writer_lock():
                pass
    with store.writer_lock():
        pass
    assert not (project.path / ".git/specpilot.lock").exists()


def test_two_concurrent_recorders_leave_consistent_memory(project):
    for n, line in (("p", 1), ("q", 30)):
        project.make_commit(project.base, {"stock/engine.py": engine_text({line: f"'{n}'"})},
                            n, branch=f"src/{n}")
    start = time.time() + 1.0
    code = ("import sys, time; t=float(sys.argv[1]); time.sleep(max(0, t-time.time()));"
            "from specpilot.cli import main; sys.argv=['specpilot']+sys.argv[2:]; main()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(start), "memory", "record",
                               "--from", f"src/{n}", "--id", n], cwd=project.path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in "pq"]
    outs = [(p.wait(timeout=60), *p.communicate()) for p in procs]
    for rc, _out, err in outs:
        assert rc == 0 or "another specpilot writer holds" in err, err
    assert any(rc == 0 for rc, _o, _e in outs)
    refs = project.git("for-each-ref", "--format=%(refname)", "refs/specpilot/entries").split()
    assert len(refs) == sum(rc == 0 for rc, _o, _e in outs)
    report = verify(project.memory())
    assert report.ok and report.outcomes
