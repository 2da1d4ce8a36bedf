"""Fixtures for the memory, worktree, init and replay tests: real git repos in tmp folders.

Import with `from memory_fixtures import *` in a test module. `hermetic` is autouse there:
HOME, git config and author/committer identity and dates are pinned, so commit hashes are
the same on every run and no user configuration leaks in.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpilot.cli import cli
from specpilot.git_cli import git_cli
from specpilot.memory.record import record
from specpilot.memory.store import Memory

__all__ = ["hermetic", "project", "chain_ab", "Project", "DATE", "REPO", "snapshot"]

DATE = "1700000000 +0000"
_BUILT: dict[str, tuple[Path, dict]] = {}
REPO = Path(__file__).resolve().parents[1]  # this checkout: subprocesses import it
ENGINE_LINES = 60


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_PREFIX", "GIT_CEILING_DIRECTORIES",
                "XDG_CONFIG_HOME", "SPECPILOT_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    env = {
        "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": str(home / "gitconfig"),
        "GIT_AUTHOR_NAME": "Test Author", "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_COMMITTER_NAME": "Test Committer", "GIT_COMMITTER_EMAIL": "committer@example.com",
        "GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE, "SOURCE_DATE_EPOCH": "1700000000",
        "GIT_TERMINAL_PROMPT": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    # An empty template: no sample hooks in each test repository (fewer files to delete).
    (home / "templates").mkdir()
    (home / "gitconfig").write_text(f"[init]\n\tdefaultBranch = main\n"
                                    f"\ttemplateDir = {home / 'templates'}\n")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield


def engine_text(changes: dict[int, str] | None = None) -> str:
    changes = changes or {}
    return "".join(f"line_{i:02d} = {changes.get(i, str(i))}\n"
                   for i in range(1, ENGINE_LINES + 1))


class Project:
    """A SpecPilot project: stock/ and kernels/ system paths plus non-system files."""

    def __init__(self, path: Path):
        self.path = path
        self.runner = CliRunner()
        self.base = ""
        self.changes: dict[str, dict[int, str]] = {}
        self.deps_of: dict[str, list[str]] = {}

    def git(self, *args: str, check: bool = True, env: dict | None = None) -> str:
        res = subprocess.run(["git", *args], cwd=self.path, capture_output=True, text=True,
                             env={**os.environ, **(env or {})})
        if check and res.returncode != 0:
            raise AssertionError(f"git {' '.join(args)}: {res.stderr}")
        return res.stdout.strip()

    def write(self, rel: str, text: str) -> None:
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def commit_all(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def make_commit(self, parent: str, files: dict[str, str | None], message: str,
                    branch: str | None = None) -> str:
        """A commit of `parent` with `files` replaced (None: deleted), built in a private
        index: the working tree, index and HEAD are left alone."""
        index = self.path.parent / f"index-{hashlib.sha1(message.encode()).hexdigest()[:8]}"
        env = {"GIT_INDEX_FILE": str(index)}
        self.git("read-tree", parent, env=env)
        for rel, text in files.items():
            if text is None:
                self.git("rm", "-q", "--cached", rel, env=env)
                continue
            blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=self.path,
                                  input=text, capture_output=True, text=True).stdout.strip()
            self.git("update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
        tree = self.git("write-tree", env=env)
        index.unlink()
        sha = self.git("commit-tree", tree, "-p", parent, "-m", message)
        if branch:
            self.git("branch", "-f", branch, sha)
        return sha

    def build(self, key: str, steps) -> "Project":
        """Run `steps(self)` once per test session; later calls copy the result (the
        repository is deterministic, so the copy is the very repository steps would build)."""
        if key in _BUILT:
            folder, state = _BUILT[key]
            shutil.rmtree(self.path)
            shutil.copytree(folder, self.path, symlinks=True)
            os.chdir(self.path)  # the cwd (set by the fixture) was the folder just replaced
            self.__dict__.update(copy.deepcopy(state))
            return self
        steps(self)
        folder = Path(tempfile.mkdtemp(prefix=f"specpilot-built-{key}-"))
        atexit.register(shutil.rmtree, folder, True)
        shutil.rmtree(folder)
        shutil.copytree(self.path, folder, symlinks=True)
        _BUILT[key] = (folder, copy.deepcopy({k: v for k, v in self.__dict__.items()
                                              if k not in ("path", "runner")}))
        return self

    def specpilot(self, *args: str):
        return self.runner.invoke(cli, list(args), catch_exceptions=False)

    def git_specpilot(self, *args: str):
        return self.runner.invoke(git_cli, list(args), catch_exceptions=False)

    def memory(self) -> Memory:
        return Memory(self.path)

    # Entries built from numbered engine lines: each entry changes its own lines, so entries
    # compose; `ancestors` carries the lines their dependencies changed.
    def entry(self, entry_id: str, lines: dict[int, str], deps: list[str] | None = None,
              base: str | None = None, extra: dict[str, str | None] | None = None, **kw):
        deps = deps or []
        self.deps_of[entry_id] = deps
        self.changes[entry_id] = {**{k: v for d in self._closure(deps)
                                     for k, v in self.changes.get(d, {}).items()}, **lines}
        files = {"stock/engine.py": engine_text(self.changes[entry_id]), **(extra or {})}
        self.make_commit(base or self.base, files, f"work on {entry_id}",
                               branch=f"src/{entry_id}")
        return record(self.memory(), f"src/{entry_id}", entry_id, deps, base=base or self.base,
                      **kw)

    def _closure(self, deps: list[str]) -> list[str]:
        out: list[str] = []
        for dep in deps:
            out += self._closure(self.deps_of.get(dep, [])) + [dep]
        return out


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    path = tmp_path / "proj"
    path.mkdir()
    proj = Project(path)
    proj.git("init", "-q", "-b", "main")
    proj.write(".specpilot/config.toml", 'schema_version = 1\nsystem_paths = ["stock", "kernels"]\n')
    proj.write("stock/engine.py", engine_text())
    proj.write("stock/sampler.py", "def greedy(logits):\n    return logits.argmax(-1)\n")
    proj.write("kernels/gemm.py", "def gemm(a, b):\n    return a @ b\n")
    proj.write("README.md", "# demo project\n")
    proj.write("specpilot_notes.txt", "not a system path\n")
    proj.base = proj.commit_all("stock")
    monkeypatch.chdir(path)
    return proj


@pytest.fixture
def chain_ab(project) -> Project:
    """A project with entries a and b, b depending on a."""
    def steps(project):
        project.entry("a", {1: "'a'"})
        project.entry("b", {10: "'b'"}, ["a"])
    return project.build("chain-ab", steps)


def snapshot(root: Path) -> dict[str, str]:
    """Bytes of every file in the working tree and the git index, HEAD and refs: the user's
    state that replay and verify must not touch."""
    state = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(root).parts:
            state[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    git_dir = root / ".git"
    state["<index>"] = hashlib.sha256((git_dir / "index").read_bytes()).hexdigest()
    state["<HEAD>"] = (git_dir / "HEAD").read_text()
    # --no-optional-locks: status must not refresh (rewrite) the index it is checking.
    state["<status>"] = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain"],
                                       cwd=root, capture_output=True, text=True).stdout
    # Every ref (branches, tags, refs/specpilot/*, refs/notes/*) with its object, and every
    # file git keeps outside its object store (a stray *.lock, config, hooks, worktrees).
    state["<refs>"] = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)"],
                                     cwd=root, capture_output=True, text=True).stdout
    for path in sorted(git_dir.rglob("*")):
        rel = path.relative_to(git_dir)
        if path.is_file() and rel.parts[0] not in ("objects", "logs") and rel.name != "index":
            state[f"<git>/{rel}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state
