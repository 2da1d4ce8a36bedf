"""Issue 21, classes 1 and 8: agent commands are jailed. Real worktrees, real bubblewrap;
each test is an attack and asserts that it did nothing.

1. No sandbox, silently: an LLM-agent backend without a working bwrap is refused (offline
   runs; the opt-out is explicit), and under bwrap no home folder, sealed file or seed is
   readable.
8. The `tests` tool passes a file name as one argument, never through a shell.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest
from cycle_fixtures import ScriptedClient, project, shared_cache  # noqa: F401

from specpilot import worktrees
from specpilot.agents import sandbox
from specpilot.agents.tools import Workspace
from specpilot.cycle import runner
from specpilot.cycle.state import list_runs
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore

HAS_BWRAP = sandbox.bwrap_path() is not None
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not usable here")


def _explore(project: Path, **values) -> None:
    """Set keys of the [explore] section (the fixture's config ends with it)."""
    path = project / ".specpilot" / "config.toml"
    lines = "".join(f"{k} = {v}\n" for k, v in values.items())
    path.write_text(path.read_text() + lines)


def _worktree(project: Path, name: str) -> Path:
    return Path(worktrees.new(GitStore(project), name, "HEAD").path)


# -- 1. no sandbox, no LLM agent ---------------------------------------------------------

def test_llm_backends_are_refused_without_a_sandbox_offline_runs_opt_out_is_explicit(
        project, monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)   # bwrap missing or broken
    with pytest.raises(SpecPilotError) as err:                  # auto + a key: Claude
        runner.start(project, client=ScriptedClient([]))
    assert "bubblewrap" in str(err.value) and "agent_sandbox = false" in str(err.value)
    assert "\n" not in str(err.value) and not list_runs(project)   # nothing started
    ws = Workspace(_worktree(project, "nosandbox"), command_timeout_s=20)
    with pytest.raises(SpecPilotError, match="bubblewrap"):   # no tool runs unconfined
        ws.run("touch ran-unconfined")
    assert not (ws.root / "ran-unconfined").exists()

    offline = runner.start(project)                  # no key: reuse and tuning need none
    assert offline.state.sandbox.startswith("none: bwrap")

    _explore(project, backend='"command"', agent_command='["/bin/true"]')
    with pytest.raises(SpecPilotError, match="bubblewrap"):
        runner.start(project)
    _explore(project, agent_sandbox="false")         # the user's explicit opt-out
    opted = runner.start(project, client=ScriptedClient([]))
    assert "agent_sandbox = false" in opted.state.sandbox


def _private_secret(folder: Path, text: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=".specpilot-redteam-", dir=folder)
    os.write(fd, text.encode())
    os.close(fd)
    return Path(name)


@needs_bwrap
def test_under_bwrap_no_home_folder_sealed_file_or_seed_is_readable(project, monkeypatch):
    from specpilot.requests.sealed import SEED_FILE, ensure_sealed

    outside = Path(tempfile.mkdtemp(prefix="specpilot-redteam-", dir="/var/tmp"))
    made: list[Path] = [outside]
    try:
        monkeypatch.setenv("SPECPILOT_SEALED_DIR", str(outside / "sealed"))
        sealed = ensure_sealed()
        seed = sealed.parent / SEED_FILE
        fake_home = outside / "home"          # $HOME elsewhere: the real home is hidden too
        fake_home.mkdir()
        monkeypatch.setenv("HOME", str(fake_home))
        secrets = {seed: seed.read_text().strip(), sealed: sealed.read_text()[:60]}
        secrets[_private_secret(fake_home, "secret-of-home")] = "secret-of-home"
        real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
        if os.access(real_home, os.W_OK):
            made.append(_private_secret(real_home, "secret-of-the-real-home"))
            secrets[made[-1]] = "secret-of-the-real-home"
        if os.access("/home", os.W_OK):       # another user's home folder
            other = Path(tempfile.mkdtemp(prefix="specpilot-redteam-", dir="/home"))
            made.append(other)
            secrets[_private_secret(other, "secret-of-another-home")] = "secret-of-another-home"
        assert len(secrets) >= 4
        ws = Workspace(_worktree(project, "jail"), command_timeout_s=60)
        out = ws.run("cat " + " ".join(str(p) for p in secrets) + " 2>&1; ls -a /home /root")
        for path, secret in secrets.items():
            assert secret not in out, path
        assert ws.commands[-1]["sandbox"] == "bubblewrap"
        works = ws.run("python -c 'import sys; print(\"python\", sys.version_info[0])'")
        assert "python 3" in works               # the interpreter stays usable (pyenv in ~)
    finally:
        for path in made:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


# -- 8. argument vectors, never shell strings ---------------------------------------------

@needs_bwrap
def test_the_tests_tool_passes_a_file_name_as_one_argument(project):
    ws = Workspace(_worktree(project, "inject"), command_timeout_s=120)
    name = "x; touch pwned"
    (ws.root / name).write_text("")
    out = ws.tests(name)
    assert not (ws.root / "pwned").exists()
    assert name in out                                # pytest got the whole name
    ws.bench("$(touch pwned2)", 1)
    assert not (ws.root / "pwned2").exists()
